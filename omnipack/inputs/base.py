"""The importer interface: readers turn input files into raw records, layouts turn records into samples.

A *reader* knows a file format (JSONL, a JSON array, Parquet, Arrow / ``datasets.save_to_disk``): it lists the
data files of an input path, counts their records cheaply and yields them in order, streaming, as
:class:`SourceRecord`s. A *layout* knows a record shape (omnipack's own ``messages``, ShareGPT/LLaVA
``conversations``, LLaMA-Factory/ms-swift ``messages`` + media lists, prompt/response columns) and turns a raw
record into an omnipack sample. Both are registered by name and auto-detected; ``--input-format`` and
``--input-layout`` override the detection.

Input paths are local files and folders, or URLs on an object store (``s3://bucket/data/``, any fsspec URL;
the ``remote`` extra) read like remote media: ``input_path`` gives a ``UPath`` with the same pathlib API
(``exists``, ``is_dir``, ``rglob``, ``name``) and ``open_input`` a file that reads in ranges (a Parquet footer
and row groups fetch only their bytes; JSONL and JSON arrays stream).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import xxhash

from ..media.access import CREDENTIALS_HINT, StoreAccessError, access_error
from ..media.sources import is_remote, local_location
from .records import InputError
from .splits import find_splits


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

    path: Any  # Path, or a UPath for a file on an object store (see input_path)
    label: str


@dataclass(frozen=True)
class InputPart:
    """A record range of one input data file: the unit of measure work, plain data.

    JSONL parts are cut at line ends (``start_byte``, ``first_line``, ``num_lines``, blank lines included)
    and carry the checksum of their bytes, so an edited file redoes only the parts it touches. Parts of the
    other formats are record ranges (``first_record``, ``num_records``; a JSON array's also start at
    ``start_byte``, the first element's offset) and carry a digest of the file's identity (path, size,
    modification time): their records can not be hashed without reading the file."""

    number: int
    path: str
    start_byte: int
    first_line: int  # JSONL: 1-based line number of the part's first line; other formats: 0
    num_lines: int  # JSONL: lines in the part; other formats: 0
    xxh3: str  # of the part's bytes (JSONL), or of the file's path, size and modification time
    format: str = "jsonl"  # the reader's name
    label: str = ""  # the data file's name in sources and default ids ("": the file's name)
    first_record: int = 0  # other formats: the part's first record within the file
    num_records: int = 0  # other formats: records in the part

    @property
    def file_label(self) -> str:
        return self.label or Path(self.path).name


# Remote input files read ahead in blocks of this size (a Parquet footer or row group: its own byte ranges).
INPUT_BLOCK_BYTES = 1 << 20


def input_path(location: str | os.PathLike) -> Any:
    """An input file or folder as a path object: a ``Path`` for a local one (``file://`` URLs included), a
    ``UPath`` (universal-pathlib over fsspec) for a URL on a store or server."""
    if isinstance(location, Path):
        return location
    if not is_remote(location):
        return Path(local_location(location))
    try:
        from upath import UPath
    except ImportError as e:  # pragma: no cover - depends on the optional extra
        raise InputError(f"input {location} needs omnipack's remote extra: pip install '.[remote]' in the omnipack repository") from e
    return UPath(str(location))


def cut_short(path: Any, offset: int | None, why: str, from_end: int = 0) -> InputError:
    """The error that stops the run when an input can not be read to its end (its records past the break
    can not be counted, so rejecting them would lose them unseen): names the file and the byte offset, by
    ``from_end`` bytes before its end when ``offset`` is None."""
    size = file_stamp(input_path(path) if isinstance(path, str) else path)[0]
    at = max(size - from_end, 0) if offset is None else offset
    return InputError(f"input {path} can not be read to its end (at byte {at} of {size}: {why}); fix or re-download it")


def raise_store_refusal(e: BaseException, path: Any) -> None:
    """Raise ``e`` as the store's refusal (credentials, permission) when it is one, so that reading a remote
    input is never reported as a cut-short file for it."""
    if not is_remote(str(path)):  # a local file's PermissionError is the file's own
        return
    reason = access_error(e)
    if reason is not None:
        raise StoreAccessError(f"input {path}: {reason}; {CREDENTIALS_HINT}") from None


def is_local_input(path: Any) -> bool:
    return isinstance(path, Path)


def open_input(path: Any) -> IO[bytes]:
    """A binary, seekable file of an input path: local, or read from its store in ``INPUT_BLOCK_BYTES`` ranges."""
    if is_local_input(path):
        return open(path, "rb")
    # fsspec's files lack readline(size); a buffered reader over one without a cache of its own gives the
    # local file API, each refill one ranged read
    raw = path.fs.open(path.path, "rb", block_size=INPUT_BLOCK_BYTES, cache_type="none")
    return io.BufferedReader(raw, buffer_size=INPUT_BLOCK_BYTES)


def input_key(path: Any) -> str:
    """The name that identifies an input file in pointers and records: its resolved local path, or its URL."""
    return str(path.resolve()) if is_local_input(path) else str(path)


def file_stamp(file: Any) -> tuple[int, int | str]:
    """(size, modification stamp) of an input file: its mtime in ns, or a stored object's ETag."""
    if is_local_input(file):
        st = file.stat()
        return st.st_size, st.st_mtime_ns
    info = file.fs.info(file.path)
    return int(info.get("size") or 0), str(info.get("ETag") or info.get("LastModified") or info.get("mtime"))


def file_identity(file: Any) -> str:
    """Digest of a file's resolved path (or URL), size and modification stamp (what says it is still the same
    file without reading it)."""
    size, stamp = file_stamp(file)
    return xxhash.xxh3_128(f"{input_key(file)}\0{size}\0{stamp}".encode()).hexdigest()


class Reader:
    """A file format. Subclasses set ``name`` and implement ``detect``, ``count`` and ``records`` (and may
    override ``data_files``, and ``split``/``part_records`` when they can seek to a part faster)."""

    name = ""
    # binary values of its records are referenced by ``embedded:`` pointers instead of being copied
    binary_columns = False

    def detect(self, path: Path) -> bool:
        """True when ``path`` (a file or folder) is in this format."""
        raise NotImplementedError

    def data_files(self, path: Path) -> list[Path]:
        """The data files of ``path``, in their reading order."""
        return [path]

    def splits(self, path: Path) -> dict[str, list[Path]] | None:
        """The splits of a folder input (``{split: data files}``; ``{}`` when it names none), None for a file."""
        return find_splits(path, self.data_files(path)) if path.is_dir() else None

    def check_end(self, file: Path) -> None:
        """Raise :class:`InputError` when a cheap look at ``file`` (its last bytes, its footer) shows it can
        not be read to its end: a cut-short file fails the run before anything is written. Reading the file
        checks the rest."""

    def count(self, file: Path) -> int:
        """Number of records of ``file`` (cheap: metadata or a byte scan, no parsing)."""
        raise NotImplementedError

    def records(
        self, file: Path, label: str, start: int = 0, stop: int | None = None
    ) -> Iterator[SourceRecord]:
        """Records ``[start, stop)`` of ``file``, in order, streaming."""
        raise NotImplementedError

    def split(self, file: Path, part_records: int, max_record_bytes: int) -> list[dict[str, Any]]:
        """``file`` cut into record ranges of ``part_records``: the ``InputPart`` fields of each part (other
        than number, path, format and label), in order."""
        n = self.count(file, max_record_bytes)
        ident = file_identity(file)
        return [
            {"start_byte": 0, "first_line": 0, "num_lines": 0, "xxh3": ident,
             "first_record": a, "num_records": min(part_records, n - a)}
            for a in range(0, n, part_records)
        ]  # fmt: skip

    def part_records(self, part: InputPart, max_record_bytes: int) -> Iterator[SourceRecord]:
        """The records of one part, in order."""
        stop = part.first_record + part.num_records
        return self.records(input_path(part.path), part.file_label, part.first_record, stop, max_record_bytes)


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
