"""Finalize stage: the shard records -> ``rejects.jsonl``, ``.nv-meta/`` (with ``omnipack.json`` and the
accounting ledger, ``omnipack.dataset.accounting``), written last.

Energon and ``omnipack verify`` know a dataset by its ``.nv-meta`` folder; it is built beside the output
and renamed into place as the very last step, so an unfinished or crashed run never looks like a dataset.
Every input sample must come out packed or rejected with its reason (checked here, before anything shows).
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..dataset.accounting import ACCOUNTING_FILE, LedgerWriter
from ..dataset.meta import DATASET_CONFIG, NV_META, write_energon_meta, write_omnipack_meta
from ..dataset.role_spans import ROLE_SPANS_FILE, ROLE_SPANS_SCHEMA
from ..dataset.root import stamp_root
from ..dataset.shards import ShardInfo
from ..errors import Reject
from ..inputs.accounting import per_file_counts
from ..inputs.base import input_path
from .measure import part_offsets, read_measured
from .pack import part_records
from .records import PartRecord, PlanRecord, ShardRecord, crash_point, file_xxh3
from .spec import REJECTS_FILE, RunSpec
from .storage import BackgroundRemoval, is_local, publish, read_parquet, remove_tree, staging_file
from .write import read_shard_record, shard_done


class NothingPacked(RuntimeError):
    """Every input sample was rejected."""


class WriteIncomplete(RuntimeError):
    """The finalize stage found shards not written (yet) for the current plan."""


def shard_records(spec: RunSpec, plan: PlanRecord) -> list[ShardRecord]:
    records, missing = [], []
    for shard in plan.shards:
        rec = read_shard_record(spec, plan, shard.number)
        if rec is None or not shard_done(spec, rec):
            missing.append(shard.number)
        else:
            records.append(rec)
    if missing:
        raise WriteIncomplete(
            f"{len(missing)} of {len(plan.shards)} shards are not written for this plan "
            f"(e.g. {missing[:10]}): run the write stage (every rank) first"
        )
    return records


def iter_rejects(
    spec: RunSpec, plan: PlanRecord, shards: list[ShardRecord], parts: list[PartRecord]
) -> Iterator[Reject]:
    """Rejects of every stage with global sample indices, in input order, streamed: the measure rejects are
    read one part at a time (a corpus may hold millions of them), merged with the pack and write stages'."""
    superseded = set(plan.superseded_rejects)  # replaced by the pack stage's duplicate-id rejects
    offsets = part_offsets(parts)

    def measured() -> Iterator[Reject]:
        for rec, offset in zip(parts, offsets[:-1], strict=True):
            table = read_measured(spec.measure_dir, [rec], REJECT_COLUMNS, rejects=True)
            for batch in table.to_batches(max_chunksize=1024):  # as Python objects a few at a time
                for r in batch.to_pylist():
                    r["sample_index"] += int(offset)
                    if r["sample_index"] not in superseded:
                        yield Reject.from_json(r)

    later = sorted(plan.rejects + [r for rec in shards for r in rec.rejects], key=_index)
    # the order of one stable sort of (measure rejects, pack rejects, write rejects) by sample index
    return heapq.merge(measured(), later, key=_index)


REJECT_COLUMNS = [f.name for f in fields(Reject)]


def _index(r: Reject) -> int:
    return r.sample_index


def write_rejects(
    spec: RunSpec, plan: PlanRecord, shards: list[ShardRecord], parts: list[PartRecord]
) -> tuple[Path, np.ndarray, dict[str, int]]:
    """``rejects.jsonl`` written to a staging file as the rejects stream by (one JSON line each, in input
    order), never all held at once; returns the file (to publish), the rejects' sample indices and the count
    per stage (in order of first appearance)."""
    by_stage: Counter[str] = Counter()
    indices = array("q")
    tmp = staging_file(spec.out / REJECTS_FILE)
    with open(tmp, "w") as f:
        for r in iter_rejects(spec, plan, shards, parts):
            f.write(json.dumps(r.to_json()) + "\n")
            by_stage[r.stage] += 1
            indices.append(r.sample_index)
    return tmp, np.frombuffer(indices, dtype=np.int64) if indices else np.zeros(0, np.int64), dict(by_stage)


def by_input_file(
    spec: RunSpec, parts: list[PartRecord], rejected: np.ndarray, shards: list[ShardRecord]
) -> list[dict[str, Any]]:
    """Input, packed and rejected records per input data file (checked: each record of a file is packed or
    rejected exactly once), from the parts' record ranges and the plan's placed samples."""
    offsets = part_offsets(parts)
    ledger = [
        {"file": rec.part.file_label, "first_index": int(first), "records": rec.records}
        for rec, first in zip(parts, offsets[:-1], strict=True)
    ]
    placed = read_parquet(spec.plan_table, columns=["sample_index"]).column("sample_index").to_numpy()
    write_rejected = _write_rejected(shards)
    packed = placed[~np.isin(placed, write_rejected)]
    return per_file_counts(ledger, rejected, packed)


def _write_rejected(shards: list[ShardRecord]) -> np.ndarray:
    """The sample indices of the write stage's rejects."""
    return np.asarray([r.sample_index for s in shards for r in s.rejects], dtype=np.int64)


def write_ledger(
    spec: RunSpec, plan: PlanRecord, shards: list[ShardRecord], parts: list[PartRecord], written: WrittenSamples
) -> Path:
    """The accounting ledger in a local staging file (to go into ``.nv-meta``): every input sample's row and
    position, or its reject, one part's index range at a time (a corpus's names are never all held).
    ``written``: ``written_samples``."""
    index, row, position = written
    offsets = part_offsets(parts)
    rejects = iter_rejects(spec, plan, shards, parts)
    pending = next(rejects, None)
    tmp = staging_file(spec.stages / ACCOUNTING_FILE)
    ledger = LedgerWriter(tmp)
    try:
        for rec, first, end in zip(parts, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            left_out = []
            while pending is not None and pending.sample_index < end:
                left_out.append(pending.to_json())
                pending = next(rejects, None)
            lo, hi = np.searchsorted(index, [first, end])
            names = read_measured(spec.measure_dir, [rec], ["sample_index", "sample_id", "source"])
            local = names.column("sample_index").to_numpy()
            at = np.minimum(np.searchsorted(local, index[lo:hi] - first), max(len(local) - 1, 0))
            if len(at) and not np.array_equal(local[at], index[lo:hi] - first):
                raise AssertionError(
                    f"accounting: part {rec.number} lacks measured samples the plan placed"
                )
            packed = pa.table(
                {
                    "sample_index": index[lo:hi],
                    "sample_id": names.column("sample_id").take(at),
                    "source": names.column("source").take(at),
                    "row": row[lo:hi],
                    "position": position[lo:hi].astype(np.int32),
                }
            )
            table = pa.concat_tables(
                [packed, pa.Table.from_pylist(left_out, schema=_REJECT_SCHEMA)], promote_options="default"
            ).sort_by("sample_index")
            got = table.column("sample_index").to_numpy()
            if not np.array_equal(got, np.arange(first, end)):
                raise AssertionError(f"accounting: part {rec.number} {_ledger_gap(got, first, end)}")
            ledger.write(table)
    finally:
        ledger.close()
    return tmp


WrittenSamples = tuple[np.ndarray, np.ndarray, np.ndarray]


def written_samples(spec: RunSpec, shards: list[ShardRecord]) -> WrittenSamples:
    """(sample index, row, position in its row) of every written sample, by sample index."""
    placed = read_parquet(spec.plan_table, columns=["row", "sample_index"])
    index, row = placed.column("sample_index").to_numpy(), placed.column("row").to_numpy()
    kept = ~np.isin(index, _write_rejected(shards))
    # position among the written samples of its row: the plan lists each row's samples in row order
    before = np.cumsum(kept) - kept
    position = before - before[np.searchsorted(row, row, side="left")]
    order = np.argsort(index[kept], kind="stable")
    return index[kept][order], row[kept][order], position[kept][order]


def write_role_spans(spec: RunSpec, written: WrittenSamples, parts: list[PartRecord]) -> Path:
    """The role spans (``omnipack.dataset.role_spans``) of every written sample in a local staging file (to
    go into ``.nv-meta``), one part at a time. Every part has them: the spans column came in the release
    before the parts' token files, and the pack stage refuses parts without a token file
    (``pack.check_layout``)."""
    index = written[0]
    offsets = part_offsets(parts)
    tmp = staging_file(spec.stages / ROLE_SPANS_FILE)
    spans = LedgerWriter(tmp, ROLE_SPANS_SCHEMA)
    try:
        for rec, first, end in zip(parts, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            lo, hi = np.searchsorted(index, [first, end])
            if lo == hi:
                continue
            measured = read_measured(spec.measure_dir, [rec], ["sample_index", "assistant_spans"])
            local = measured.column("sample_index").to_numpy()
            turns = measured.column("assistant_spans").take(pa.array(np.searchsorted(local, index[lo:hi] - first)))
            flat = pc.list_flatten(turns).to_numpy().reshape(-1, 2)
            owner = np.repeat(index[lo:hi], pc.list_value_length(turns).to_numpy() // 2)
            spans.write(pa.table({"sample_index": owner, "start": flat[:, 0], "end": flat[:, 1]}))
    finally:
        spans.close()
    return tmp


_REJECT_SCHEMA = pa.schema(
    [(n, pa.int64() if n == "sample_index" else pa.string()) for n in ["sample_index", *REJECT_COLUMNS[1:]]]
)


def _ledger_gap(got: np.ndarray, first: int, end: int) -> str:
    """What is wrong with a part's ledger indices: some input samples neither placed nor rejected, or some
    more than once."""
    counts = np.bincount(got - first, minlength=end - first) if len(got) else np.zeros(end - first, np.int64)
    lost, twice = np.flatnonzero(counts == 0) + first, np.flatnonzero(counts > 1) + first
    return (
        f"samples neither packed nor rejected {lost[:5].tolist()}, "
        f"placed or rejected twice {twice[:5].tolist()}"
    )


def _remove_strays(spec: RunSpec, shards: list[ShardInfo], replaced: BackgroundRemoval | None) -> None:
    """Shard files of an earlier plan (a resumed run whose settings changed) would read as part of the
    dataset: only the recorded shards stay (the others go to ``replaced``, or are deleted here)."""
    keep = {s.path for s in shards}
    for tar in (spec.out / "shards").glob("*.tar"):
        if f"shards/{tar.name}" not in keep:
            for path in (tar, tar.with_name(f"{tar.name}.idx")):
                if replaced is None or not replaced.move(path):
                    path.unlink(missing_ok=True)


def processor_cache_summary(parts: list[PartRecord]) -> dict[str, dict[str, Any]]:
    """Per media kind: the processor calls and cache hits of every measure part, and the hit rate."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for kind, counts in (part.processor_cache or {}).items():
            seen = out.setdefault(kind, {"processor_calls": 0, "cache_hits": 0})
            for k in seen:
                seen[k] += int(counts.get(k, 0))
    for seen in out.values():
        looked_up = seen["processor_calls"] + seen["cache_hits"]
        seen["hit_rate"] = seen["cache_hits"] / looked_up if looked_up else 0.0
    return out


def finalize(
    spec: RunSpec, plan: PlanRecord, *, reuse_measure: bool = False, replaced: BackgroundRemoval | None = None
) -> RunSummary:
    """Write the dataset's metadata from the shard records; returns the run summary (``omnipack.json``).
    ``replaced``: where shard files of an earlier plan go (deleted in the background), in a local output."""
    records = shard_records(spec, plan)
    parts = part_records(spec, check_keys=not reuse_measure)
    rejects_tmp, rejected, rejected_by_stage = write_rejects(spec, plan, records, parts)
    shards = [r.shard for r in records if r.shard is not None]
    shards.sort(key=lambda s: (s.split != "train", s.path))
    summary = run_summary(spec, plan, records, parts, shards, rejected, rejected_by_stage)
    n_input = plan.input
    publish(rejects_tmp, spec.out / REJECTS_FILE)
    if not shards:
        if n_input == 0:
            raise NothingPacked(
                f"nothing to pack: the manifest(s) {', '.join(spec.manifests)} hold no samples"
            )
        raise NothingPacked(
            f"nothing could be packed: all {n_input} samples were rejected (see {spec.out / REJECTS_FILE})"
        )
    _remove_strays(spec, shards, replaced)
    written = written_samples(spec, records)  # the plan read once for both tables
    ledger = write_ledger(spec, plan, records, parts, written)
    role_spans = write_role_spans(spec, written, parts)
    summary.role_spans_file = f"{NV_META}/{ROLE_SPANS_FILE}"
    if is_local(spec.out):
        staging = spec.stages / "finalize"
        shutil.rmtree(staging, ignore_errors=True)
        write_energon_meta(staging, shards)
        write_omnipack_meta(staging, summary.to_json())
        os.replace(ledger, staging / NV_META / ACCOUNTING_FILE)
        os.replace(role_spans, staging / NV_META / ROLE_SPANS_FILE)
        summary.root = stamp_root(staging, spec.out)  # the root digest over every file (dataset.root)
        crash_point("finalize", 0)
        shutil.rmtree(spec.out / NV_META, ignore_errors=True)
        os.replace(staging / NV_META, spec.out / NV_META)  # the dataset appears here, whole
        staging.rmdir()
    else:
        _upload_meta(spec, shards, summary, ledger, role_spans)
    crash_point("finalize", "done")  # whole, but its lock not yet released
    return summary


@dataclass
class SampleCounts:
    """Where the run's input samples went, checked: input = packed + rejected, in total and per data file."""

    input: int
    packed: int
    rejected: int
    rows: int
    rows_by_split: dict[str, int]
    rejected_by_stage: dict[str, int]
    measured: int
    reject_fraction: float
    by_input: list[dict[str, Any]]  # per input data file, checked: input = packed + rejected


@dataclass
class RunSummary:
    """A finished run: what ``omnipack.json`` records (``to_json``, in this order), and the root digest
    stamped into it afterwards."""

    omnipack_version: str
    profile: dict[str, Any]
    tokenizer: dict[str, Any]
    seq_length: int
    align: int
    parallel: dict[str, Any]
    image_encoding: str
    compress_video: bool
    mrope_position_ids: bool
    inputs: list[dict[str, Any]] | None  # per input path: the split read and its data files
    counts: SampleCounts
    packing: dict[str, Any]  # the plan's packing statistics and settings, and the written rows' efficiency
    shards: list[ShardInfo]
    rejects_file: str = REJECTS_FILE
    accounting_file: str = f"{NV_META}/{ACCOUNTING_FILE}"  # where each input sample went (row or reject)
    source: dict[str, Any] | None = None  # the settings and input digests ``verify --source`` starts from
    processor_cache: dict[str, dict[str, Any]] | None = None  # a processor-backed profile: calls, cache hits
    # each packed sample's assistant turns (``dataset.role_spans``); None in a summary written before them
    role_spans_file: str | None = None
    root: dict[str, Any] | None = None  # the root digest over every file (``dataset.root``), once stamped

    # left out of the JSON when None
    _OPTIONAL: ClassVar[tuple[str, ...]] = ("processor_cache", "role_spans_file", "root")

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not (k in self._OPTIONAL and v is None)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSummary:
        return cls(
            **{
                **d,
                "counts": SampleCounts(**d["counts"]),
                "shards": [ShardInfo(**s) for s in d["shards"]],
            }
        )


def run_summary(
    spec: RunSpec,
    plan: PlanRecord,
    records: list[ShardRecord],
    parts: list[PartRecord],
    shards: list[ShardInfo],
    rejected: np.ndarray,
    rejected_by_stage: dict[str, int],
) -> RunSummary:
    """The run summary (``omnipack.json``) from the stage records, checked: every input sample is either
    packed or rejected."""
    n_input, n_rejected = plan.input, len(rejected)
    packed = sum(r.samples_written for r in records)
    rows = sum(r.rows_written for r in records)
    real_tokens = sum(r.real_tokens for r in records)
    if packed + n_rejected != n_input:  # every input sample is either packed or rejected
        raise AssertionError(f"accounting: {n_input} input != {packed} packed + {n_rejected} rejected")
    seq_length = spec.pack.seq_length
    facts = spec.facts
    return RunSummary(
        omnipack_version=facts.omnipack_version,
        profile=facts.profile,
        tokenizer=facts.tokenizer,
        seq_length=seq_length,
        align=spec.pack.align,
        parallel=facts.parallel,
        image_encoding=spec.write.image_encoding,
        compress_video=spec.write.compress_video,
        mrope_position_ids=spec.measure.mrope,
        inputs=facts.inputs,
        counts=SampleCounts(
            input=n_input,
            packed=packed,
            rejected=n_rejected,
            rows=rows,
            rows_by_split={
                part: sum(s.count for s in shards if s.split == part) for part in ("train", "val")
            },
            rejected_by_stage=rejected_by_stage,
            measured=plan.measured,
            reject_fraction=n_rejected / n_input if n_input else 0.0,
            by_input=by_input_file(spec, parts, rejected, records),
        ),
        packing={
            **plan.stats,
            "algorithm": spec.pack.algorithm,
            "seed": spec.pack.seed,
            "shuffle": spec.pack.shuffle,
            "real_tokens": real_tokens,
            "real_efficiency_written": real_tokens / (rows * seq_length) if rows else 0.0,
        },
        shards=list(shards),
        source=source_record(spec, parts),
        # a processor-backed profile: calls, cache hits
        processor_cache=processor_cache_summary(parts) if any(p.processor_cache is not None for p in parts)
        else None,
    )


def input_xxh3(path: Path) -> str:
    """The digest ``omnipack.json`` records of an input file: xxh3-128, read in small chunks (finalize's
    memory stays flat; the hash runs at several GB/s either way)."""
    return file_xxh3(path, chunk_size=1 << 18)


def source_record(spec: RunSpec, parts: list[PartRecord]) -> dict[str, Any]:
    """What ``omnipack verify --source`` needs to re-derive every sample from the run's inputs: the run's
    settings and, per input data file, its records and the xxh3-128 of its bytes (a local file; None for a
    remote one). Neither depends on how the input was split into parts."""
    files: dict[str, dict[str, Any]] = {}
    for rec in sorted(parts, key=lambda r: r.number):
        path = rec.part.path if "://" in rec.part.path else os.path.abspath(rec.part.path)
        entry = files.setdefault(path, {"path": path, "xxh3": None, "records": 0})
        entry["records"] += rec.records
    for entry in files.values():
        path = input_path(entry["path"])
        entry["xxh3"] = input_xxh3(path) if is_local(path) else None
    return {"settings": spec.facts.settings, "files": list(files.values())}


def _upload_meta(
    spec: RunSpec, shards: list[ShardInfo], summary: RunSummary, ledger: Path, role_spans: Path
) -> None:
    """An object store has no folder rename: the metadata files go up one by one, ``dataset.yaml`` (what
    Energon opens a dataset by) last, so the dataset appears only once every other file is in place."""
    staging = staging_file(spec.out / NV_META).with_suffix(".d")
    shutil.rmtree(staging, ignore_errors=True)
    write_energon_meta(staging, shards)
    write_omnipack_meta(staging, summary.to_json())
    shutil.move(ledger, staging / NV_META / ACCOUNTING_FILE)
    shutil.move(role_spans, staging / NV_META / ROLE_SPANS_FILE)
    summary.root = stamp_root(staging, spec.out)
    remove_meta(spec.out)
    files = sorted((staging / NV_META).iterdir(), key=lambda p: (p.name == DATASET_CONFIG, p.name))
    for i, local in enumerate(files):
        if i == len(files) - 1:
            crash_point("finalize", 0)
        publish(local, spec.out / NV_META / local.name)
    shutil.rmtree(staging, ignore_errors=True)


def remove_meta(out: Any) -> None:
    """Take a dataset's metadata away, ``dataset.yaml`` first: what is left never looks like a dataset."""
    (out / NV_META / DATASET_CONFIG).unlink(missing_ok=True)
    remove_tree(out / NV_META)
