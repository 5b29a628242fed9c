"""Input paths -> omnipack samples: pick the reader per path, read records in order (or a record range, so a
run can split its input into parts), map fields, turn media bytes into references, apply the layout.

Every record comes back as exactly one :class:`~omnipack.inputs.records.RawSample`, an unusable one with its reason,
so ``input records = packed + rejected`` holds per input file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..media.errors import MediaError
from .base import (
    ALIASES,
    LAYOUTS,
    READERS,
    DataFile,
    InputError,
    InputPart,
    Reader,
    SourceRecord,
    input_key,
    input_path,
)
from .embedded import EMBEDDED_PREFIX, parse_pointer, replace_embedded
from .jsonl import DEFAULT_MAX_RECORD_BYTES
from .markers import ROLES, ConvertError
from .records import ManifestError, RawSample, validate_record
from .splits import SplitChoice, choose_split
from .tool_use import normalize_tool_use

# Keys a field mapping may name: top-level fields of any layout, and the role/content keys of turns.
MAPPABLE_FIELDS = (
    "id", "messages", "conversations", "system", "tools", "meta", "prompt", "query", "response", "history",
    "image", "images", "video", "videos", "audio", "audios", "role", "content",
)


@dataclass(frozen=True)
class InputSpec:
    """How to read the inputs: format and layout (None / "auto": detected), field mapping, record byte cap."""

    format: str | None = None
    layout: str = "auto"
    fields: Mapping[str, str] = field(default_factory=dict)  # omnipack field -> the input's field name
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    split: str | None = None  # the split of folder inputs to read (None: train, or the only one)
    roles: Mapping[str, str] = field(default_factory=dict)  # the input's role value -> a known role name

    def settings(self) -> dict[str, Any]:
        """What the samples read depend on, as plain data (for resume keys)."""
        return {
            "format": self.format,
            "layout": self.layout,
            "fields": dict(sorted(self.fields.items())),
            "max_record_bytes": self.max_record_bytes,
            **({"split": self.split} if self.split is not None else {}),  # (keys of runs before splits)
            **({"roles": dict(sorted(self.roles.items()))} if self.roles else {}),
        }

    def __post_init__(self) -> None:
        if self.format is not None and ALIASES.get(self.format, self.format) not in READERS:
            raise InputError(
                f"unknown input format {self.format!r}; choose from {', '.join(sorted(READERS))}"
            )
        if self.layout != "auto" and ALIASES.get(self.layout, self.layout) not in LAYOUTS:
            raise InputError(f"unknown input layout {self.layout!r}; choose from auto, {', '.join(LAYOUTS)}")
        bad = sorted(set(self.fields) - set(MAPPABLE_FIELDS))
        if bad:
            raise InputError(
                f"unknown input field {', '.join(bad)} in the field mapping; mappable: {', '.join(MAPPABLE_FIELDS)}"
            )
        bad = sorted(f"{k}={v}" for k, v in self.roles.items() if v not in ROLES)
        if bad:
            raise InputError(f"unknown role in the role mapping {', '.join(bad)}; roles: {', '.join(sorted(ROLES))}")


# Layouts tried in this order (the most specific shape first); layouts registered elsewhere come after.
DETECT_ORDER = ("sharegpt", "messages_media", "omnipack", "prompt_response")


def _detect_order() -> list[str]:
    return [n for n in DETECT_ORDER if n in LAYOUTS] + [n for n in LAYOUTS if n not in DETECT_ORDER]


def reader_for(path: Path, spec: InputSpec) -> Reader:
    if spec.format is not None:
        return READERS[ALIASES.get(spec.format, spec.format)]
    for name in ("parquet", "arrow", "json", "jsonl"):  # most specific first
        if READERS[name].detect(path):
            return READERS[name]
    raise InputError(f"input {path}: no reader recognises it (give --input-format)")


def select_inputs(paths: list[str | Path], spec: InputSpec) -> list[tuple[Reader, SplitChoice]]:
    """Each input path with its reader and the data files it reads: a folder's chosen split
    (``spec.split``, else ``train``, else its only split; see ``splits.py``), a file as given."""
    out = []
    for p in map(input_path, paths):  # local, or on an object store (s3://bucket/data/)
        if not p.exists():
            raise FileNotFoundError(f"input {p} not found")
        reader = reader_for(p, spec)
        files = reader.data_files(p)
        if not files:
            raise InputError(f"input {p}: no {reader.name} data files in it")
        choice = choose_split(p, files, reader.splits(p), spec.split)
        if not choice.files:
            raise InputError(f"input {p}: split {choice.split!r} holds no {reader.name} data files")
        out.append((reader, choice))
    return out


def data_files(paths: list[str | Path], spec: InputSpec) -> list[tuple[Reader, DataFile]]:
    """Every data file the input paths read (see :func:`select_inputs`), in reading order, with its reader
    and its label (the name sources and default ids use: the file name, or ``folder/relative/path`` for a
    folder input; the full path when names would collide)."""
    out: list[tuple[Reader, Path, str]] = []
    for reader, choice in select_inputs(paths, spec):
        p = choice.path
        for f in choice.files:
            out.append((reader, f, f"{p.name}/{f.relative_to(p).as_posix()}" if p.is_dir() else f.name))
    clash = {label for label, n in Counter(label for _, _, label in out).items() if n > 1}
    return [(r, DataFile(f, str(f) if label in clash else label)) for r, f, label in out]


def count_records(paths: list[str | Path], spec: InputSpec | None = None) -> int:
    """Number of input records (metadata for columnar files, a byte scan for JSONL, a parse for JSON)."""
    spec = spec or InputSpec()
    return sum(r.count(df.path, spec.max_record_bytes) for r, df in data_files(paths, spec))


def _rename(rec: dict[str, Any], fields: Mapping[str, str], roles: Mapping[str, str]) -> dict[str, Any]:
    out = dict(rec)
    for ours, theirs in fields.items():
        if ours in ("role", "content") or theirs not in out:
            continue
        out[ours] = out.pop(theirs)
    turn_keys = {k: fields[k] for k in ("role", "content") if k in fields}
    if turn_keys or roles:
        for key in ("messages", "conversations"):
            turns = out.get(key)
            if isinstance(turns, list):
                out[key] = [_rename_turn(t, turn_keys, roles) if isinstance(t, dict) else t for t in turns]
    return out


def _rename_turn(turn: dict[str, Any], turn_keys: Mapping[str, str], roles: Mapping[str, str]) -> dict[str, Any]:
    out = {k: v for k, v in turn.items() if k not in turn_keys.values()}
    out.update({ours: turn[theirs] for ours, theirs in turn_keys.items() if theirs in turn})
    for key in ("role", "from"):  # the role value, under the key the layouts read it by
        if isinstance(out.get(key), str) and out[key] in roles:
            # as its canonical name (observation -> tool, gpt -> assistant): the omnipack layout reads roles as
            # they are, the others translate canonical names to themselves
            out[key] = ROLES.get(roles[out[key]], roles[out[key]])
    return out


def to_sample_record(rec: Any, spec: InputSpec) -> dict[str, Any]:
    """A raw record (media bytes already replaced by references) as an omnipack record; raises
    ``ManifestError`` with the reason when it has no usable shape."""
    if not isinstance(rec, dict):
        raise ManifestError(f"record is a {type(rec).__name__}, not an object")
    if spec.fields or spec.roles:
        rec = _rename(rec, spec.fields, spec.roles)
    if spec.layout != "auto":
        layout = LAYOUTS[ALIASES.get(spec.layout, spec.layout)][1]
    else:
        layout = next((LAYOUTS[n][1] for n in _detect_order() if LAYOUTS[n][0](rec)), None)
        if layout is None:
            raise ManifestError(
                "no conversation: expected 'messages', 'conversations' or 'prompt'+'response' fields "
                f"(found {', '.join(sorted(map(str, rec))) or 'none'}; map yours with --input-field)"
            )
    try:
        out = layout(rec)
    except ConvertError as e:
        raise ManifestError(str(e)) from None
    system = out.pop("system", None)
    if system is not None:  # a top-level system prompt (LLaMA-Factory, ms-swift) is the first message
        if not isinstance(system, str):
            raise ManifestError(f"system must be a string, got {type(system).__name__}")
        msgs = out.get("messages")
        if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
            raise ManifestError("both a top-level 'system' and a system message")
        if system.strip() and isinstance(msgs, list):
            out["messages"] = [{"role": "system", "content": system}, *msgs]
    try:
        normalize_tool_use(out)
    except ConvertError as e:
        raise ManifestError(str(e)) from None
    return out


def read_samples(
    paths: list[str | Path],
    spec: InputSpec | None = None,
    start: int = 0,
    stop: int | None = None,
    start_index: int = 0,
    ledger: list[dict[str, Any]] | None = None,
) -> Iterator[RawSample]:
    """RawSamples of input records ``[start, stop)`` (positions over all files in order), indexed from
    ``start_index + start``. Invalid records come back with ``error`` set (never dropped). ``ledger``, when
    given, gets ``{"file", "path", "first_index", "records"}`` per data file read, for per-file accounting."""
    spec = spec or InputSpec()
    offset = 0  # position of the current file's first record over all files
    seen: set[str] = set()
    for reader, df in data_files(paths, spec):
        if stop is not None and offset >= stop:
            return
        n = None
        if start > offset:  # skip whole files before the range by their record count
            n = reader.count(df.path, spec.max_record_bytes)
            if offset + n <= start:
                offset += n
                continue
        lo = max(start - offset, 0)
        hi = None if stop is None else stop - offset
        entry = {
            "file": df.label,
            "path": str(df.path),
            "first_index": start_index + offset + lo,
            "records": 0,
        }
        if ledger is not None:
            ledger.append(entry)
        last = lo - 1
        for src in reader.records(df.path, df.label, lo, hi, spec.max_record_bytes):
            last = src.record_index
            entry["records"] += 1
            yield _sample(src, df, reader, spec, start_index + offset + src.record_index, seen)
        offset += n if n is not None else last + 1  # not counted: read from its first record on


def split_parts(paths: list[str | Path], spec: InputSpec, part_records: int) -> list[InputPart]:
    """The inputs' data files cut into parts of about ``part_records`` records each (never across files), in
    reading order: each reader cuts its own files where it can start reading again cheaply."""
    if part_records < 1:
        raise ValueError(f"part_lines must be >= 1, got {part_records}")
    parts: list[InputPart] = []
    for reader, df in data_files(paths, spec):
        for cut in reader.split(df.path, part_records, spec.max_record_bytes):
            parts.append(InputPart(len(parts), str(df.path), format=reader.name, label=df.label, **cut))
    return parts


def read_part(part: InputPart, spec: InputSpec) -> Iterator[RawSample]:
    """RawSamples of one part, indexed from 0 within the part; duplicate ids are found within the part (the
    pack stage finds those across parts)."""
    reader = READERS[part.format]
    df = DataFile(input_path(part.path), part.file_label)
    seen: set[str] = set()
    for k, src in enumerate(reader.part_records(part, spec.max_record_bytes)):
        yield _sample(src, df, reader, spec, k, seen)


def _sample(
    src: SourceRecord, df: DataFile, reader: Reader, spec: InputSpec, index: int, seen: set[str]
) -> RawSample:
    default_id = src.where  # the stable id of a record without one: file:line (JSONL) or file#record
    common = {"record_index": src.record_index, "size": src.size}
    if src.error is not None:
        return RawSample(index, default_id, src.where, None, src.error, **common)
    rec = src.record
    sid = default_id
    try:
        if src.may_embed:
            rec = replace_embedded(rec, df.path, src.record_index, reader.binary_columns)
        rec = to_sample_record(rec, spec)
        if rec.get("id") is None:
            rec["id"] = default_id
        sid = str(rec["id"]) if isinstance(rec["id"], str | int) else default_id
        validate_record(rec)
        sample = RawSample(index, sid, src.where, rec, **common)
        _check_embedded_refs(sample, df.path)
        if sid in seen:
            raise ManifestError(f"duplicate sample id {sid!r}")
        seen.add(sid)
        return sample
    except ManifestError as e:
        return RawSample(index, sid, src.where, None, str(e), **common)


def _check_embedded_refs(sample: RawSample, data_file: Path) -> None:
    """``embedded:`` references are the pointers a Parquet/Arrow reader writes into its own records; one
    that names another file was written in the input, and would read any local table past the media root's
    checks."""
    own = None
    for ref in sample.media_refs():
        if not ref.path.startswith(EMBEDDED_PREFIX):
            continue
        own = own or input_key(data_file)
        try:
            file, _ = parse_pointer(ref.path)
        except MediaError as e:
            raise ManifestError(str(e)) from None
        if file != own:
            raise ManifestError(
                f"media reference {ref.path[:120]!r}: `embedded:` references are omnipack's pointers to bytes "
                "inside the record's own Parquet/Arrow input and may not be written in a record"
            )
