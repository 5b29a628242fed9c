"""A JSON file holding one array of records (LLaVA, LLaMA-Factory and ShareGPT exports), parsed element by
element from a sliding buffer: the file is never held in memory as a whole.

Bytes that are not UTF-8 reject the element holding them. A file that can not be read to its end (cut short
by a half-finished download, a syntax error, an element over the byte cap) is an input error naming the file
and the byte offset, whichever part of the file meets it: the elements after that point can not be told
apart, and a run that packed only the ones before it would lose the rest without a word."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .base import (
    InputError,
    InputPart,
    Reader,
    SourceRecord,
    cut_short,
    file_identity,
    file_stamp,
    input_path,
    open_input,
    register_reader,
)
from .jsonl import DEFAULT_MAX_RECORD_BYTES, first_byte

_CHUNK = 1 << 20
_WS = " \t\r\n"


class _Buffer:
    def __init__(self, f) -> None:
        self.f = f
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.text = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front (for offsets in reasons)
        self.consumed_bytes = 0  # the bytes those characters were decoded from

    def more(self) -> bool:
        if self.eof:
            return False
        chunk = self.f.read(max(_CHUNK, len(self.text) - self.pos))
        self.eof = not chunk
        self.consumed += self.pos
        self.consumed_bytes += _nbytes(self.text[: self.pos])
        self.text = self.text[self.pos :] + self.dec.decode(chunk, final=self.eof)
        self.pos = 0
        return True

    def skip_ws(self) -> str:
        """The next non-whitespace character ("" at the end of the file)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return ""

    def offset(self) -> int:
        """Bytes of the file before the current position (from where the buffer started reading)."""
        return self.consumed_bytes + _nbytes(self.text[: self.pos])


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def _elements(
    path: Path,
    label: str,
    max_record_bytes: int,
    start_byte: int = 0,
    first_index: int = 0,
    offsets: list[int] | None = None,
    every: int = 1,
    stop: int | None = None,
) -> Iterator[SourceRecord]:
    """The array's elements; from ``start_byte`` (an element's first byte, whose index is ``first_index``)
    when given, up to element ``stop``. ``offsets`` receives the byte offset of every ``every``-th element (for splitting)."""
    decoder = json.JSONDecoder()
    with open_input(path) as f:
        f.seek(start_byte)
        buf = _Buffer(f)
        buf.more()
        if start_byte == 0:
            _enter_array(buf, path)
        index, noted = first_index, first_index - 1
        while stop is None or index < stop:
            c = buf.skip_ws()
            if c == "]" and index == 0:
                return
            if offsets is not None and index % every == 0 and noted != index:
                # once per element: an element cut at the buffer's end comes round again after more()
                offsets.append(start_byte + buf.offset())
                noted = index
            try:
                obj, end = decoder.raw_decode(buf.text, buf.pos)
                if end == len(buf.text) and not buf.eof:
                    raise ValueError("may continue")  # a number cut at the buffer's end
            except ValueError as e:
                if not buf.eof and len(buf.text) - buf.pos <= max_record_bytes:
                    buf.more()
                    continue
                raise _undecodable_element(e, buf, path, start_byte, index, c, max_record_bytes) from None
            yield _source_record(index, f"{label}#{index}", obj, buf.text[buf.pos : end])
            buf.pos = end
            index += 1
            if _array_ends_after_element(buf, path, start_byte, index, stop):
                return


def _enter_array(buf: _Buffer, path: Path) -> None:
    """Step past a leading byte-order mark and the array's opening '['."""
    if buf.text.startswith("\ufeff"):
        buf.pos = 1
    if buf.skip_ws() != "[":
        raise cut_short(path, buf.offset(), "it is not a JSON array (no '[' at its start)")
    buf.pos += 1


def _undecodable_element(
    e: ValueError, buf: _Buffer, path: Path, start_byte: int, index: int, c: str, max_record_bytes: int
) -> InputError:
    """The error for element ``index`` that does not decode (``c`` its first character): over the record
    limit, cut short by the file's end, or invalid JSON."""
    at = start_byte + buf.offset()
    if not buf.eof:
        return cut_short(
            path, at, f"element #{index} is over the {max_record_bytes}-byte record limit and the "
            "array can not be read past it (raise --max-line-bytes)"
        )
    msg = getattr(e, "msg", str(e))
    # at the end of the text, or inside a string that the text ends in: the file stops mid-element
    if not c or msg.startswith("Unterminated string") or getattr(e, "pos", 0) >= len(buf.text.rstrip()):
        return cut_short(path, at, f"the file ends inside element #{index} (cut short?)")
    return cut_short(path, at, f"element #{index} is not valid JSON: {msg}")


def _source_record(index: int, where: str, obj: Any, text: str) -> SourceRecord:
    """Element ``index`` decoded from ``text``, or its reject when the text is not valid UTF-8."""
    try:
        size = len(text.encode("utf-8"))
        return SourceRecord(index, where, obj, None, size, '"bytes"' in text)
    except UnicodeEncodeError as e:
        return SourceRecord(index, where, None, f"invalid UTF-8 at byte {e.start} of the record", len(text))


def _array_ends_after_element(buf: _Buffer, path: Path, start_byte: int, index: int, stop: int | None) -> bool:
    """Step past the ',' after element ``index - 1``; True where the reader stops there (the array's ']' or
    the part's ``stop``); an error for anything else."""
    c = buf.skip_ws()
    if c == ",":
        buf.pos += 1
        return False
    if c == "]":
        return True
    if stop is not None and index >= stop:
        return True  # the next part's reader (or the split's full parse) sees what follows
    if not c:
        raise cut_short(
            path, start_byte + buf.offset(), f"the file ends after element #{index - 1} without the "
            "array's closing ']' (cut short?)"
        )
    at = start_byte + buf.offset()
    raise cut_short(path, at, f"expected ',' or ']' after element #{index - 1}")


class JsonArrayReader(Reader):
    name = "json"

    def detect(self, path: Path) -> bool:
        return path.is_file() and first_byte(path) == b"["

    def check_end(self, file: Path) -> None:
        size = file_stamp(file)[0]
        with open_input(file) as f:
            f.seek(max(size - 4096, 0))
            tail = f.read().rstrip()
        if not tail.endswith(b"]") and (tail or size <= 4096):  # (a long whitespace tail: the parse looks)
            raise cut_short(file, size, "the file ends without the array's closing ']' (cut short?)")

    def count(self, file: Path, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
        return sum(1 for _ in _elements(file, file.name, max_record_bytes))

    def split(self, file: Path, part_records: int, max_record_bytes: int) -> list[dict[str, Any]]:
        """Record ranges, each starting at its first element's byte offset (found by one parse of the file),
        so reading a part never parses the elements before it."""
        offsets: list[int] = []
        n = sum(1 for _ in _elements(file, file.name, max_record_bytes, offsets=offsets, every=part_records))
        ident = file_identity(file)
        return [
            {"start_byte": offsets[k], "first_line": 0, "num_lines": 0, "xxh3": ident,
             "first_record": a, "num_records": min(part_records, n - a)}
            for k, a in enumerate(range(0, n, part_records))
        ]  # fmt: skip

    def part_records(self, part: InputPart, max_record_bytes: int) -> Iterator[SourceRecord]:
        stop = part.first_record + part.num_records
        return _elements(
            input_path(part.path), part.file_label, max_record_bytes, part.start_byte, part.first_record, stop=stop
        )

    def records(
        self,
        file: Path,
        label: str,
        start: int = 0,
        stop: int | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> Iterator[SourceRecord]:
        for rec in _elements(file, label, max_record_bytes):
            if stop is not None and rec.record_index >= stop:
                return
            if rec.record_index >= start:
                yield rec


register_reader(JsonArrayReader(), "json_array")
