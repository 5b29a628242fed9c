"""Chats written as plain-text turns with ``<image>``/``<video>``/``<audio>`` markers plus media lists
(LLaVA/ShareGPT, LLaMA-Factory, ms-swift) -> omnipack messages with the media parts in place of the markers."""

from __future__ import annotations

import re
from typing import Any

# Role names of the chat exports people have -> omnipack roles. ``chatgpt``/``bing``/``bard`` are ShareGPT's
# assistants (FastChat reads them so); ``function_call`` (LLaMA-Factory) is an assistant turn whose text is its
# tool call(s) as JSON, ``observation`` a tool's result.
CALL = "function_call"
ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "system": "system",
    CALL: CALL, "observation": "tool", "tool": "tool",
}  # fmt: skip
MARKERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}
MEDIA_KEYS = tuple(k for kind in MARKERS for k in (kind, kind + "s"))
_KIND_OF = {marker: kind for kind, marker in MARKERS.items()}
_MARKER_RE = re.compile("(" + "|".join(map(re.escape, MARKERS.values())) + ")")


class ConvertError(ValueError):
    """A record can not be turned into messages; the message is the reason."""


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    return list(v) if isinstance(v, list | tuple) else [v]


def media_lists(rec: dict[str, Any]) -> dict[str, list[str]]:
    """The media references of a record, by kind, from ``images``/``image`` (and video, audio) fields."""
    media = {kind: _as_list(rec.get(kind) or rec.get(kind + "s")) for kind in MARKERS}
    for kind, refs in media.items():
        if not all(isinstance(r, str) and r for r in refs):
            raise ConvertError(
                f"{kind} must be a path or a list of paths, got {rec.get(kind) or rec.get(kind + 's')!r}"
            )
    return media


def turns_to_messages(
    turns: list[tuple[Any, Any]],
    media: dict[str, list[str]],
    tool_calls: list[Any] | None = None,
) -> list[dict[str, Any]]:
    """``(role, text)`` turns -> messages, each marker replaced by the next media reference of its kind.

    Media given without any marker goes before the first user turn's text (the LLaVA convention); otherwise
    markers and media must match in number. A ``function_call`` turn's text is its tool calls (JSON, no
    markers); ``tool_calls`` gives a turn's calls written beside its text (OpenAI style), parsed later with
    every record's (``omnipack.inputs.tool_use``)."""
    if not turns:
        raise ConvertError("no conversations")
    roles = [ROLES.get(r) if isinstance(r, str) else None for r, _ in turns]
    texts = [
        "" if role == CALL else t if isinstance(t, str) else "" if t is None else str(t)
        for (_, t), role in zip(turns, roles, strict=True)
    ]
    calls = list(tool_calls) if tool_calls is not None else [None] * len(turns)
    for i, ((_, t), role) in enumerate(zip(turns, roles, strict=True)):
        if role == CALL:
            if calls[i] is not None:
                raise ConvertError(f"function_call turn {i} also has tool_calls")
            if t is None or t == "" or t == []:
                raise ConvertError(f"empty function_call turn at conversations/{i}")
            calls[i] = t
    n_markers = {k: sum(t.count(m) for t in texts) for k, m in MARKERS.items()}
    for kind, refs in media.items():
        if n_markers[kind] == 0 and refs:
            first = next((i for i, r in enumerate(roles) if r == "user"), None)
            if first is None:
                raise ConvertError(f"{kind} given but no human turn to attach it to")
            texts[first] = MARKERS[kind] * len(refs) + "\n" + texts[first]
        elif n_markers[kind] != len(refs):
            raise ConvertError(f"{n_markers[kind]} {MARKERS[kind]} markers but {len(refs)} {kind} files")
    cursor = dict.fromkeys(MARKERS, 0)
    messages = []
    for (raw_role, _), role, text, call in zip(turns, roles, texts, calls, strict=True):
        if role is None:
            raise ConvertError(f"unknown role {raw_role!r}")  # README lists the known ones and --input-role
        parts: list[dict[str, Any]] = []
        for piece in _MARKER_RE.split(text):
            kind = _KIND_OF.get(piece)
            if kind is not None:
                parts.append({"type": kind, kind: media[kind][cursor[kind]]})
                cursor[kind] += 1
            elif piece:
                parts.append({"type": "text", "text": piece})
        content: Any = parts
        if all(p["type"] == "text" for p in parts):
            content = "".join(p["text"] for p in parts)
        message = {"role": "assistant" if role == CALL else role, "content": content}
        if call is not None:
            message["tool_calls"] = call
        messages.append(message)
    return messages
