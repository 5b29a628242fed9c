"""JSON Lines: one record per line (omnipack's manifest format, and most chat datasets' exports).

A line that is not UTF-8 or not JSON becomes a record with its error (never the end of the run); a line longer
than the byte cap is skipped in fixed-size chunks and never held in memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .base import Reader, SourceRecord, register_reader

_SKIP_CHUNK = 1 << 20
DEFAULT_MAX_RECORD_BYTES = 16 << 20


def lines(f: IO[bytes], max_line_bytes: int) -> Iterator[tuple[bytes | None, int]]:
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


def first_byte(path: Path) -> bytes:
    """The first non-whitespace byte of a file (after a UTF-8 byte-order mark), or b"" when empty."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        while head:
            s = head.removeprefix(b"\xef\xbb\xbf").lstrip()
            if s:
                return s[:1]
            head = f.read(1 << 16)
    return b""


class JsonLinesReader(Reader):
    name = "jsonl"

    def detect(self, path: Path) -> bool:
        if path.is_dir():
            return any(path.rglob("*.jsonl"))
        return path.is_file() and first_byte(path) != b"["

    def data_files(self, path: Path) -> list[Path]:
        return sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]

    def count(self, file: Path, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
        with open(file, "rb") as f:
            return sum(1 for line, _ in lines(f, max_record_bytes) if line is None or line.strip())

    def records(
        self,
        file: Path,
        label: str,
        start: int = 0,
        stop: int | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> Iterator[SourceRecord]:
        index = 0
        with open(file, "rb") as f:
            for line_no, (line, size) in enumerate(lines(f, max_record_bytes), 1):
                if line is not None and not line.strip():
                    continue
                if stop is not None and index >= stop:
                    return
                where = f"{label}:{line_no}"
                if index < start:
                    index += 1
                    continue
                yield _parse_line(index, where, line, size, line_no, max_record_bytes)
                index += 1


def _parse_line(
    index: int, where: str, line: bytes | None, size: int, line_no: int, cap: int
) -> SourceRecord:
    if line is None:
        reason = f"line of {size} bytes is over the {cap}-byte limit (max_line_bytes); not read"
        return SourceRecord(index, where, None, reason, size)
    if line_no == 1 and line.startswith(b"\xef\xbb\xbf"):  # tolerate a byte-order mark
        line = line[3:]
    try:
        return SourceRecord(index, where, json.loads(line.decode("utf-8")), None, size, b'"bytes"' in line)
    except UnicodeDecodeError as e:
        return SourceRecord(index, where, None, f"invalid UTF-8 at byte {e.start}", size)
    except json.JSONDecodeError as e:
        return SourceRecord(index, where, None, f"invalid JSON: {e.msg}", size)


register_reader(JsonLinesReader(), "manifest")
