"""Dataset tools (inspect, verify, convert) registered as ``omnipack`` subcommands."""

from __future__ import annotations

import argparse


def register_tools(sub: argparse._SubParsersAction) -> None:
    from . import convert, inspect, verify

    convert.register(sub)
    inspect.register(sub)
    verify.register(sub)
