"""Pack stage: the length columns of every measured part -> the plan and the shard layout (once, one node).

Reads only the parts' length columns (a few bytes a sample), makes their record indices global, finds ids
that repeat across parts (within a part the reader finds them), plans rows (``omnipack.stages.pack_planner``), and cuts
the plan's rows into shards by their estimated size, so each shard is a write unit known before writing,
and lists each shard's samples with their byte ranges in the parts' token files (``gather.bin``: a write
unit reads just its own samples). Modeled costs come as numbers too (the measure stage's ``sample_cost`` column): no profile is built here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import Reject
from .measure import part_files, part_offsets, read_measured, read_part_record
from .pack_planner import COST_COLUMN, PACK_COLUMNS, PackResult, run_pack, write_plan
from .records import PartRecord, PlannedShard, PlanRecord, digest, write_json_atomic
from .spec import RunSpec, ShardLayout
from .storage import make_dirs, publish, read_parquet, staging_file
from .token_file import GATHER_DTYPE, LOCATION_COLUMNS, write_gather
from .unit import run_once

NUMERIC_COLUMNS = ["sample_index", "num_tokens", "num_media", "vision_patches", "audio_frames", "media_bytes"]
MEASURE_KEY_FILE = "measure.json"  # the measure stage's settings and input count (for --from-stage pack)
LAYOUT_SCHEMA = pa.schema([("row", pa.int32()), ("shard", pa.int32())])
# Bytes per token position in a row's arrays (tokens, labels, positions, masks, boundaries), plus mRoPE's
# 3 x int32: the part of a row's shard size that does not come from its media.
ROW_TOKEN_BYTES, MROPE_TOKEN_BYTES = 17, 12


class MeasureIncomplete(RuntimeError):
    """The pack stage found parts not measured (yet) with the current settings."""


def part_records(spec: RunSpec, *, check_keys: bool = True) -> list[PartRecord]:
    """Every part's completion record; all parts must be measured (with the current settings)."""
    records, missing = [], []
    for part in spec.parts:
        rec = read_part_record(spec, part.number, check_key=check_keys)
        if rec is None:
            missing.append(part.number)
        else:
            records.append(rec)
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise MeasureIncomplete(
            f"{len(missing)} of {len(spec.parts)} input parts are not measured with these settings "
            f"(parts {shown}): run the measure stage (every rank) first"
        )
    return records


def check_costs(spec: RunSpec, records: list[PartRecord]) -> None:
    """The parts' cost columns were computed with this run's cost model: a run from the pack stage on
    reuses parts measured before, perhaps under other ``cost`` settings (their costs would be stale)."""
    if spec.pack.cost_model is None:
        return
    want = json.loads(json.dumps(spec.pack.cost_model))
    stale = [r.number for r in records if r.cost_model != want]
    if stale:
        shown = ", ".join(map(str, stale[:10])) + (" ..." if len(stale) > 10 else "")
        raise MeasureIncomplete(
            f"the sample costs of {len(stale)} of {len(records)} measured parts (parts {shown}) were "
            "computed with another cost model (profile or cost settings changed since they were measured): "
            "re-measure instead (run without --from-stage pack)"
        )


def check_layout(spec: RunSpec, records: list[PartRecord]) -> None:
    """The parts hold their samples' token records where the write stage reads them (``part-K.tokens``): a
    run from the pack stage on may reuse parts an earlier release measured into another layout."""
    old = [r.number for r in records if part_files(spec.measure_dir, r.number)["tokens"].name not in r.files]
    if old:
        shown = ", ".join(map(str, old[:10])) + (" ..." if len(old) > 10 else "")
        raise MeasureIncomplete(
            f"{len(old)} of {len(records)} measured parts (parts {shown}) were measured into an earlier "
            "layout (no token file): re-measure instead (run without --from-stage pack)"
        )


def _duplicates(
    spec: RunSpec, records: list[PartRecord], measured_index: np.ndarray
) -> tuple[np.ndarray, list[Reject], list[int]]:
    """Ids seen in an earlier part: (mask of measured samples to drop, their rejects, indices of measure
    rejects they replace). An id is claimed by every record that passed the manifest checks: measured
    samples and measure-stage rejects. Every claim after an id's first is a duplicate, as the reader says
    within one part, so the result does not depend on how the input was split."""
    rejected = read_measured(
        spec.measure_dir, records, ["sample_index", "sample_id", "source", "stage"], rejects=True
    )
    claimed = rejected.filter(pc.equal(rejected.column("stage"), "measure"))
    n_measured = len(measured_index)
    index = np.concatenate([measured_index, claimed.column("sample_index").to_numpy()])
    ids = read_measured(spec.measure_dir, records, ["sample_id"]).column("sample_id")
    ids = pa.chunked_array(ids.chunks + claimed.column("sample_id").chunks, pa.string())
    # vectorised: an id's code in input order; every occurrence after its first is a duplicate
    order = np.argsort(index, kind="stable")
    encoded = pc.dictionary_encode(ids)  # chunks share one dictionary: codes are comparable
    del ids
    codes = np.concatenate([c.indices.to_numpy() for c in encoded.chunks] or [np.zeros(0, np.int32)])[order]
    del encoded
    later = np.ones(len(order), dtype=bool)
    later[np.unique(codes, return_index=True)[1]] = False
    drop = np.zeros(n_measured, dtype=bool)
    drop_index = [int(index[k]) for k in order[later] if k < n_measured]
    drop[order[later][order[later] < n_measured]] = True
    names = _names(spec, records, drop_index)
    dup_rejects: list[Reject] = []
    superseded: list[int] = []
    for k in order[later].tolist():
        if k < n_measured:
            sid, source = names[int(index[k])]
        else:
            j = k - n_measured
            sid, source = claimed.column("sample_id")[j].as_py(), claimed.column("source")[j].as_py()
            superseded.append(int(index[k]))
        dup_rejects.append(Reject(int(index[k]), sid, source, "read", f"duplicate sample id {sid!r}"))
    return drop, dup_rejects, superseded


def _names(spec: RunSpec, records: list[PartRecord], indices: list[int]) -> dict[int, tuple[str, str]]:
    """(sample_id, source) of measured samples by global index, read from just the parts that hold them."""
    offsets = part_offsets(records)
    out: dict[int, tuple[str, str]] = {}
    wanted = np.asarray(sorted(indices), dtype=np.int64)
    which = np.searchsorted(offsets, wanted, side="right") - 1
    for p in np.unique(which).tolist():
        local = wanted[which == p] - offsets[p]
        table = read_parquet(
            part_files(spec.measure_dir, records[p].number)["samples"],
            columns=["sample_index", "sample_id", "source"],
        )
        pos = np.searchsorted(table.column("sample_index").to_numpy(), local)
        for i, q in zip(local.tolist(), pos.tolist(), strict=True):
            out[int(i + offsets[p])] = (
                table.column("sample_id")[q].as_py(),
                table.column("source")[q].as_py(),
            )
    return out


def _val_rows(fraction: float, num_rows: int) -> int:
    """Rows held out for validation: at least one when asked for, never all of them."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {fraction}")
    if fraction == 0.0 or num_rows < 2:
        return 0
    return min(num_rows - 1, max(1, round(fraction * num_rows)))


def shard_layout(
    plan: PackResult, row_bytes: np.ndarray, layout: ShardLayout
) -> tuple[np.ndarray, list[PlannedShard]]:
    """Each plan row's shard, and the shards (path, split, rows): train shards, then val shards.

    Val rows are drawn at random (unshuffled plans are ordered by length); each split's rows fill shards in
    plan order, a shard closing once it reaches ``shard_max_bytes`` (estimated) or ``shard_max_rows``."""
    n = plan.num_rows
    picks = np.random.default_rng(layout.val_seed).permutation(n)[: _val_rows(layout.val_fraction, n)]
    is_val = np.zeros(n, dtype=bool)
    is_val[picks] = True
    shard_of = np.empty(n, dtype=np.int32)
    shards: list[PlannedShard] = []
    for split, prefix in (("train", "shards/shard"), ("val", "shards/val")):
        first = len(shards)
        size = 0
        for r in np.flatnonzero(is_val == (split == "val")):
            count = shards[-1].rows if len(shards) > first else 0
            if count and (
                size >= layout.shard_max_bytes or (layout.shard_max_rows and count >= layout.shard_max_rows)
            ):
                size = count = 0
            if count == 0:
                index = len(shards) - first
                shards.append(PlannedShard(len(shards), f"{prefix}-{index:06d}.tar", split, prefix, index))
            shard_of[r] = len(shards) - 1
            size += int(row_bytes[r])
            shards[-1].rows += 1
    return shard_of, shards


def pack_key(spec: RunSpec, records: list[PartRecord]) -> str:
    parts = [[r.key, {n: f.xxh3 for n, f in r.files.items()}] for r in records]
    return digest({"parts": parts, "pack": spec.pack, "layout": spec.layout})


def run_pack_stage(spec: RunSpec, *, reuse_measure: bool = False) -> tuple[PlanRecord, bool]:
    """Plan the measured parts (or reuse the plan when nothing it depends on changed); returns the plan
    record, and whether it was kept from an earlier run. ``reuse_measure``: take the parts as measured
    before even if measure settings changed (the caller checked they still fit, for ``--from-stage pack``)."""
    records = part_records(spec, check_keys=not reuse_measure)
    check_costs(spec, records)
    check_layout(spec, records)
    return run_once(
        "pack",
        0,
        spec.plan_record,
        pack_key(spec, records),
        PlanRecord.from_json,
        lambda _: all(t.is_file() for t in (spec.plan_table, spec.layout_table, spec.gather_table)),
        lambda: _plan(spec, records, reuse_measure),
    )


def _plan(spec: RunSpec, records: list[PartRecord], reuse_measure: bool) -> PlanRecord:
    """The plan and layout tables published, and the plan's record (keyed by ``run_once``)."""
    offsets = part_offsets(records)
    # numbers only: the names (ids, sources) of a large corpus are read when needed, not held
    costs = [COST_COLUMN] if spec.pack.cost_model is not None else []
    table = read_measured(spec.measure_dir, records, NUMERIC_COLUMNS + costs + list(LOCATION_COLUMNS))
    drop, dup_rejects, superseded = _duplicates(spec, records, table.column("sample_index").to_numpy())
    table = table.filter(pa.array(~drop))
    pa.default_memory_pool().release_unused()

    plan = run_pack(table.select([c for c in PACK_COLUMNS if c in NUMERIC_COLUMNS] + costs), spec.pack)
    names = _names(spec, records, [r.sample_index for r in plan.rejects])
    pack_rejects = [replace(r, sample_id=names[r.sample_index][0], source=names[r.sample_index][1])
                    for r in plan.rejects]  # fmt: skip
    shard_of, shards = shard_layout(plan, _row_bytes(spec, plan, table), spec.layout)
    _write_tables(spec, plan, shard_of, table)
    n_input = int(offsets[-1])
    if not reuse_measure:  # a repack keeps the record of what was measured, and with which settings
        write_json_atomic(
            spec.measure_dir / MEASURE_KEY_FILE, {**spec.facts.measure_key, "input": n_input}
        )
    return PlanRecord(
        "",
        n_input,
        table.num_rows,
        sorted({r.sample_index for r in dup_rejects} - set(superseded)),
        [r.number for r in records],
        offsets.tolist(),
        pack_rejects + dup_rejects,
        superseded,
        plan.stats,
        plan.num_rows,
        shards,
    )


def _row_bytes(spec: RunSpec, plan: PackResult, table: pa.Table) -> np.ndarray:
    """Each plan row's estimated shard bytes: its samples' media plus its token arrays."""
    pos = np.searchsorted(table.column("sample_index").to_numpy(), plan.sample_index)
    sample_bytes = table.column("media_bytes").to_numpy()[pos]
    per_token = ROW_TOKEN_BYTES + (MROPE_TOKEN_BYTES if spec.measure.mrope else 0)
    row_media = np.add.reduceat(sample_bytes, plan.row_ptr[:-1]) if plan.num_rows else np.zeros(0, np.int64)
    return row_media + per_token * spec.pack.seq_length


def _write_tables(spec: RunSpec, plan: PackResult, shard_of: np.ndarray, measured: pa.Table) -> None:
    """The plan, the layout and the gather tables, published in place (the old record removed first)."""
    make_dirs(spec.stages)
    spec.plan_record.unlink(missing_ok=True)  # an old record must never vouch for half-replaced files
    tables = (spec.plan_table, spec.layout_table, spec.gather_table)
    tmp_plan, tmp_layout, tmp_gather = (staging_file(p) for p in tables)
    write_plan(plan, tmp_plan)
    pq.write_table(
        pa.table({"row": np.arange(plan.num_rows, dtype=np.int32), "shard": shard_of}, schema=LAYOUT_SCHEMA),
        tmp_layout,
    )
    _write_gather(plan, shard_of, int(shard_of.max(initial=-1)) + 1, measured, tmp_gather)
    for tmp, table in zip((tmp_plan, tmp_layout, tmp_gather), tables, strict=True):
        publish(tmp, table)


def _write_gather(
    plan: PackResult, shard_of: np.ndarray, num_shards: int, measured: pa.Table, path: Path
) -> None:
    """Each shard's samples with their ranges in their parts' token files (``token_file.write_gather``), so
    a write unit reads its own, not the whole plan, whose size grows with the corpus."""
    rows = np.repeat(np.arange(plan.num_rows, dtype=np.int64), np.diff(plan.row_ptr))
    pos = np.searchsorted(measured.column("sample_index").to_numpy(), plan.sample_index)
    entries = np.empty(len(rows), dtype=GATHER_DTYPE)
    entries["row"], entries["sample_index"] = rows, plan.sample_index
    for field, column in zip(("offset", "bytes"), LOCATION_COLUMNS, strict=True):
        entries[field] = measured.column(column).to_numpy()[pos]
    write_gather(path, shard_of[rows], num_shards, entries)
