"""Pack stage: reads only the measure table's length columns and decides which samples share a row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import packing
from .alignment import check_seq_length, pad_to_multiple

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


@dataclass
class PackResult:
    row_ptr: np.ndarray  # int64 [R+1]
    sample_index: np.ndarray  # int64 [n_packed], samples grouped by row (input indices)
    rejects: list[dict[str, Any]]
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


def run_pack(samples_path: Path, cfg: PackConfig) -> PackResult:
    """Plan rows for every measured sample; over-length samples and budget violators become rejects."""
    check_seq_length(cfg.seq_length, cfg.align)
    table = pq.read_table(samples_path, columns=PACK_COLUMNS)
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
    ids, sources, indices = table.column("sample_id"), table.column("source"), table.column("sample_index")
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
            {
                "sample_index": indices[i].as_py(),
                "sample_id": ids[i].as_py(),
                "source": sources[i].as_py(),
                "stage": "pack",
                "reason": reason,
            }
        )
    keep = np.flatnonzero(~bad)
    sample_index = indices.to_numpy()
    if len(keep) == 0:
        return PackResult(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), rejects, {"rows": 0})
    plan = packing.pack(
        padded[keep],
        cfg.seq_length,
        algorithm=cfg.algorithm,
        constraints=_constraints(table, keep, cfg),
        window=cfg.window,
        balance=cfg.balance,
        shuffle=cfg.shuffle,
        seed=cfg.seed,
    )
    stats = packing.packing_stats(n_tokens[keep], padded[keep], plan, cfg.seq_length)
    return PackResult(plan.row_ptr.astype(np.int64), sample_index[keep][plan.members], rejects, stats)


def write_plan(result: PackResult, path: Path) -> None:
    rows = np.repeat(np.arange(result.num_rows, dtype=np.int32), np.diff(result.row_ptr))
    pq.write_table(pa.table({"row": rows, "sample_index": result.sample_index}, schema=PLAN_SCHEMA), path)
