"""Lower bounds on the number of rows any packing needs."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

DFF_MAX_K = 100  # u^(k) for k = 1..DFF_MAX_K: k rounds items near W/(k+1) up, beyond ~100 it adds nothing
DFF_WORK = 2_000_000  # bound on k times distinct lengths in the u^(k) family
MAX_THRESHOLDS = 1024  # eps thresholds tried per DFF family (spread evenly when there are more)
COUPLING_PRECISION = 1024  # the coupled bound's ratio a/b is rounded down to 1 part in this


def lower_bounds(lengths: np.ndarray, capacity: int) -> dict[str, int]:
    """``l1 = ceil(sum / W)``, the Martello–Toth bound ``l2`` (always >= l1) and the Fekete–Schepers
    dual-feasible-function bound ``dff``.

    ``l2 = max over 0 <= k <= W/2`` of ``|J1| + |J2| + max(0, ceil((sum J3 - (|J2| W - sum J2)) / W))`` with
    J1 = items > W - k, J2 = items in (W/2, W - k], J3 = items in [k, W/2]. Items above W/2 cannot share a
    row, and J3 items can only use the space J2 rows leave. Evaluated for every k with prefix sums.
    ``dff`` is described in ``dff_bound``; it can be below l1 (it is a max over different relaxations).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        return {"l1": 0, "l2": 0, "dff": 0}
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
    return {"l1": int(l1), "l2": max(l2, int(l1)), "dff": dff_bound(count_at, capacity)}


def best_bound(bounds: dict[str, int]) -> int:
    return max(bounds.values(), default=0)


def _spread(candidates: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` evenly spaced entries (any subset of thresholds still gives a valid bound)."""
    if len(candidates) <= limit:
        return candidates
    return candidates[np.linspace(0, len(candidates) - 1, limit).round().astype(np.int64)]


def dff_bound(count_at: np.ndarray, capacity: int) -> int:
    """Fekete–Schepers bound from dual-feasible functions (DFFs), given item counts per length.

    A DFF f maps item sizes in [0, 1] to [0, 1] so that items fitting a row still sum to <= 1 after
    mapping; then ``ceil(sum f(x_i))`` bounds the rows. Used here, scaled to integers:

    - ``u^(k) o U^(eps)`` for k = 1..DFF_MAX_K and thresholds e <= W/2: items below e count 0, items
      above W - e count 1 (a whole row), the rest ``u^(k)(x) = x`` if ``(k + 1) x`` is an integer, else
      ``floor((k + 1) x) / k`` (rounds items just above 1/(k+1) up to 1/k).
    - ``phi^(eps)``: items below e count 0, items in [e, W/2] count ``1 / M`` with ``M = floor(W / e)``,
      items above W/2 count ``1 - floor((W - x) / e) / M`` (the small items that could still join them).

    Everything runs over the distinct lengths; the thresholds are those where an item changes side
    (at most MAX_THRESHOLDS of them, evenly spread), so the cost does not grow with W.
    """
    count_at = np.asarray(count_at, dtype=np.int64)
    sizes = np.flatnonzero(count_at)
    if not len(sizes):
        return 0
    w = int(capacity)
    half = w // 2
    counts = count_at[sizes]
    n = int(counts.sum())
    count_before = np.concatenate([[0], np.cumsum(counts)])  # items among the first i sizes
    thresholds = np.unique(np.concatenate([[1], sizes[sizes <= half], w - sizes[sizes > half] + 1]))
    thresholds = _spread(thresholds[(thresholds >= 1) & (thresholds <= max(half, 1))], MAX_THRESHOLDS)
    lo = np.searchsorted(sizes, thresholds, side="left")  # first size >= e
    hi = np.searchsorted(sizes, w - thresholds, side="right")  # first size > W - e
    best = 0
    max_k = min(DFF_MAX_K, max(10, DFF_WORK // len(sizes)))  # many distinct lengths: fewer k
    for k in range(1, max_k + 1):
        scaled = np.where((k + 1) * sizes % w == 0, k * sizes, (k + 1) * sizes // w * w)  # k W u^(k)(s/W)
        cum = np.concatenate([[0], np.cumsum(scaled * counts)])
        totals = k * w * (n - count_before[hi]) + cum[np.maximum(hi, lo)] - cum[lo]
        top = max(int(totals.max()), int(cum[-1]))
        best = max(best, -(-top // (k * w)))
    small = _spread(sizes[sizes <= half], MAX_THRESHOLDS // 4)
    big = sizes[sizes > half]
    big_count = counts[sizes > half]
    count_ge_small = n - count_before[np.searchsorted(sizes, small, side="left")]
    count_big = int(big_count.sum())
    for threshold, at_least in zip(small.tolist(), count_ge_small.tolist(), strict=True):
        m = w // threshold
        total = at_least - count_big + int((big_count * (m - (w - big) // threshold)).sum())
        best = max(best, -(-total // m))
    return best


def constrained_lower_bounds(
    lengths: np.ndarray,
    capacity: int,
    amounts: np.ndarray,
    budgets: np.ndarray,
    max_samples: int | None = None,
) -> dict[str, int]:
    """Lower bounds for packing under several per-row budgets (vector bin packing).

    Every dimension alone (tokens, each resource, the sample cap) is a bin-packing problem, so its
    ``l1``/``l2``/``dff`` bound holds (``tokens``, ``resource<k>``, ``samples``). ``conflict`` couples
    dimensions: the items over half of budget d pairwise conflict, so each needs its own row; an item
    that cannot join any of them (it overflows dimension d or e with every one of them, a 2-D dominance
    test over the large items sorted by d) needs a row without them, so
    ``rows >= |J_d| + max_f ceil(sum_{i in K} a_if / B_f)`` over those items K, maximised over (d, e).
    ``coupled`` (``coupled_bound``) counts the budget an item's other amounts keep a row from using.
    ``amounts`` is int [n, K], ``budgets`` int [K]; returns every bound and their max as ``best``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    amounts = np.asarray(amounts, dtype=np.int64).reshape(n, -1)
    budgets = np.asarray(budgets, dtype=np.int64)
    out = {"tokens": best_bound(lower_bounds(lengths, capacity))}
    dims = [lengths, *amounts.T]
    caps = [int(capacity), *budgets.tolist()]
    if max_samples is not None:
        dims.append(np.ones(n, dtype=np.int64))
        caps.append(int(max_samples))
        out["samples"] = -(-n // int(max_samples))
    for k in range(amounts.shape[1]):
        col = amounts[:, k]
        out[f"resource{k}"] = best_bound(lower_bounds(col[col > 0], int(budgets[k])))
    out["conflict"] = max(
        (_conflict_bound(dims, caps, d, e) for d in range(len(dims)) for e in range(len(dims))), default=0
    )
    out["coupled"] = max(
        (
            coupled_bound(dims[a], caps[a], dims[b], caps[b])
            for a in range(len(dims))
            for b in range(len(dims))
            if a != b
        ),
        default=0,
    )
    out["best"] = max(out.values())
    return out


def _conflict_bound(dims: list[np.ndarray], caps: list[int], d: int, e: int) -> int:
    large = dims[d] * 2 > caps[d]
    num_large = int(large.sum())
    if not num_large:
        return 0
    by_d = np.argsort(dims[d][large], kind="stable")
    large_d = dims[d][large][by_d]
    min_e = np.minimum.accumulate(dims[e][large][by_d])  # least e-amount among the j smallest in d
    rest = ~large
    fit = np.searchsorted(large_d, caps[d] - dims[d][rest], side="right")  # large items that fit in d
    joins = (fit > 0) & (min_e[np.maximum(fit - 1, 0)] <= caps[e] - dims[e][rest])
    alone = np.flatnonzero(rest)[~joins]
    extra = max(-(-int(col[alone].sum()) // cap) for col, cap in zip(dims, caps, strict=True))
    return num_large + extra


def _largest_ratio_below(a: np.ndarray, b: np.ndarray) -> Fraction | None:
    """A ratio p/q with q a_i >= p b_i for every item: the smallest a_i / b_i, rounded down by less than 1 part
    in COUPLING_PRECISION; None where no item has an amount in b, that ratio is 0, or the products would
    leave int64."""
    with_b = b > 0
    if not with_b.any() or max(int(a.max()), int(b.max())) >= 1 << 31:
        return None
    j = int(np.argmin(a[with_b] / b[with_b]))
    exact = Fraction(int(a[with_b][j]), int(b[with_b][j]))
    if exact == 0:
        return None
    denominator = COUPLING_PRECISION * -(-exact.denominator // exact.numerator)  # >= PRECISION / ratio
    ratio = Fraction(exact.numerator * denominator // exact.denominator, denominator)
    p, q = ratio.numerator, ratio.denominator
    if max(q * int(a.max()), p * int(b.max())) >= 1 << 62 or np.any(q * a < p * b):
        return None  # (the float argmin cannot miss the smallest ratio by more than the rounding: a guard)
    return ratio


def coupled_bound(a: np.ndarray, cap_a: int, b: np.ndarray, cap_b: int) -> int:
    """Rows needed for budget b when every item's amount in a is at least ``alpha`` times its amount in b.

    With ``n_i = a_i - alpha b_i >= 0`` (what an item takes of a beyond its share tied to b, e.g. an image
    sample's text tokens, with a = tokens and b = vision patches at alpha = tokens per patch), a row holds
    ``b_row <= min(B, (A - n_row) / alpha) = B - max(0, n_row - c) / alpha`` with ``c = A - alpha B``. As
    ``max(0, x - c)`` is superadditive over nonnegative x, ``b_i + max(0, n_i - c) / alpha`` is a valid
    size for each item in a row of capacity B, and
    ``rows >= ceil(sum_i (b_i + max(0, n_i - c) / alpha) / B)``: the patches that rows holding long texts
    cannot take. Alpha is the smallest a_i / b_i, rounded down to p/q (``_largest_ratio_below``: all of it is
    integer arithmetic); 0 where there is none or ``c < 0`` (budget b can then never fill a row: the bound of
    a alone is as good).
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    ratio = _largest_ratio_below(a, b)
    if ratio is None:
        return 0
    p, q = ratio.numerator, ratio.denominator
    c = q * int(cap_a) - p * int(cap_b)
    if c < 0 or 2.0 * q * float(a.sum()) >= 2.0**62:  # (p b_i <= q a_i: the sum below stays within int64)
        return 0
    # Scaled by q: sum_i (p b_i + max(0, q a_i - p b_i - c)) <= rows * p B. A c of q max(a) or more (a
    # budget far above any item, e.g. no sample cap) leaves every max at 0 (and may not fit in int64).
    excess = int(np.maximum(0, q * a - p * b - c).sum()) if c < q * int(a.max()) else 0
    return -(-(p * int(b.sum()) + excess) // (p * int(cap_b)))
