"""ShareGPT / LLaVA records: ``conversations`` of ``{"from": "human"|"gpt"|"system", "value": ...}`` turns
with ``<image>``/``<video>``/``<audio>`` markers, media in ``image(s)``/``video(s)``/``audio(s)``; LLaMA-Factory's
``function_call``/``observation`` turns and ``tools`` column (see ``markers.ROLES`` for every role name)."""

from __future__ import annotations

from typing import Any

from .base import register_layout
from .markers import MEDIA_KEYS, ConvertError, media_lists, turns_to_messages


def is_sharegpt(rec: dict[str, Any]) -> bool:
    return "conversations" in rec


@register_layout("sharegpt", is_sharegpt, "llava")
def sharegpt_record(rec: dict[str, Any]) -> dict[str, Any]:
    convs = rec.get("conversations")
    if not isinstance(convs, list) or not convs:
        raise ConvertError("no conversations")
    if not all(isinstance(c, dict) for c in convs):
        raise ConvertError("conversations must be a list of objects")
    turns = [(c.get("from") or c.get("role"), c.get("value", c.get("content"))) for c in convs]
    out = {k: v for k, v in rec.items() if k != "conversations" and k not in MEDIA_KEYS}
    calls = [c.get("tool_calls") for c in convs]
    out["messages"] = turns_to_messages(turns, media_lists(rec), calls if any(calls) else None)
    return out
