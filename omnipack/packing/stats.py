"""Packing statistics for dataset metadata and run summaries (JSON-able)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .balance import attention_cost, coefficient_of_variation
from .bounds import best_bound, lower_bounds
from .plan import PackPlan


def packing_stats(
    lengths_real: np.ndarray, lengths_padded: np.ndarray, plan: PackPlan, capacity: int
) -> dict[str, Any]:
    """Rows, lower bounds (L1, Martello–Toth L2, Fekete–Schepers DFF), real/padded efficiency, alignment
    overhead, samples-per-row histogram and the coefficient of variation of per-row attention cost (sum
    of squared padded lengths)."""
    real = np.asarray(lengths_real, dtype=np.int64)
    padded = np.asarray(lengths_padded, dtype=np.int64)
    if real.shape != padded.shape or real.shape != plan.row_of.shape:
        raise ValueError("lengths_real, lengths_padded and the plan must cover the same samples")
    if np.any(real > padded):
        raise ValueError("a real length exceeds its padded length")
    rows = plan.num_rows
    slots = rows * capacity
    bounds = lower_bounds(padded, capacity)
    counts, rows_with = np.unique(plan.samples_per_row(), return_counts=True)
    cost = attention_cost(plan.row_of, rows, padded)
    return {
        "algorithm": plan.algorithm,
        "capacity": int(capacity),
        "samples": int(len(real)),
        "rows": int(rows),
        "l1": bounds["l1"],
        "l2": bounds["l2"],
        "dff": bounds["dff"],
        "rows_over_bound": rows / max(best_bound(bounds), 1),
        "real_efficiency": float(real.sum() / slots) if slots else 0.0,
        "padded_efficiency": float(padded.sum() / slots) if slots else 0.0,
        "alignment_overhead": float((padded - real).sum() / slots) if slots else 0.0,
        "samples_per_row_histogram": {int(c): int(r) for c, r in zip(counts, rows_with, strict=True)},
        "attention_cost_cv": coefficient_of_variation(cost),
    }
