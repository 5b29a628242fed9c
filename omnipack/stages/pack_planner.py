"""Pack stage: reads only the measure table's length columns and decides which samples share a row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import packing
from ..alignment import check_seq_length, pad_to_multiple
from ..errors import Reject
from ..packing.balance import balance_costs
from ..packing.cost import cost_stats, row_constant, row_costs
from ..packing.plan import build_plan

PLAN_SCHEMA = pa.schema([("row", pa.int32()), ("sample_index", pa.int64())])
PACK_COLUMNS = [
    "sample_index",
    "sample_id",
    "source",
    "num_tokens",
    "num_media",
    "vision_patches",
    "audio_frames",
]
COST_COLUMN = "sample_cost"  # each sample's modeled training cost, written by the measure stage


@dataclass(frozen=True)
class PackConfig:
    seq_length: int
    align: int = 1
    algorithm: str = "bfd"
    seed: int = 0
    shuffle: bool = True
    window: int | None = None
    balance: bool = False
    max_samples_per_row: int | None = None
    max_media_per_row: int | None = None
    max_vision_patches_per_row: int | None = None
    max_audio_frames_per_row: int | None = None
    # The cost model (profiles.cost) the samples' ``sample_cost`` column was computed with, as recorded
    # (``CostModel.describe()``): with it ``balance`` evens out modeled row cost (LM attention + encoders)
    # and the stats give every row's cost; without it ``balance`` evens out the rows' sum of len².
    cost_model: dict[str, Any] | None = None
    data_parallel: tuple[int, ...] | list[int] | int = (8, 64)  # DP sizes of the straggler estimate


@dataclass
class PackResult:
    row_ptr: np.ndarray  # int64 [R+1]
    sample_index: np.ndarray  # int64 [n_packed], samples grouped by row (input indices)
    rejects: list[Reject]  # named (sample_id, source) only when the table has the name columns
    stats: dict[str, Any]

    @property
    def num_rows(self) -> int:
        return len(self.row_ptr) - 1

    def row(self, r: int) -> np.ndarray:
        return self.sample_index[self.row_ptr[r] : self.row_ptr[r + 1]]


def _constraints(table: pa.Table, keep: np.ndarray, cfg: PackConfig) -> Any:
    resources = {}
    for column, budget in (
        ("num_media", cfg.max_media_per_row),
        ("vision_patches", cfg.max_vision_patches_per_row),
        ("audio_frames", cfg.max_audio_frames_per_row),
    ):
        if budget is not None:
            resources[column] = (table.column(column).to_numpy()[keep].astype(np.int64), int(budget))
    if not resources and cfg.max_samples_per_row is None:
        return None
    return packing.PackConstraints(max_samples_per_row=cfg.max_samples_per_row, resources=resources)


def run_pack(samples: Path | pa.Table, cfg: PackConfig) -> PackResult:
    """Plan rows for every measured sample; over-length samples and budget violators become rejects.

    ``samples``: the measure table (a Parquet file) or its ``PACK_COLUMNS``, and ``COST_COLUMN`` when
    ``cfg.cost_model`` is set. Only numbers: the costs were modeled when the samples were measured."""
    check_seq_length(cfg.seq_length, cfg.align)
    if isinstance(samples, pa.Table):
        table = samples
    else:
        table = pq.read_table(samples, columns=PACK_COLUMNS + ([COST_COLUMN] if cfg.cost_model else []))
    n_tokens = table.column("num_tokens").to_numpy().astype(np.int64)
    padded = pad_to_multiple(n_tokens, cfg.align)
    bad, rejects = _pack_rejects(table, n_tokens, padded, cfg)
    keep = np.flatnonzero(~bad)
    sample_index = table.column("sample_index").to_numpy()
    if len(keep) == 0:
        return PackResult(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), rejects, {"rows": 0})
    constraints = _constraints(table, keep, cfg)
    # the kept samples' modeled costs (rejects are never placed)
    sample_cost = None if cfg.cost_model is None else _sample_costs(table)[keep]
    if cfg.balance and sample_cost is not None:
        plan = _pack_cost_balanced(padded[keep], sample_cost, constraints, cfg)
    else:
        plan = packing.pack(
            padded[keep],
            cfg.seq_length,
            algorithm=cfg.algorithm,
            constraints=constraints,
            window=cfg.window,
            balance=cfg.balance,
            shuffle=cfg.shuffle,
            seed=cfg.seed,
        )
    stats = packing.packing_stats(n_tokens[keep], padded[keep], plan, cfg.seq_length)
    if sample_cost is not None:
        constant = row_constant(cfg.cost_model, cfg.seq_length)
        costs = row_costs(plan.row_of, plan.num_rows, sample_cost, constant)
        stats["row_cost"] = cost_stats(costs, cfg.cost_model, _dp_sizes(cfg.data_parallel))
    return PackResult(plan.row_ptr.astype(np.int64), sample_index[keep][plan.members], rejects, stats)


def _pack_rejects(
    table: pa.Table, n_tokens: np.ndarray, padded: np.ndarray, cfg: PackConfig
) -> tuple[np.ndarray, list[Reject]]:
    """The samples no row can take (a bool mask) and their rejects: over-length, or over a per-row budget."""
    too_long = padded > cfg.seq_length
    budget_cols = {
        "num_media": cfg.max_media_per_row,
        "vision_patches": cfg.max_vision_patches_per_row,
        "audio_frames": cfg.max_audio_frames_per_row,
    }
    over_budget = {c: table.column(c).to_numpy() > b for c, b in budget_cols.items() if b is not None}
    rejects = []
    indices = table.column("sample_index")
    # without the name columns (a large plan keeps only numbers in memory) rejects name their sample later
    named = "sample_id" in table.column_names
    ids, sources = (table.column("sample_id"), table.column("source")) if named else (None, None)
    bad = too_long.copy()
    for mask in over_budget.values():
        bad |= mask
    for i in np.flatnonzero(bad):
        if too_long[i]:
            reason = (
                f"over-length: {n_tokens[i]} tokens ({padded[i]} aligned to {cfg.align}) exceed seq_length "
                f"{cfg.seq_length}"
            )
        else:
            c = next(c for c, m in over_budget.items() if m[i])
            reason = f"{c} {table.column(c)[i].as_py()} exceeds the per-row budget {budget_cols[c]}"
        rejects.append(
            Reject(
                indices[i].as_py(),
                ids[i].as_py() if named else None,
                sources[i].as_py() if named else None,
                "pack",
                reason,
            )
        )
    return bad, rejects


def _dp_sizes(value: tuple[int, ...] | list[int] | int) -> list[int]:
    sizes = [value] if isinstance(value, int) else list(value)
    if not sizes or any(not isinstance(d, int) or d < 1 for d in sizes):
        raise ValueError(f"data_parallel must be one or more sizes >= 1, got {value!r}")
    return sizes


def _sample_costs(table: pa.Table) -> np.ndarray:
    """Every sample's modeled cost (float64); the column must be there, with a value for each sample."""
    if COST_COLUMN not in table.column_names:
        raise ValueError(
            f"a cost model needs the samples' {COST_COLUMN} column (written by the measure stage)"
        )
    column = table.column(COST_COLUMN)
    if column.null_count:
        raise ValueError(f"{column.null_count} samples have no {COST_COLUMN}: measured without a cost model")
    return column.to_numpy().astype(np.float64, copy=False)


def _pack_cost_balanced(
    lengths: np.ndarray,
    sample_cost: np.ndarray,
    constraints: Any,
    cfg: PackConfig,
) -> packing.PackPlan:
    """The dense plan, then rows of near-equal modeled cost with at most +0.2% rows (per window when
    packing in windows, so rows still never span windows)."""
    dense = packing.pack(
        lengths,
        cfg.seq_length,
        algorithm=cfg.algorithm,
        constraints=constraints,
        window=cfg.window,
        shuffle=False,
    )
    n = len(lengths)
    window = cfg.window if cfg.window is not None and cfg.window < n else n
    row_of = np.empty(n, dtype=np.int32)
    num_rows = 0
    for start in range(0, n, window):
        stop = min(start + window, n)
        part = dense.row_of[start:stop]
        first = int(part.min())
        part_rows = int(part.max()) - first + 1
        sub = None if constraints is None else _slice_constraints(constraints, start, stop)
        balanced, rows = balance_costs(
            lengths[start:stop],
            sample_cost[start:stop],
            cfg.seq_length,
            part - first,
            part_rows,
            constraints=sub,
            max_rows=part_rows + part_rows // 500,
            row_constant=row_constant(cfg.cost_model, cfg.seq_length),
        )
        row_of[start:stop] = balanced + num_rows
        num_rows += rows
    return build_plan(
        row_of, num_rows, lengths, cfg.seq_length, dense.algorithm + "+balance(cost)", cfg.shuffle, cfg.seed
    )


def _slice_constraints(constraints: Any, start: int, stop: int) -> Any:
    resources = {name: (np.asarray(a)[start:stop], b) for name, (a, b) in constraints.resources.items()}
    return packing.PackConstraints(constraints.max_samples_per_row, resources)


def write_plan(result: PackResult, path: Path) -> None:
    rows = np.repeat(np.arange(result.num_rows, dtype=np.int32), np.diff(result.row_ptr))
    pq.write_table(pa.table({"row": rows, "sample_index": result.sample_index}, schema=PLAN_SCHEMA), path)
