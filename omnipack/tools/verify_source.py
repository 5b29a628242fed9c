"""``omnipack verify --source``: re-derive packed samples from the run's own inputs and compare bit for bit.

A dataset that agrees with itself can still be wrong in the same way everywhere (a bug, a changed default
of a dependency). This check reads the inputs and settings ``omnipack.json`` records (``source``: the run's
settings, a digest per input file; ``tokenizer`` and ``profile``: the fingerprint and processor settings),
refuses to go on when an input or the tokenizer / processor differs from the recorded one (unless told to
compare anyway), then measures each chosen sample with prepare's own code (``stages.measure.Measurer``,
labels from the template's generation markers), materialises its media as the writer does
(``stages.write.sample_media``) and lays it out as the writer would in the slot the accounting ledger
names (``stages.write.assemble_row``). Each difference names shard, row, sample, source record and the first
differing field. Units are input parts, run on the executors prepare uses (``omnipack.executors``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..alignment import pad_to_multiple
from ..dataset.accounting import read_ledger
from ..dataset.reader import Dataset, RawRow, open_dataset, read_index, read_row
from ..executors import make_executor
from ..inputs import InputPart, InputSpec, read_part
from ..inputs.base import input_path
from ..loader.media import decode_payload
from ..pipeline import PrepareConfig, check_rank
from ..profiles import get_profile, profile_class
from ..profiles.checkpoint import PROCESSOR_OPTIONS
from ..stages.finalize import input_xxh3
from ..stages.measure import PART_LINES, sample_arrays, split_input, worker_measurer
from ..stages.model_files import MODEL_DIR, OPTIONS_RECORD, ShippedModel, _shipped, local_copy, read_shipped
from ..stages.spec import MeasureConfig, WriteSettings
from ..stages.storage import STAGES_DIR, is_local
from ..stages.tokenizer_facts import offer_tokenizer
from ..stages.worker import WorkerContext
from ..stages.write import SequenceInput, assemble_row, sample_media
from ..text.chat import ChatTokenizer

SOURCE_CHECK = (
    "source",
    "each chosen sample re-derived from the run's inputs and settings (omnipack.json's source): sample id, "
    "boundaries and placement, token ids, labels and loss mask, positions, media plans and timing, every "
    "payload as the loader decodes it",
)
FULL_BELOW = 100_000  # datasets with fewer packed samples are re-derived whole by default
DEFAULT_FRACTION = 0.01  # of larger ones
ARRAY_FIELDS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask", "mrope_position_ids")
MEDIA_FIELDS = ("kind", "num_tokens", "grid_thw")


@dataclass(frozen=True)
class Picked:
    """One input sample to re-derive, and where the dataset says it went."""

    index: int  # global sample index
    sample_id: str
    source: str
    row: int | None  # the row's key as a number; None: rejected
    position: int | None
    stage: str | None  # the reject's stage, or None
    where: tuple[str, int] | None = None  # (shard, global row index) of its row


@dataclass(frozen=True)
class SourceSpec:
    """Plain data for the workers (it crosses process boundaries)."""

    root: str
    measure: MeasureConfig
    write: WriteSettings
    inputs: InputSpec
    parts: tuple[InputPart, ...]
    picked: dict[int, tuple[Picked, ...]]  # part number -> its samples to re-derive
    model: ShippedModel | None = None  # the dataset's copy of the tokenizer files, where it ships one


@dataclass
class PartFindings:
    checked: int = 0
    differences: list[str] = field(default_factory=list)


# ---- the driver: recorded settings, changed inputs refused, a seeded choice of samples


def _settings(ds: Dataset) -> dict[str, Any]:
    source = ds.meta.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("settings"), dict):
        raise LookupError(
            "omnipack.json records no source settings (prepared before verify --source existed): re-prepare "
            "the dataset to verify it against its source"
        )
    return source


def _local_options(options: dict[str, Any], stages: Path) -> dict[str, Any]:
    """Profile options with each preprocessor config read from the run's shipped copy (where shipped)."""
    try:
        recorded = json.loads((stages / MODEL_DIR / OPTIONS_RECORD).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        recorded = {}
    local = dict(options)
    for key in PROCESSOR_OPTIONS:
        rec = recorded.get(key)
        if options.get(key) is not None and rec and rec.get("name") == str(options[key]):
            copy = _shipped(rec, stages)
            folder = Path(local_copy(copy))
            local[key] = str(folder if rec.get("folder") else folder / copy.files[0][0])
    return local


def _tokenizer_folder(ds: Dataset, name: str) -> tuple[str, ShippedModel | None]:
    """The tokenizer folder to read on this machine: the dataset's shipped copy (and its record), else the
    folder the run named."""
    shipped = read_shipped(ds.root / STAGES_DIR)
    if shipped is not None:
        return local_copy(shipped), shipped
    if Path(name).is_dir():
        return name, None
    raise LookupError(
        f"the run's tokenizer {name!r} is not on this machine and the dataset ships no copy of it "
        f"({ds.root / STAGES_DIR / MODEL_DIR})"
    )


def _model_changes(ds: Dataset, chat: ChatTokenizer) -> list[str]:
    """The tokenizer's fingerprint and the processor settings against those recorded."""
    changes = []
    recorded = (ds.meta.get("tokenizer") or {}).get("fingerprint")
    if chat.fingerprint() != recorded:
        changes.append(f"tokenizer fingerprint {chat.fingerprint()}, recorded {recorded}")
    now = json.loads(json.dumps(chat.profile.settings()))
    was = (ds.meta.get("profile") or {}).get("settings")
    if now != was:
        keys = sorted(k for k in set(now) | set(was or {}) if now.get(k) != (was or {}).get(k))
        changes.append(f"processor settings of profile {chat.profile.name} differ in {keys}")
    return changes


def _input_changes(recorded: list[dict[str, Any]], parts: list[InputPart]) -> tuple[list[str], list[str]]:
    """(changes, notes): each input file's xxh3-128 against the recorded one; files gone or new."""
    now = list(dict.fromkeys(p.path if "://" in p.path else os.path.abspath(p.path) for p in parts))
    changes, notes = [], []
    for f in recorded:
        path = input_path(f["path"])
        if f["path"] not in now:
            changes.append(f"input {f['path']}: not read now (missing, or no longer selected)")
        elif f.get("xxh3") is None:
            notes.append(f"input {f['path']}: no digest recorded (a remote file): its bytes are not compared")
        elif is_local(path) and (digest_now := input_xxh3(path)) != f["xxh3"]:
            changes.append(f"input {f['path']}: xxh3-128 {digest_now}, recorded {f['xxh3']}")
    changes += [f"input {path}: not an input of the recorded run" for path in now if path not in
                {f["path"] for f in recorded}]  # fmt: skip
    return changes, notes


def _row_locations(ds: Dataset) -> dict[int, tuple[str, int]]:
    """Row key (as a number) -> (shard, global row index), from each row's first tar header name."""
    out, first = {}, 0
    counts = ds.shard_counts
    for shard in ds.shards:
        path = ds.root / shard
        idx = read_index(Path(f"{path}.idx"))
        with open(path, "rb") as f:
            for local, offset in enumerate(idx[:-1].tolist()):
                f.seek(offset)
                name = f.read(100).split(b"\0", 1)[0].decode()
                key = name.partition(".")[0]
                if key.isdigit():
                    out[int(key)] = (shard, first + local)
        first += counts.get(shard, len(idx) - 1)
    return out


def _pick(ledger: Any, rows: dict[int, tuple[str, int]], fraction: float, seed: int) -> list[Picked]:
    """The samples to re-derive: packed ones and those rejected reading or measuring (a re-derivation must
    reject them again); a seeded random ``fraction`` of them, at least one in each shard."""
    d = ledger.to_pydict()
    eligible = [
        k for k, (row, stage) in enumerate(zip(d["row"], d["stage"], strict=True))
        if row is not None or stage in ("read", "measure")
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    chosen = set(eligible)
    if fraction < 1:
        k = max(1, math.ceil(fraction * len(eligible)))
        chosen = set(rng.choice(np.asarray(eligible, dtype=np.int64), size=k, replace=False).tolist())
        by_shard: dict[str, list[int]] = {}
        for i in eligible:
            if d["row"][i] is not None and d["row"][i] in rows:
                by_shard.setdefault(rows[d["row"][i]][0], []).append(i)
        for members in by_shard.values():  # every shard gets looked at, however small the fraction
            if not chosen.intersection(members):
                chosen.add(int(rng.choice(members)))
    return [
        Picked(d["sample_index"][i], d["sample_id"][i], d["source"][i], d["row"][i], d["position"][i],
               d["stage"][i], rows.get(d["row"][i]) if d["row"][i] is not None else None)
        for i in sorted(chosen)
    ]  # fmt: skip


def _spec(ds: Dataset, source: dict[str, Any]) -> tuple[SourceSpec, ChatTokenizer, list[InputPart]]:
    """The run's measure and write settings, with its tokenizer and preprocessor configs read from the
    dataset's shipped copies, and its inputs split as prepare split them."""
    settings = {**source["settings"], "output": str(ds.root), "progress": False}
    cfg = PrepareConfig.from_dict(settings)
    options = _local_options(dict(cfg.profile_options), ds.root / STAGES_DIR)
    tokenizer, shipped = _tokenizer_folder(ds, cfg.tokenizer)
    chat = ChatTokenizer(tokenizer, get_profile(cfg.profile, **options))
    align = cfg.layout.alignment
    measure = MeasureConfig(
        cfg.profile, tokenizer, cfg.media_root, align, options, cfg.mrope, max_tokens=cfg.seq_length,
        media_allow_roots=tuple(cfg.media_allow_roots), remote=cfg.remote,
    )  # fmt: skip
    pad_id = int((ds.meta.get("tokenizer") or {}).get("pad_token_id", 0))
    write = WriteSettings(
        cfg.media_root, cfg.seq_length, align, pad_id, cfg.image_encoding, cfg.compress_video,
        media_allow_roots=tuple(cfg.media_allow_roots), remote=cfg.remote,
    )  # fmt: skip
    parts = split_input(list(cfg.manifest), PART_LINES, cfg.input_spec)
    return SourceSpec(str(ds.root), measure, write, cfg.input_spec, tuple(parts), {}, shipped), chat, parts


def _source_key(source: str) -> tuple[str, str, int] | None:
    """A record's source (``file:line`` for line-based files, ``file#record`` otherwise) as (file label,
    separator, number)."""
    for sep in ("#", ":"):
        label, found, number = source.rpartition(sep)
        if found and number.isdigit():
            return label, sep, int(number)
    return None


def _by_part(picked: list[Picked], parts: list[InputPart]) -> dict[int, tuple[Picked, ...]]:
    """The picked samples grouped by the input part that holds their source record."""
    ranges: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for p in parts:
        if p.format == "jsonl":
            ranges.setdefault((p.file_label, ":"), []).append((p.first_line, p.first_line + p.num_lines, p.number))
        else:
            end = p.first_record + p.num_records
            ranges.setdefault((p.file_label, "#"), []).append((p.first_record, end, p.number))
    out: dict[int, list[Picked]] = {}
    for pick in picked:
        key = _source_key(pick.source)
        spans = ranges.get(key[:2], []) if key else []
        number = next((n for lo, hi, n in spans if lo <= key[2] < hi), -1) if key else -1
        out.setdefault(number, []).append(pick)
    return {k: tuple(v) for k, v in out.items()}


def run_source_check(
    root: str | Path,
    *,
    fraction: float | None = None,
    seed: int = 0,
    workers: int = 1,
    executor: str = "local",
    allow_changed: bool = False,
    ray_address: str | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[list[str], list[str]]:
    """(failures, notes) of re-deriving the dataset's samples from its source (see the module's doc).

    With ``world_size`` > 1 only this ``rank``'s share is re-derived: the picked samples of the input parts
    it owns (part number % world_size == rank, the parts prepare's staged measure gives the rank), so the
    ranks together check exactly what one unranked check does (the same seeded choice)."""
    check_rank(rank, world_size)
    ds = open_dataset(root)
    try:
        source = _settings(ds)
        spec, chat, parts = _spec(ds, source)
    except (LookupError, FileNotFoundError, ValueError) as e:
        return [str(e)], []
    input_changes, notes = _input_changes(source.get("files") or [], parts)
    changes = _model_changes(ds, chat) + input_changes
    if changes and not allow_changed:
        return [f"changed since prepare: {c}" for c in changes] + [
            "not compared: give --allow-changed-source to compare anyway and count the differences"
        ], []
    notes += [f"changed since prepare (compared anyway): {c}" for c in changes]
    try:  # where each sample went: the slot its re-derivation is compared with
        ledger = read_ledger(ds.root / ds.meta.get("accounting_file", ".nv-meta/accounting.parquet"))
    except (FileNotFoundError, ValueError) as e:
        return [f"the accounting ledger, which says where each sample went, is unusable: {e}"], notes
    packed = int((ds.meta.get("counts") or {}).get("packed", ledger.num_rows))
    if fraction is None:
        fraction = 1.0 if packed < FULL_BELOW else DEFAULT_FRACTION
    picked = _pick(ledger, _row_locations(ds), fraction, seed)
    by_part = _by_part(picked, parts)
    orphans = by_part.pop(-1, ())  # samples in no input part: rank 0 reports them
    orphans = orphans if rank == 0 else ()
    spec = replace(spec, picked={n: ps for n, ps in by_part.items() if n % world_size == rank})
    found = PartFindings()
    found.differences += [f"{_where(p)}: its source record is in no input part now" for p in orphans]
    if world_size > 1:
        mine = sum(map(len, spec.picked.values())) + len(orphans)
        notes.append(f"rank {rank} of {world_size}: {mine} of {len(picked)} picked samples (its input parts)")
    with make_executor(executor, workers, ray_address) as ex:
        if spec.model is not None:  # what a Ray actor would otherwise load again (as prepare's measure)
            offer_tokenizer(ex, spec.model, chat.tokenizer)
        for f in ex.map(check_part, spec, sorted(spec.picked)):
            found.checked += f.checked
            found.differences += f.differences
    notes.append(
        f"{found.checked} of {len(ledger)} input samples re-derived (fraction {fraction:g}, seed {seed}); "
        f"{len(found.differences)} differ"
    )
    return found.differences, notes


# ---- the workers: one input part's chosen samples measured, materialised, laid out and compared


def _rows(ds: Dataset, cache: dict[int, tuple[RawRow, Any]], global_row: int) -> tuple[RawRow, Any]:
    if global_row not in cache:
        raw = read_row(ds, global_row)
        cache[global_row] = (raw, raw.decode()[0])
    return cache[global_row]


def check_part(spec: SourceSpec, number: int, context: WorkerContext) -> PartFindings:
    """Part ``number``'s chosen samples re-derived and compared with the dataset (a unit function; the
    dataset and the Measurer opened once per worker)."""
    ds = context.kept("dataset", spec.root, lambda: open_dataset(spec.root))
    picked = {p.source: p for p in spec.picked.get(number, ())}
    raws = [r for r in read_part(spec.parts[number], spec.inputs) if r.source in picked]
    measurer = worker_measurer(context, spec.measure, spec.model)
    own = profile_class(spec.measure.profile).stores_own_media()
    store = measurer.profile.store_sample_media if own else None
    found, rows = PartFindings(), {}
    for raw, (kind, rec) in zip(raws, measurer.measure_many(raws), strict=True):
        p = picked[raw.source]
        found.checked += 1
        where = _where(p)
        if kind != "sample":
            if p.row is not None:
                found.differences.append(f"{where}: re-derives as a reject ({rec.stage}: {rec.reason})")
            continue
        if p.row is None:
            found.differences.append(f"{where}: rejected at {p.stage}, re-derives as a sample")
            continue
        if p.where is None:
            found.differences.append(f"{where}: its row (key {p.row:09d}) is in no shard")
            continue
        raw_row, row = _rows(ds, rows, p.where[1])
        diff = first_difference(p, rec, raw_row, row, spec.write, store)
        if diff is not None:
            found.differences.append(f"{where}: {diff}")
    missing = sorted(set(picked) - {r.source for r in raws})
    found.differences += [f"{_where(picked[k])}: its source record is not in the input now" for k in missing]
    return found


def _where(p: Picked) -> str:
    place = f"{p.where[0]} row {p.where[1]} (key {p.row:09d}) " if p.where and p.row is not None else ""
    return f"{place}sample {p.sample_id} (index {p.index}, source {p.source})"


def first_difference(
    p: Picked, rec: dict[str, Any], raw: RawRow, row: Any, cfg: WriteSettings, store: Any
) -> str | None:
    """The first field where the stored sample differs from the one re-derived from ``rec``; None: none."""
    i = int(p.position or 0)
    if i >= len(row.sample_ids) or row.sample_ids[i] != rec["sample_id"]:
        held = row.sample_ids[i] if i < len(row.sample_ids) else "nothing"
        return f"sample_id differs: the row holds {held!r} at position {i}, the source gives {rec['sample_id']!r}"
    try:
        media, payloads, _ = sample_media(rec, cfg, store)
    except Exception as e:  # a reject now, or a failure: either way not what was written
        return f"media can not be materialised now: {type(e).__name__}: {e}"
    ids, labels, mrope = sample_arrays(rec)
    diff = _placement_difference(row, i, len(ids), cfg)
    if diff is not None:
        return diff
    a, p_len = int(row.cu_seqlens_padded[i]), int(row.cu_seqlens_padded[i + 1] - row.cu_seqlens_padded[i])
    derived = assemble_row([SequenceInput(rec["sample_id"], ids, labels, media, mrope)], p_len, cfg.align,
                           cfg.pad_token_id)  # fmt: skip
    return _array_difference(row, derived, a, p_len) or _media_difference(row, i, a, derived, raw, payloads)


def _placement_difference(row: Any, i: int, n: int, cfg: WriteSettings) -> str | None:
    """The sample's length, start and padded length in the row against the writer's layout rule."""
    cu, cup = row.cu_seqlens.astype(np.int64), row.cu_seqlens_padded.astype(np.int64)
    stored = int(cu[i + 1] - cu[i])
    if stored != n:
        return f"cu_seqlens differs: {stored} tokens stored, the source gives {n}"
    start = sum(pad_to_multiple(int(cu[j + 1] - cu[j]), cfg.align) for j in range(i))
    if int(cup[i]) != start:
        return f"cu_seqlens_padded differs: the sample starts at {int(cup[i])}, the samples before it end at {start}"
    last = i == len(row.sample_ids) - 1
    want = cfg.seq_length - start if last else pad_to_multiple(n, cfg.align)
    got = int(cup[i + 1] - cup[i])
    if got != want:
        return f"cu_seqlens_padded differs: padded length {got} stored, the layout gives {want}"
    return None


def _array_difference(row: Any, derived: Any, a: int, p_len: int) -> str | None:
    for name in ARRAY_FIELDS:
        got, want = getattr(row, name), getattr(derived, name)
        if (got is None) != (want is None):
            return f"{name} differs: {'stored' if got is not None else 'not stored'}, the source gives " + (
                "none" if want is None else "them"
            )
        if got is None:
            continue
        got = np.asarray(got)[..., a : a + p_len]
        want = np.asarray(want)
        if got.shape != want.shape or not np.array_equal(got, want):
            if got.shape != want.shape:
                return f"{name} differs: shape {got.shape} stored, the source gives {want.shape}"
            col = int(np.flatnonzero((got != want).reshape(-1, got.shape[-1]).any(axis=0))[0])
            return (
                f"{name} differs at row position {a + col}: stored {got[..., col].tolist()}, the source "
                f"gives {want[..., col].tolist()}"
            )
    return None


def _media_difference(row: Any, i: int, a: int, derived: Any, raw: RawRow, payloads: dict) -> str | None:
    stored = [m for m in row.media if m.sample_index == i]
    if len(stored) != len(derived.media):
        return f"media differs: {len(stored)} items stored, the source gives {len(derived.media)}"
    for k, (s, d) in enumerate(zip(stored, derived.media, strict=True)):
        what = f"media[{k}] ({s.kind})"
        for name in MEDIA_FIELDS:
            if getattr(s, name) != getattr(d, name):
                return f"{what}.{name} differs: stored {getattr(s, name)}, the source gives {getattr(d, name)}"
        for name in ("token_start", "block_start", "block_end"):
            if getattr(s, name) != getattr(d, name) + a:
                return f"{what}.{name} differs: stored {getattr(s, name)}, the source gives {getattr(d, name) + a}"
        diff = _info_difference(s.info, d.info, f"{what}.info")
        if diff is not None:
            return diff
        diff = _payload_difference(s.part, raw.parts.get(s.part), d.part, payloads[d.part])
        if diff is not None:
            return f"{what}.payload{diff}"
    return None


def _info_difference(stored: Any, derived: Any, path: str) -> str | None:
    """The first differing key of a media item's plan info (timing included), nested keys by dots."""
    if isinstance(stored, dict) and isinstance(derived, dict):
        for key in sorted(set(stored) | set(derived)):
            diff = _info_difference(stored.get(key), derived.get(key), f"{path}.{key}")
            if diff is not None:
                return diff
        return None
    if json.dumps(stored) != json.dumps(derived):
        return f"{path} differs: stored {stored}, the source gives {derived}"
    return None


def _arrays(part: str, data: bytes) -> Iterator[tuple[str, np.ndarray]]:
    decoded = decode_payload(part, data)
    yield from (sorted(decoded.items()) if isinstance(decoded, dict) else [("", decoded)])


def _payload_difference(part: str, data: bytes | None, derived_part: str, derived: bytes) -> str | None:
    """The payload as the loader decodes it against the re-derived one: names, shapes, dtypes, values."""
    if data is None:
        return f" differs: part {part} is not in the row"
    if data == derived and part == derived_part:  # the same bytes decode the same: no need to decode
        return None
    try:
        got = dict(_arrays(part, data))
    except Exception as e:
        return f" differs: stored part {part} does not decode: {type(e).__name__}: {e}"
    want = dict(_arrays(derived_part, derived))
    if sorted(got) != sorted(want):
        return f" differs: arrays {sorted(got)} stored, the source gives {sorted(want)}"
    for name in sorted(want):
        g, w = got[name], want[name]
        label = f"[{name!r}]" if name else ""
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"{label} differs: {g.shape} {g.dtype} stored, the source gives {w.shape} {w.dtype}"
        if not np.array_equal(g, w):
            at = np.unravel_index(int(np.flatnonzero(g != w)[0]), g.shape)
            return f"{label} differs at {tuple(int(x) for x in at)}: stored {g[at]}, the source gives {w[at]}"
    return None
