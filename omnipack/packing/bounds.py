"""Lower bounds on the number of rows any packing needs."""

from __future__ import annotations

import numpy as np


def lower_bounds(lengths: np.ndarray, capacity: int) -> dict[str, int]:
    """``l1 = ceil(sum / W)`` and the Martello–Toth bound ``l2`` (always >= l1).

    ``l2 = max over 0 <= k <= W/2`` of ``|J1| + |J2| + max(0, ceil((sum J3 - (|J2| W - sum J2)) / W))`` with
    J1 = items > W - k, J2 = items in (W/2, W - k], J3 = items in [k, W/2]. Items above W/2 cannot share a
    row, and J3 items can only use the space J2 rows leave. Evaluated for every k with prefix sums.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return {"l1": 0, "l2": 0}
    total = int(lengths.sum())
    l1 = -(-total // capacity)
    count_at = np.bincount(lengths, minlength=capacity + 1)
    count_le = np.cumsum(count_at)  # count_le[x] = #items <= x
    sum_le = np.cumsum(count_at * np.arange(capacity + 1, dtype=np.int64))
    half = capacity // 2  # integer items > W/2 are exactly those > floor(W/2)
    k = np.arange(half + 1)
    upper = capacity - k  # W - k >= W/2
    n = count_le[-1]
    j1 = n - count_le[upper]
    j2 = count_le[upper] - count_le[half]
    j2_sum = sum_le[upper] - sum_le[half]
    below_k = np.where(k > 0, sum_le[np.maximum(k - 1, 0)], 0)
    j3_sum = sum_le[half] - below_k
    overflow = j3_sum - (j2 * capacity - j2_sum)
    extra = np.maximum(0, -(-overflow // capacity))
    l2 = int((j1 + j2 + extra).max())
    return {"l1": int(l1), "l2": max(l2, int(l1))}
