"""omnipack's own records: ``messages`` with string content or typed content parts (the manifest schema)."""

from __future__ import annotations

from typing import Any

from .base import register_layout


def is_omnipack(rec: dict[str, Any]) -> bool:
    return "messages" in rec


@register_layout("omnipack", is_omnipack, "messages")
def omnipack_record(rec: dict[str, Any]) -> dict[str, Any]:
    return rec
