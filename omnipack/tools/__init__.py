"""Dataset tools (inspect, verify, convert) registered as ``omnipack`` subcommands."""

from __future__ import annotations

import argparse

from . import convert, inspect, verify


def register_tools(sub: argparse._SubParsersAction) -> None:
    convert.register(sub)
    inspect.register(sub)
    verify.register(sub)
