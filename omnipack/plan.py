"""Pack stage: reads only the measure table's length columns and decides which samples share a row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import packing
from .alignment import check_seq_length, pad_to_multiple
from .errors import Reject
from .packing.balance import balance_costs
from .packing.cost import CostModel, cost_stats, media_encoder_flops, row_costs
from .packing.plan import build_plan
from .profiles import get_profile

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
    # Cost model (packing.cost): the profile supplies shapes and encoder costs; ``cost`` overrides them.
    # With a profile, ``balance`` evens out modeled row cost (LM attention + encoders), else sum of len².
    profile: str | None = None
    profile_options: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
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


def run_pack(
    samples: Path | pa.Table, cfg: PackConfig, media_json: Callable[[], pa.ChunkedArray] | None = None
) -> PackResult:
    """Plan rows for every measured sample; over-length samples and budget violators become rejects.

    ``samples``: the measure table (a Parquet file) or its ``PACK_COLUMNS``; ``media_json`` gives that
    table's ``media_json`` column when the cost model needs it (read from the file by default)."""
    check_seq_length(cfg.seq_length, cfg.align)
    if isinstance(samples, pa.Table):
        table = samples
    else:
        table = pq.read_table(samples, columns=PACK_COLUMNS)
        path = samples

        def media_json() -> pa.ChunkedArray:
            return pq.read_table(path, columns=["media_json"]).column("media_json")
    n_tokens = table.column("num_tokens").to_numpy().astype(np.int64)
    padded = pad_to_multiple(n_tokens, cfg.align)
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
    keep = np.flatnonzero(~bad)
    sample_index = indices.to_numpy()
    if len(keep) == 0:
        return PackResult(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), rejects, {"rows": 0})
    constraints = _constraints(table, keep, cfg)
    profile, model = _cost_model(cfg)
    sample_cost = None
    if model is not None:  # encoder FLOPs of the kept samples only (rejects are never placed)
        if media_json is None:
            raise ValueError("a cost model needs the samples' media_json column")
        media = media_json().take(keep)
        flops = media_encoder_flops(profile, model, media.to_pylist())
        sample_cost = model.sample_costs(padded[keep], flops)
    if cfg.balance and sample_cost is not None:
        plan = _pack_cost_balanced(padded[keep], sample_cost, constraints, model, cfg)
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
        costs = row_costs(plan.row_of, plan.num_rows, sample_cost, model.row_constant(cfg.seq_length))
        stats["row_cost"] = cost_stats(costs, model, _dp_sizes(cfg.data_parallel))
    return PackResult(plan.row_ptr.astype(np.int64), sample_index[keep][plan.members], rejects, stats)


def _dp_sizes(value: tuple[int, ...] | list[int] | int) -> list[int]:
    sizes = [value] if isinstance(value, int) else list(value)
    if not sizes or any(not isinstance(d, int) or d < 1 for d in sizes):
        raise ValueError(f"data_parallel must be one or more sizes >= 1, got {value!r}")
    return sizes


def _cost_model(cfg: PackConfig) -> tuple[Any, CostModel | None]:
    """The profile and its cost model; (None, None) without a profile, (profile, None) when it has no cost
    model. Asking to balance with a profile that has no cost model, or giving cost overrides without a
    profile, is an error."""
    if cfg.profile is None:
        if cfg.cost:
            raise ValueError("cost settings need a profile (its shapes are the defaults they override)")
        return None, None
    profile = get_profile(cfg.profile, **cfg.profile_options)
    try:
        return profile, profile.cost_model(cfg.cost)
    except ValueError:
        if cfg.balance or cfg.cost:
            raise
        return profile, None


def _pack_cost_balanced(
    lengths: np.ndarray,
    sample_cost: np.ndarray,
    constraints: Any,
    model: CostModel,
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
            row_constant=model.row_constant(cfg.seq_length),
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
