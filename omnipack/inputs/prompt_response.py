"""Single-turn columns: ``prompt``/``response`` (or Alpaca's ``instruction`` + ``input`` / ``output``; a
``query`` column is joined to the prompt as ``input`` is), media in ``image(s)``/``video(s)``/``audio(s)`` with
optional markers in the prompt, and earlier turns in LLaMA-Factory's ``history`` (``[[prompt, response],
...]``, supervised too). Map other column names to these with ``--input-field prompt=question --input-field
response=answer``."""

from __future__ import annotations

from typing import Any

from .base import register_layout
from .markers import MEDIA_KEYS, ConvertError, media_lists, turns_to_messages

_PROMPT_KEYS = ("prompt", "instruction", "input", "query", "response", "output", "history")


def is_prompt_response(rec: dict[str, Any]) -> bool:
    return ("prompt" in rec or "instruction" in rec) and ("response" in rec or "output" in rec)


@register_layout("prompt_response", is_prompt_response, "alpaca")
def prompt_response_record(rec: dict[str, Any]) -> dict[str, Any]:
    prompt = rec.get("prompt", rec.get("instruction"))
    extra = rec["query"] if "query" in rec else rec.get("input") if "prompt" not in rec else None
    response = rec.get("response", rec.get("output"))
    for name, v in (("prompt", prompt), ("response", response), ("input", extra)):
        if v is not None and not isinstance(v, str):
            raise ConvertError(f"{name} must be a string, got {type(v).__name__}")
    if extra:
        prompt = f"{prompt}\n{extra}"
    out = {k: v for k, v in rec.items() if k not in _PROMPT_KEYS and k not in MEDIA_KEYS}
    turns = []
    for k, pair in enumerate(rec.get("history") or []):
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise ConvertError(f"history/{k} must be a [prompt, response] pair of strings")
        turns += [("user", pair[0]), ("assistant", pair[1])]
    out["messages"] = turns_to_messages([*turns, ("user", prompt), ("assistant", response)], media_lists(rec))
    return out
