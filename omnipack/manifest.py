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
    size: int = 0  # bytes of the manifest line (lets stages bound the work they take on at once)

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


_ROLES = frozenset(("system", "user", "assistant"))
_MEDIA_TYPES = frozenset(("image", "video", "audio"))


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
    messages = record.get("messages")
    if type(messages) is not list or not messages:
        return False
    for m in messages:
        if type(m) is not dict or m.get("role") not in _ROLES:
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
            continue
        has_assistant = True
        c = m["content"]
        text = c if isinstance(c, str) else "".join(p.get("text", "") for p in c if p["type"] == "text")
        if not text.strip():
            raise ManifestError(f"empty assistant turn at messages/{i}")
    if not has_assistant:
        raise ManifestError("no assistant turn")


DEFAULT_MAX_LINE_BYTES = 16 << 20
_SKIP_CHUNK = 1 << 20


def default_max_line_bytes(seq_length: int) -> int:
    """The longest manifest line read for rows of ``seq_length`` tokens: far above what such a row can
    hold (a token is a few characters; JSON escapes take at most 12 bytes a character), so only lines
    that can not be a sample of this length are refused, and a worker's memory has a fixed cap."""
    return max(DEFAULT_MAX_LINE_BYTES, 256 * seq_length)


def _lines(f: Any, max_line_bytes: int) -> Iterator[tuple[bytes | None, int]]:
    """(line, length in bytes) for every line of a binary file; ``None`` for a line over the cap, which is
    skipped in fixed-size chunks and never held in memory."""
    while True:
        line = f.readline(max_line_bytes + 1)
        if not line:
            return
        if len(line) <= max_line_bytes or line.endswith(b"\n"):
            yield line, len(line)
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = f.readline(_SKIP_CHUNK)
            if not line:
                break
            size += len(line)
        yield None, size


def count_lines(paths: list[Path]) -> int:
    """Number of lines in the manifests (a cheap upper bound on their samples, for a progress bar)."""
    n = 0
    for path in paths:
        with open(path, "rb") as f:
            last = b"\n"
            while chunk := f.read(1 << 24):
                n += chunk.count(b"\n")
                last = chunk[-1:]
            n += last != b"\n"
    return n


def read_manifest(
    paths: list[Path], start_index: int = 0, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[RawSample]:
    """Every line of every manifest, in order; invalid lines come back with ``error`` set (never dropped).

    A line longer than ``max_line_bytes`` is rejected unparsed (its bytes are skipped, never held)."""
    index = start_index
    seen: set[str] = set()
    for path in paths:
        for raw in read_manifest_lines(path, start_index=index, max_line_bytes=max_line_bytes, seen=seen):
            index = raw.index + 1
            yield raw


def read_manifest_lines(
    path: Path,
    *,
    start_byte: int = 0,
    first_line: int = 1,
    num_lines: int | None = None,
    start_index: int = 0,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    seen: set[str] | None = None,
) -> Iterator[RawSample]:
    """The samples of ``num_lines`` lines of one manifest (all when None) starting at byte ``start_byte``,
    which is the start of line ``first_line``: a record range of the input, read without the lines before
    it. Duplicate ids are found within what one call reads (and ``seen``, when given)."""
    seen = set() if seen is None else seen
    index = start_index
    with open(path, "rb") as f:
        f.seek(start_byte)
        for line_no, (line, size) in enumerate(_lines(f, max_line_bytes), first_line):
            if num_lines is not None and line_no >= first_line + num_lines:
                return
            source = f"{path.name}:{line_no}"
            if line is None:
                reason = (
                    f"line of {size} bytes is over the {max_line_bytes}-byte limit (max_line_bytes); not read"
                )
                yield RawSample(index, source, source, None, reason)
                index += 1
                continue
            if line_no == 1 and line.startswith(b"\xef\xbb\xbf"):  # tolerate a byte-order mark
                line = line[3:]
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield RawSample(index, source, source, None, f"invalid UTF-8 at byte {e.start}")
                index += 1
                continue
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
                yield RawSample(index, sid, source, record, size=size)
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
