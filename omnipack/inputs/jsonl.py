"""JSON Lines: one record per line (omnipack's manifest format, and most chat datasets' exports).

A line that is not UTF-8 or not JSON becomes a record with its error (never the end of the run); a line longer
than the byte cap is skipped in fixed-size chunks and never held in memory. A last line without its newline
that is not whole JSON is a file cut short (a half-finished download or copy): an input error naming the file
and the byte offset, not a reject, since the records after the cut are lost unseen."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import xxhash

from .base import (
    InputPart,
    Reader,
    SourceRecord,
    cut_short,
    file_stamp,
    input_path,
    open_input,
    register_reader,
)

_SKIP_CHUNK = 1 << 20
_CHUNK = 1 << 24  # bytes scanned for line ends at once when splitting a file into parts
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
    with open_input(path) as f:
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

    def check_end(self, file: Path) -> None:
        size = file_stamp(file)[0]
        with open_input(file) as f:
            f.seek(max(size - _SKIP_CHUNK, 0))
            tail = f.read()
        if tail.endswith(b"\n"):
            return
        nl = tail.rfind(b"\n")
        if nl >= 0 or size <= _SKIP_CHUNK:  # else a long last line: the split checks it
            check_not_cut(file, tail[nl + 1 :], None, size - len(tail) + nl + 1)

    def count(self, file: Path, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
        with open_input(file) as f:
            return sum(1 for line, _ in lines(f, max_record_bytes) if line is None or line.strip())

    def records(
        self,
        file: Path,
        label: str,
        start: int = 0,
        stop: int | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> Iterator[SourceRecord]:
        index, offset = 0, 0
        with open_input(file) as f:
            for line_no, (line, size) in enumerate(lines(f, max_record_bytes), 1):
                offset += size
                if line is not None and not line.strip():
                    continue
                if stop is not None and index >= stop:
                    return
                check_not_cut(file, line, line_no, offset - size)
                where = f"{label}:{line_no}"
                if index < start:
                    index += 1
                    continue
                yield _parse_line(index, where, line, size, line_no, max_record_bytes)
                index += 1

    def split(self, file: Path, part_records: int, max_record_bytes: int) -> list[dict[str, Any]]:
        """Parts of ``part_records`` lines, cut at line ends, each with the checksum of its bytes (one read of
        the file at memory speed: line ends are found with numpy, nothing is parsed)."""
        parts: list[dict[str, Any]] = []

        def close(start_byte: int, first_line: int, num_lines: int, hasher: Any) -> None:
            parts.append(
                {"start_byte": start_byte, "first_line": first_line, "num_lines": num_lines,
                 "xxh3": hasher.hexdigest()}
            )  # fmt: skip

        start_byte, first_line, lines_in_part, pos, last_line_start = 0, 1, 0, 0, 0
        hasher = xxhash.xxh3_128()
        last = b"\n"
        with open_input(file) as f:
            while chunk := f.read(_CHUNK):
                view = memoryview(chunk)
                newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
                i, cut = 0, 0
                while len(newlines) - i >= part_records - lines_in_part:
                    j = i + part_records - lines_in_part - 1  # the newline that ends this part
                    end = int(newlines[j]) + 1
                    hasher.update(view[cut:end])
                    close(start_byte, first_line, part_records, hasher)
                    start_byte, first_line, lines_in_part = pos + end, first_line + part_records, 0
                    hasher, cut, i = xxhash.xxh3_128(), end, j + 1
                lines_in_part += len(newlines) - i
                hasher.update(view[cut:])
                if len(newlines):
                    last_line_start = pos + int(newlines[-1]) + 1
                pos += len(chunk)
                last = chunk[-1:]
        if pos > start_byte:  # the last lines (the very last may lack its newline)
            close(start_byte, first_line, lines_in_part + (last != b"\n"), hasher)
        if last != b"\n" and pos:  # the last line lacks its newline: whole, or the file is cut short
            with open_input(file) as f:
                f.seek(last_line_start)
                line = f.read(max_record_bytes + 1)
            if len(line) <= max_record_bytes:
                check_not_cut(file, line, first_line + lines_in_part, last_line_start)
        return parts

    def part_records(self, part: InputPart, max_record_bytes: int) -> Iterator[SourceRecord]:
        """The part's lines, read from its first byte (never the lines before it); ``record_index`` is the
        0-based line number in the file."""
        label = part.file_label
        end_line = part.first_line + part.num_lines
        offset = part.start_byte
        with open_input(input_path(part.path)) as f:
            f.seek(part.start_byte)
            for line_no, (line, size) in enumerate(lines(f, max_record_bytes), part.first_line):
                if line_no >= end_line:
                    return
                offset += size
                if line is not None and not line.strip():
                    continue
                check_not_cut(input_path(part.path), line, line_no, offset - size)
                yield _parse_line(line_no - 1, f"{label}:{line_no}", line, size, line_no, max_record_bytes)


def check_not_cut(file: Path, line: bytes | None, line_no: int | None, offset: int) -> None:
    """Raise :class:`InputError` when ``line`` (starting at byte ``offset``) is a last line without its
    newline that is not whole JSON: the file was cut short there. (Bytes that are not UTF-8 in a whole
    line stay that line's reject.)"""
    if line is None or line.endswith(b"\n") or not line.strip():
        return
    try:
        json.loads(line.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as e:
        raise cut_short(
            file,
            offset,
            f"its last line{f', line {line_no},' if line_no else ''} has no newline and is not whole JSON "
            f"({e.msg}): the file is cut short?",
        ) from None


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
