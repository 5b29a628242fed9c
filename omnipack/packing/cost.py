"""Row costs from the per-sample costs the measure stage recorded: sums, spread and straggler overhead.

A row's modeled training cost is a per-row constant (the LM's dense layers over its W tokens) plus the
sum of its samples' costs (LM attention, media encoders); the model behind those numbers lives with the
profiles (``omnipack.profiles.cost``). Here there are only the numbers: nothing builds a profile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def row_constant(model: dict[str, Any], width: int) -> float:
    """The cost every row of width ``width`` pays whatever it holds, from a recorded ``CostModel.describe()``
    (the LM's dense layers over W tokens when padding goes through the LM)."""
    return model["lm_flops_per_token"] * width if model["row_padding_computed"] else 0.0


def row_costs(
    row_of: np.ndarray, num_rows: int, sample_cost: np.ndarray, constant: float = 0.0
) -> np.ndarray:
    """Per-row cost: the row constant plus the costs of its samples."""
    return constant + np.bincount(row_of, weights=sample_cost, minlength=num_rows)


def straggler_overhead(costs_in_order: np.ndarray, dp: int) -> float | None:
    """Mean over steps of (max rank cost / mean rank cost) - 1, one row per rank per step, rows taken in
    order (a shuffled plan's order is a random assignment); a last incomplete step is left out. None when
    there are fewer rows than ranks (not one full step)."""
    costs = np.asarray(costs_in_order, dtype=np.float64)
    if dp < 1:
        raise ValueError(f"data-parallel size must be >= 1, got {dp}")
    steps = len(costs) // dp
    if steps == 0:
        return None
    per_step = costs[: steps * dp].reshape(steps, dp)
    mean = per_step.mean(axis=1)
    ok = mean > 0
    return float(np.mean(per_step.max(axis=1)[ok] / mean[ok]) - 1) if ok.any() else 0.0


def cost_stats(costs_in_order: np.ndarray, model: dict[str, Any], dp_sizes: Sequence[int]) -> dict[str, Any]:
    """``row_cost`` stats for omnipack.json: every row's cost (plan order), spread and straggler overhead."""
    costs = np.asarray(costs_in_order, dtype=np.float64)
    mean = float(costs.mean()) if len(costs) else 0.0
    return {
        "model": model,  # the recorded CostModel.describe()
        "mean": mean,
        "min": float(costs.min()) if len(costs) else 0.0,
        "max": float(costs.max()) if len(costs) else 0.0,
        "cv": float(costs.std() / mean) if mean > 0 else 0.0,
        "max_over_mean": float(costs.max() / mean) if mean > 0 else 0.0,
        "straggler_overhead": {str(dp): straggler_overhead(costs, dp) for dp in dp_sizes},
        # 6 significant digits keep the file small and are far finer than the model's accuracy.
        "per_row": [float(f"{c:.6g}") for c in costs.tolist()],
    }


def describe_row_cost(row_cost: dict[str, Any]) -> str:
    """One line for terminal summaries from a ``row_cost`` stats entry."""
    overhead = "  ".join(
        f"DP={dp} " + (f"{v:.2%}" if v is not None else "n/a (fewer rows than ranks)")
        for dp, v in row_cost.get("straggler_overhead", {}).items()
    )
    return (
        f"mean {row_cost['mean']:.3g} FLOPs  CV {row_cost['cv']:.2%}  max/mean {row_cost['max_over_mean']:.3f}"
        f"  straggler overhead {overhead}"
    )
