"""The importer interface: readers turn input files into raw records, layouts turn records into samples.

A *reader* knows a file format (JSONL, a JSON array, Parquet, Arrow / ``datasets.save_to_disk``): it lists the
data files of an input path, counts their records cheaply and yields them in order, streaming, as
:class:`SourceRecord`s. A *layout* knows a record shape (omnipack's own ``messages``, ShareGPT/LLaVA
``conversations``, LLaMA-Factory/ms-swift ``messages`` + media lists, prompt/response columns) and turns a raw
record into an omnipack sample. Both are registered by name and auto-detected; ``--input-format`` and
``--input-layout`` override the detection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """An input path or setting can not be used at all (not a per-record problem)."""


@dataclass(frozen=True)
class SourceRecord:
    """One record of an input file as read: its position, and the parsed record or why it could not be read.

    ``record_index`` is the 0-based position among the file's records (for JSONL: its non-blank lines);
    ``where`` is how a person finds it (``file:line`` for line-based files, ``file#record`` otherwise)."""

    record_index: int
    where: str
    record: Any = None
    error: str | None = None
    size: int = 0  # bytes the record took in the file (or in memory, for columnar files)
    may_embed: bool = True  # False when the record certainly holds no {"bytes": ...} media value


@dataclass(frozen=True)
class DataFile:
    """One data file of an input path, with the name its records' sources and default ids use."""

    path: Path
    label: str


class Reader:
    """A file format. Subclasses set ``name`` and implement the four methods."""

    name = ""
    # binary values of its records are referenced by ``embedded:`` pointers instead of being copied
    binary_columns = False

    def detect(self, path: Path) -> bool:
        """True when ``path`` (a file or folder) is in this format."""
        raise NotImplementedError

    def data_files(self, path: Path) -> list[Path]:
        """The data files of ``path``, in their reading order."""
        return [path]

    def count(self, file: Path) -> int:
        """Number of records of ``file`` (cheap: metadata or a byte scan, no parsing)."""
        raise NotImplementedError

    def records(
        self, file: Path, label: str, start: int = 0, stop: int | None = None
    ) -> Iterator[SourceRecord]:
        """Records ``[start, stop)`` of ``file``, in order, streaming."""
        raise NotImplementedError


READERS: dict[str, Reader] = {}
# Layout: raw record -> omnipack record (raises ManifestError with the reject reason).
Layout = Callable[[dict[str, Any]], dict[str, Any]]
LAYOUTS: dict[str, tuple[Callable[[dict[str, Any]], bool], Layout]] = {}
ALIASES: dict[str, str] = {}


def register_reader(reader: Reader, *aliases: str) -> Reader:
    READERS[reader.name] = reader
    for a in aliases:
        ALIASES[a] = reader.name
    return reader


def register_layout(
    name: str, detect: Callable[[dict[str, Any]], bool], *aliases: str
) -> Callable[[Layout], Layout]:
    """Register ``fn`` as the layout ``name``; ``detect(record)`` says whether a record has this shape
    (layouts are tried in registration order)."""

    def deco(fn: Layout) -> Layout:
        LAYOUTS[name] = (detect, fn)
        for a in aliases:
            ALIASES[a] = name
        return fn

    return deco
