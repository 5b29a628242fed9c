"""Reading and validating the JSONL manifest (one chat sample per line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any


class ManifestError(ValueError):
    """A manifest line is invalid; the message is the reject reason."""


@dataclass(frozen=True)
class MediaRef:
    kind: str
    path: str  # as written in the manifest, relative to the media root


@dataclass(frozen=True)
class RawSample:
    """A manifest line as read: its index in the input, id, source reference, and the parsed line."""

    index: int
    sample_id: str
    source: str  # "file:line"
    record: dict[str, Any] | None  # None when the line could not be parsed
    error: str | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.record["messages"]

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


def validate_record(record: Any) -> None:
    """Schema check plus the semantic rules a schema cannot say, with a specific reason."""
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
            continue
        has_assistant = True
        c = m["content"]
        text = c if isinstance(c, str) else "".join(p.get("text", "") for p in c if p["type"] == "text")
        if not text.strip():
            raise ManifestError(f"empty assistant turn at messages/{i}")
    if not has_assistant:
        raise ManifestError("no assistant turn")


def read_manifest(paths: list[Path], start_index: int = 0) -> Iterator[RawSample]:
    """Every line of every manifest, in order; invalid lines come back with ``error`` set (never dropped)."""
    index = start_index
    seen: set[str] = set()
    for path in paths:
        with open(path, encoding="utf-8-sig") as f:  # tolerate a byte-order mark
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                source = f"{path.name}:{line_no}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    yield RawSample(index, source, source, None, f"invalid JSON: {e.msg}")
                    index += 1
                    continue
                sid = str(record.get("id", source)) if isinstance(record, dict) else source
                try:
                    validate_record(record)
                    if sid in seen:
                        raise ManifestError(f"duplicate sample id {sid!r}")
                    seen.add(sid)
                    yield RawSample(index, sid, source, record)
                except ManifestError as e:
                    yield RawSample(index, sid, source, None, str(e))
                index += 1


def resolve_media(root: Path, ref: str) -> Path:
    """The media file for ``ref``, refusing paths that escape the media root."""
    root_resolved = root.resolve()
    p = (root / ref).resolve()
    if not p.is_relative_to(root_resolved):
        raise ManifestError(f"media path escapes the media root: {ref!r}")
    return p
