"""LP-guided packing under per-row budgets (vector bin packing): the pattern LP over item vectors.

The constrained counterpart of ``patterns.lp_pattern_pack``. An item is a vector: its length, its amount
of each resource (media items, patches, audio frames) and 1 for the sample cap when there is one. Items
with the same vector form a class (exact vectors, no rounding: a row's budgets hold exactly). The master
LP, its column generation and the sequential rounding are ``patterns.round_pattern_lp``'s; only the pricing
differs: the pattern worth most at the LP's prices is a multi-dimensional bounded knapsack. Greedy fills
price first (cheap, and nearly always one beats a row), valued at the fractional bound of the tightest
budget; only when none does, a small HiGHS MIP (one integer per class, one ``<= budget`` row per
dimension) whose dual bound is the value, so Farley's bound stays valid when it stops at its node limit.
Under a sample cap alone the pricing is exact instead (``_CapPricing``: a knapsack table, samples x tokens).
What the rounding leaves is packed by the constrained greedy packers (``constraints``), the best of
``constrained_pack`` (both item orders) and ``constrained_bfd``.

On the media benchmark sets every item is its own class (patch counts vary), so the LP has one row per
item and its column generation tails beyond a few hundred items; ``engine`` runs the step on plans above
the vector bound of few samples or few distinct item vectors only (``CONSTRAINED_LP_MAX_SAMPLES``,
``CONSTRAINED_LP_MAX_CLASSES``). Limits are counts (LP solves, columns,
MIP nodes), HiGHS runs on one thread with a fixed seed: the plan is the same on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .constraints import PackConstraints, constrained_bfd, constrained_pack
from .patterns import (
    LP_EPS,
    LpLimits,
    LpNotSolved,
    _generate_columns,
    _Master,
    _Work,
    fractional_fill,
    patterns_to_slots,
    plan_patterns,
    residual_patterns,
    round_pattern_lp,
    run_highs,
    smoothing_weight,
)

PRICING_MAX_NODES = 100  # branch-and-bound nodes per pricing MIP (its dual bound stays a valid value)
GREEDY_SEEDS = 8  # greedy fills per pricing that start from one of the dearest classes
CAP_PATTERNS = 4  # patterns per exact pricing under a sample cap alone (the best of as many sample counts)
# Cells (bundles x samples x tokens) up to which that pricing runs: its masks take a bit each (at most 75 MB),
# a pricing ~1-3 s; text of ~1,600 lengths under a cap of 7 at W=32768 (in steps of 8) takes ~160M. Its table
# (samples x tokens, float64, with two temporaries as large) at most CAP_PRICING_MAX_TABLE cells (~100 MB).
CAP_PRICING_MAX_CELLS = 600_000_000
CAP_PRICING_MAX_TABLE = 4_000_000
# LP solves dominate (each with a greedy pricing, the MIP when the greedy finds nothing); a known bound
# may end the LP after fewer columns than in 1-D (the vector LPs are small: one row per item here).
VECTOR_LIMITS = LpLimits(
    max_columns=1500, max_knapsack_work=10**12, max_lp_solves=150, max_rounds=400, min_columns=50
)


class _VectorPricing:
    """Multi-dimensional bounded knapsack over classes as a HiGHS MIP, built once; each pricing changes
    the objective (the prices) and the column bounds (the demand left)."""

    def __init__(self, highspy, vectors: np.ndarray, caps: np.ndarray) -> None:
        self.vectors = vectors
        self.caps = caps
        # Per class: how many copies fit one row by each budget alone.
        with np.errstate(divide="ignore"):
            fit = np.where(vectors > 0, caps // np.maximum(vectors, 1), np.iinfo(np.int64).max)
        self.fit = fit.min(axis=1)
        self.highspy = highspy
        self.model = getattr(highspy, "_Highs", highspy.Highs)()
        options = (
            ("output_flag", False),
            ("threads", 1),
            ("random_seed", 0),
            ("mip_max_nodes", PRICING_MAX_NODES),
        )
        for name, value in options:
            self.model.setOptionValue(name, value)
        self.model.changeObjectiveSense(highspy.ObjSense.kMaximize)
        m = len(vectors)
        for _ in range(m):
            self.model.addVar(0.0, 0.0)
        self.model.changeColsIntegrality(
            m, np.arange(m, dtype=np.int32), np.full(m, highspy.HighsVarType.kInteger)
        )
        for d, cap in enumerate(caps.tolist()):
            idx = np.flatnonzero(vectors[:, d]).astype(np.int32)
            self.model.addRow(
                -highspy.kHighsInf, float(cap), len(idx), idx, vectors[idx, d].astype(np.float64)
            )
        self.columns = np.arange(m, dtype=np.int32)

    def floor(self, demand: np.ndarray) -> int:
        return max(-(-int(demand @ self.vectors[:, d]) // int(c)) for d, c in enumerate(self.caps.tolist()))

    def price(self, demand: np.ndarray, prices: np.ndarray) -> tuple[float, list[np.ndarray], int]:
        """Greedy fills first (cheap, and their patterns are as good for the master); the MIP only
        when none of them is worth more than one row, to prove the LP solved or find what they miss."""
        upper = np.where(prices > LP_EPS, np.minimum(demand, self.fit), 0)
        patterns = self._greedy(upper, prices)
        if patterns:
            return self._fractional_bound(upper, prices), patterns, 1
        return self._mip(upper, prices)

    def _greedy(self, upper: np.ndarray, prices: np.ndarray) -> list[np.ndarray]:
        """Improving patterns from greedy fills: classes by price per unit of size, size measured by
        each budget alone and by all of them together (their shares summed); and the summed-share order
        again from each of the GREEDY_SEEDS dearest classes put in first (more columns per LP solve: the
        column generation tails less)."""
        present = np.flatnonzero(upper)
        shares = self.vectors[present] / self.caps
        orders = [
            np.lexsort((present, -prices[present] / np.maximum(size, 1e-12)))
            for size in (shares.sum(axis=1), *shares.T)
        ]
        dearest = np.lexsort((present, -prices[present]))[:GREEDY_SEEDS]
        orders += [np.concatenate([[k], orders[0][orders[0] != k]]) for k in dearest.tolist()]
        found: dict[bytes, np.ndarray] = {}
        vectors = self.vectors[present].tolist()
        for order in orders:
            left = self.caps.tolist()
            pattern = np.zeros(len(upper), dtype=np.int64)
            for k in order.tolist():
                vec = vectors[k]
                take = min([int(upper[present[k]])] + [lf // v for lf, v in zip(left, vec, strict=True) if v])
                if take > 0:
                    pattern[present[k]] = take
                    left = [lf - v * take for lf, v in zip(left, vec, strict=True)]
            if prices @ pattern > 1 + 1e-9:
                found.setdefault(pattern.tobytes(), pattern)
        return list(found.values())

    def _fractional_bound(self, upper: np.ndarray, prices: np.ndarray) -> float:
        """An upper bound on the best pattern's value: the fractional knapsack of each budget alone (the
        tightest of them); keeps Farley's bound valid while the greedy fills price."""
        best = np.inf
        for d, cap in enumerate(self.caps.tolist()):
            weight = self.vectors[:, d]
            free = float(prices[(weight == 0) & (upper > 0)] @ upper[(weight == 0) & (upper > 0)])
            used = np.flatnonzero((weight > 0) & (upper > 0))
            order = used[np.argsort(-prices[used] / weight[used], kind="stable")]
            best = min(best, free + fractional_fill(weight[order], upper[order], prices[order], cap))
        return float(best)

    def _mip(self, upper: np.ndarray, prices: np.ndarray) -> tuple[float, list[np.ndarray], int]:
        m = len(upper)
        self.model.changeColsCost(m, self.columns, np.where(upper > 0, prices, 0.0))
        self.model.changeColsBounds(m, self.columns, np.zeros(m), upper.astype(np.float64))
        run_highs(self.model, self.highspy)
        info = self.model.getInfo()
        solution = np.asarray(self.model.getSolution().col_value, dtype=np.float64)
        pattern = np.minimum(np.round(solution).astype(np.int64), upper).clip(0)
        feasible = info.primal_solution_status == 2 and (pattern @ self.vectors <= self.caps).all()
        found = float(prices @ pattern) if feasible else 0.0
        # The dual bound caps the best pattern's value even when the node limit stopped the MIP.
        value = max(found, float(info.mip_dual_bound)) if np.isfinite(info.mip_dual_bound) else found
        patterns = [pattern] if feasible and found > 1 + 1e-9 else []
        return value, patterns, int(info.mip_node_count) + 1


class _CapPricing(_VectorPricing):
    """The pricing under a sample cap alone (item vectors: tokens, 1): the exact bounded knapsack over
    (samples, tokens / their common divisor with W) by dynamic programming, every round, where
    ``_VectorPricing`` prices by greedy fills and a node-limited MIP whose dual bound stays loose (text under
    a cap of 7 a row at 45,000 samples: no bound above the vector bound in 5,000 LP solves). Each class's
    copies go in as bundles of 1, 2, 4, ... (binary splitting); a bit mask per bundle recovers the patterns:
    the best of each sample count worth more than one row, up to CAP_PATTERNS of them. With the 1-D
    pricing's dual smoothing (``patterns.SMOOTHING``) on as many classes. Where the masks would pass
    ``max_cells`` cells or the table CAP_PRICING_MAX_TABLE, ``_VectorPricing`` prices instead."""

    def __init__(
        self, highspy, vectors: np.ndarray, caps: np.ndarray, max_cells: int = CAP_PRICING_MAX_CELLS
    ) -> None:
        super().__init__(highspy, vectors, caps)
        scale = math.gcd(int(caps[0]), *vectors[:, 0].tolist())
        self.sizes = vectors[:, 0] // scale
        self.width = int(caps[0]) // scale
        self.max_cells = max_cells

    @property
    def smoothing(self) -> float:
        """``_generate_columns``' dual smoothing weight for this LP (as ``patterns.KnapsackPricing``'s)."""
        return smoothing_weight(len(self.vectors))

    def price(self, demand: np.ndarray, prices: np.ndarray) -> tuple[float, list[np.ndarray], int]:
        upper = np.where(prices > LP_EPS, np.minimum(demand, self.fit), 0)
        bundles = _bundles(upper)
        cap = min(int(self.caps[1]), int(upper.sum()))  # no row holds more samples than there are
        table_cells = (cap + 1) * (self.width + 1)
        cells = len(bundles) * table_cells
        if cells > self.max_cells or table_cells > CAP_PRICING_MAX_TABLE:
            return super().price(demand, prices)
        table = np.full((cap + 1, self.width + 1), -np.inf)
        table[0] = 0.0  # table[c, t]: the best value of c samples within t tokens
        masks = []
        for item, copies in bundles:
            size = int(self.sizes[item]) * copies
            if size > self.width or copies > cap:
                masks.append(None)
                continue
            taken = table[:-copies, : self.width + 1 - size] + float(prices[item]) * copies
            better = taken > table[copies:, size:]
            table[copies:, size:] = np.where(better, taken, table[copies:, size:])
            masks.append(np.packbits(better, axis=None))
        best = table[:, self.width]
        value = float(best.max())
        counts = [c for c in np.argsort(-best, kind="stable")[:CAP_PATTERNS].tolist() if best[c] > 1 + 1e-9]
        patterns = [self._pattern(bundles, masks, count, len(upper)) for count in counts]
        return value, patterns, cells

    def _pattern(
        self, bundles: list[tuple[int, int]], masks: list, count: int, num_classes: int
    ) -> np.ndarray:
        """The pattern behind ``table[count, width]``, walked back through the bundles' masks."""
        pattern = np.zeros(num_classes, dtype=np.int64)
        tokens = self.width
        for (item, copies), mask in zip(reversed(bundles), reversed(masks), strict=True):
            size = int(self.sizes[item]) * copies
            if mask is None or count < copies or tokens < size:
                continue
            columns = self.width + 1 - size
            index = (count - copies) * columns + tokens - size
            if (mask[index >> 3] >> (7 - (index & 7))) & 1:
                pattern[item] += copies
                count -= copies
                tokens -= size
        return pattern


def _pricing(highspy, vectors: np.ndarray, caps: np.ndarray, constraints: PackConstraints) -> _VectorPricing:
    """The exact ``_CapPricing`` under a sample cap alone, else ``_VectorPricing``."""
    if constraints.resources or constraints.max_samples_per_row is None:
        return _VectorPricing(highspy, vectors, caps)
    return _CapPricing(highspy, vectors, caps)


def _bundles(upper: np.ndarray) -> list[tuple[int, int]]:
    """(class, copies) bundles of 1, 2, 4, ... copies and the rest, per class with ``upper`` > 0: any count
    up to ``upper`` is a sum of some of them (binary splitting of a bounded knapsack)."""
    out = []
    for item in np.flatnonzero(upper > 0).tolist():
        left, copies = int(upper[item]), 1
        while left > 0:
            take = min(copies, left)
            out.append((item, take))
            left -= take
            copies *= 2
    return out


@dataclass(frozen=True)
class _Items:
    """A constrained instance as vectors: ``matrix[i] = (length, amounts..., 1 if capped)``, ``caps`` the
    row budgets in the same order; the resources' budgets and the sample cap to rebuild constraints."""

    matrix: np.ndarray
    caps: np.ndarray
    budgets: np.ndarray
    max_samples: int | None

    @classmethod
    def of(cls, lengths: np.ndarray, capacity: int, constraints: PackConstraints) -> _Items:
        n = len(lengths)
        amounts, budgets = constraints.amounts_matrix(n)
        cap = constraints.max_samples_per_row
        columns = [lengths[:, None], amounts] + ([np.ones((n, 1), np.int64)] if cap is not None else [])
        caps = np.concatenate([[capacity], budgets] + ([[cap]] if cap is not None else []))
        return cls(np.hstack(columns).astype(np.int64), caps.astype(np.int64), budgets, cap)

    def pack_greedy(self, vectors: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, int]:
        """The better of the constrained greedy packers on ``counts[j]`` items of each class vector; the
        rows of the items in class order (a class-level packing)."""
        items = np.repeat(vectors, counts, axis=0)
        resources = {f"r{d}": (items[:, 1 + d], int(b)) for d, b in enumerate(self.budgets.tolist())}
        constraints = PackConstraints(self.max_samples, resources)
        width = int(self.caps[0])
        return min(
            (
                constrained_pack(items[:, 0], width, constraints),
                constrained_pack(items[:, 0], width, constraints, weigh_by_demand=False),
                constrained_bfd(items[:, 0], width, constraints),
            ),
            key=lambda packed: packed[1],
        )


def _classes(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, start: tuple[np.ndarray, int]
) -> tuple[_Items, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The instance as item vectors, its distinct vectors (classes) and their counts, the items in class
    order, and the distinct row patterns of the plan ``start`` (``(row_of, num_rows)``) over the classes."""
    items = _Items.of(lengths, capacity, constraints)
    vectors, class_of, counts = np.unique(items.matrix, axis=0, return_inverse=True, return_counts=True)
    order = np.argsort(class_of.reshape(-1), kind="stable")  # the items in class order
    start_row_of, start_rows = start
    start_patterns = plan_patterns(np.asarray(start_row_of)[order], start_rows, counts)[0]
    return items, vectors, counts, order, start_patterns


def constrained_lp_pack(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    start: tuple[np.ndarray, int],
    lower_bound: int = 0,
    limits: LpLimits | None = None,
) -> tuple[np.ndarray, int] | None:
    """``(row_of, num_rows)`` with fewer rows than ``start`` (``(row_of, num_rows)``, e.g. the greedy
    plan), guided by the vector pattern LP (see the module doc); None if none is found, the LP proves
    ``start`` optimal, or ``highspy`` is not installed. Every budget and the sample cap hold exactly.
    ``lower_bound`` (e.g. the vector bound) ends the column generation once the LP rounds up to it."""
    try:
        import highspy
    except ImportError:
        return None
    items, vectors, counts, order, start_patterns = _classes(lengths, capacity, constraints, start)
    start_rows = start[1]
    out = round_pattern_lp(
        _pricing(highspy, vectors, items.caps, constraints),
        counts,
        start_patterns,
        start_rows,
        lambda demand: residual_patterns(vectors, demand, [items.pack_greedy]),
        lower_bound,
        limits or VECTOR_LIMITS,
    )
    if out is None:
        return None
    slot_rows, num_rows = patterns_to_slots(*out, counts)
    row_of = np.empty(len(lengths), dtype=np.int32)
    row_of[order] = slot_rows
    return row_of, num_rows


def vector_lp_rows_bound(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    start: tuple[np.ndarray, int],
    lower_bound: int = 0,
    limits: LpLimits | None = None,
) -> int:
    """A lower bound on the rows of any packing of ``lengths`` under ``constraints``: the vector pattern
    LP's (``ceil(LP)`` once solved, else Farley's bound, never below ``lower_bound``), its columns started
    from the plan ``start`` (``(row_of, num_rows)``) and generated until the bound reaches its rows or
    ``limits`` are spent; ``lower_bound`` where ``highspy`` is missing or HiGHS fails.

    Where several budgets bind together (a sample cap beside the tokens) it can be well above the bound of
    each dimension alone, which is what the benchmarks split "bound not tight" from the packer's loss with.
    The pricing skips classes priced at most ``LP_EPS``; a row holds at most as many items as the cap (or
    the capacity over the shortest length) of them, and their worth is added to every pattern's value."""
    try:
        import highspy
    except ImportError:
        return lower_bound
    constraints = constraints.without_unused_budgets()  # the pricing divides by every budget
    items, vectors, counts, _, start_patterns = _classes(lengths, capacity, constraints, start)
    start_rows = start[1]
    master = _Master(highspy, counts)
    for pattern in start_patterns:
        master.add(pattern)
    per_row = constraints.max_samples_per_row or int(capacity) // max(int(np.min(lengths)), 1)
    limits = limits or VECTOR_LIMITS
    pricing = _pricing(highspy, vectors, items.caps, constraints)
    try:
        lower, _ = _generate_columns(
            master, pricing, counts, start_rows, _Work(limits), lower_bound, LP_EPS * per_row
        )
    except LpNotSolved:
        return lower_bound
    return max(lower, lower_bound)
