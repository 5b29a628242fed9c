"""LLaMA-Factory / ms-swift records: ``messages`` of ``{"role", "content"}`` with string content holding
``<image>``/``<video>``/``<audio>`` markers, media in ``images``/``videos``/``audios`` lists (a top-level
``system`` is kept as the first message, as for every layout)."""

from __future__ import annotations

from typing import Any

from .base import register_layout
from .markers import MEDIA_KEYS, ConvertError, media_lists, turns_to_messages


def is_messages_media(rec: dict[str, Any]) -> bool:
    return "messages" in rec and any(rec.get(k) not in (None, [], "") for k in MEDIA_KEYS)


@register_layout("messages_media", is_messages_media, "llama_factory", "swift")
def messages_media_record(rec: dict[str, Any]) -> dict[str, Any]:
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ConvertError("no messages")
    if not all(isinstance(m, dict) for m in msgs):
        raise ConvertError("messages must be a list of objects")
    for i, m in enumerate(msgs):
        if m.get("tool_calls") and m.get("content") is None:  # an OpenAI-style call has no text
            continue
        if not isinstance(m.get("content"), str):
            raise ConvertError(
                f"messages/{i}/content must be a string with <image>/<video>/<audio> markers when the "
                "record lists its media separately"
            )
    out = {k: v for k, v in rec.items() if k not in MEDIA_KEYS}
    calls = [m.get("tool_calls") for m in msgs]
    turns = [(m.get("role"), m.get("content")) for m in msgs]
    out["messages"] = turns_to_messages(turns, media_lists(rec), calls if any(calls) else None)
    return out
