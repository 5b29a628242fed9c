"""Input records as every stage receives them: ``RawSample`` (one input record, read), its media references,
the record schema check and the errors of the input layer.

``ManifestError`` is a per-record problem (the record is rejected with its message as the reason);
``InputError`` an input path or setting that can not be used at all (the run stops)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ..errors import SampleReject


class InputError(ValueError):
    """An input path or setting can not be used at all (not a per-record problem)."""


class ManifestError(SampleReject):
    """A manifest line is invalid; the message is the reject reason."""


@dataclass(frozen=True)
class MediaRef:
    kind: str
    path: str  # as written in the manifest, relative to the media root


@dataclass(frozen=True)
class RawSample:
    """An input record as read: its index in the input, id, source reference, and the parsed record."""

    index: int
    sample_id: str
    source: str  # where a person finds it: "file:line" (JSONL) or "file#record" (other formats)
    record: dict[str, Any] | None  # the omnipack record; None when the input record could not be used
    error: str | None = None
    size: int = 0  # bytes of the input record (lets stages bound the work they take on at once)
    record_index: int = -1  # 0-based position of the record in that file

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.record["messages"]

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools the conversation offers (the chat template's ``tools=``), or None."""
        return self.record.get("tools")

    def media_refs(self) -> list[MediaRef]:
        refs = []
        for m in self.messages:
            if isinstance(m["content"], list):
                refs += [MediaRef(p["type"], p[p["type"]]) for p in m["content"] if p["type"] != "text"]
        return refs


@cache
def load_schema(name: str) -> dict[str, Any]:
    return json.loads(resources.files("omnipack").joinpath("schemas", name).read_text())


@cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(load_schema("manifest.schema.json"))


_ROLES = frozenset(("system", "user", "assistant", "tool"))
_MEDIA_TYPES = frozenset(("image", "video", "audio"))
_TURN_EXTRAS = frozenset(("tool_calls", "name", "tool_call_id"))  # keys the schema checks beyond role/content


def _plainly_valid(record: Any) -> bool:
    """True when ``record`` certainly passes the manifest schema: the common case, checked in plain Python
    (the full schema check costs as much as tokenizing the sample). Anything unusual returns False and
    goes to the schema validator, which names the error."""
    if type(record) is not dict:
        return False
    sid = record.get("id")
    if type(sid) is not str and type(sid) is not int:
        return False
    if "meta" in record and type(record["meta"]) is not dict:
        return False
    if "tools" in record:  # tool use: the schema checks its shape
        return False
    messages = record.get("messages")
    if type(messages) is not list or not messages:
        return False
    for m in messages:
        if type(m) is not dict or m.get("role") not in _ROLES or len(m) != 2 and _TURN_EXTRAS.intersection(m):
            return False
        content = m.get("content")
        if type(content) is str:
            continue
        if type(content) is not list:
            return False
        for part in content:
            if type(part) is not dict:
                return False
            kind = part.get("type")
            if kind == "text":
                if type(part.get("text")) is not str:
                    return False
            elif kind in _MEDIA_TYPES:
                ref = part.get(kind)
                if type(ref) is not str or not ref:
                    return False
            else:
                return False
    return True


def validate_record(record: Any) -> None:
    """Schema check plus the semantic rules a schema cannot say, with a specific reason."""
    if not _plainly_valid(record):
        import jsonschema

        err = jsonschema.exceptions.best_match(_validator().iter_errors(record))
        if err is not None:
            where = "/".join(str(p) for p in err.absolute_path) or "line"
            if err.validator == "enum" and err.absolute_path and err.absolute_path[-1] == "role":
                raise ManifestError(f"unknown role {err.instance!r} at {where}")
            raise ManifestError(f"schema: {where}: {err.message}")
    has_assistant = False
    for i, m in enumerate(record["messages"]):
        if m["role"] != "assistant":
            if "tool_calls" in m:
                raise ManifestError(f"tool calls in a {m['role']} turn at messages/{i} (only assistant turns call tools)")
            continue
        has_assistant = True
        c = m["content"]
        text = c if isinstance(c, str) else "".join(p.get("text", "") for p in c if p["type"] == "text")
        if not text.strip() and not m.get("tool_calls"):
            raise ManifestError(f"empty assistant turn at messages/{i}")
    if not has_assistant:
        raise ManifestError("no assistant turn")
    if not any(m["role"] == "user" for m in record["messages"]):
        raise ManifestError("assistant-only conversation: no user turn to answer")
