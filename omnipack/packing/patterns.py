"""LP-guided packing: the Gilmore-Gomory pattern LP over length classes, rounded to a packing.

A row's *pattern* says how many items of each length class it holds. The LP ``min sum x_p`` subject to
``sum_p a_p x_p >= counts`` (rows of pattern p: x_p) is solved by column generation: the master LP (HiGHS)
gives a price per class, greedy fills (or, when none beats a row, the exact bounded knapsack over the row
width) find patterns worth more than one row at those prices, and they join the master. Exchange columns
(a shorter item may take a longer one's slot) keep the prices ordered by length, which cuts the LP solves
several-fold on mixes of hundreds of lengths; on thousands of lengths the pricing also runs at prices
smoothed towards those of the best bound so far (Wentges), which damps their swings between solves. ``ceil(LP)`` is a lower bound on
the rows of any packing, and on practical instances it is the optimum; the LP's patterns are what the
greedy packers miss on mixes of 2-4 items per row (the largest items share rows with each other at some
waste, the others form large + medium + small triples, small items kept for the rows that need them).

The LP is made integral by sequential rounding: its whole rows are taken, or when it has none, one
row of its largest pattern; the LP is solved again for the items left (its prices move to the items
still scarce), and so on. After each step the subset-sum refill or FFD prices packing the rest greedily;
the best stopping point wins. Patterns that cover a class more often than it has items just leave the
surplus slots empty. (A HiGHS MIP over the generated patterns was tried instead: its root node alone
took seconds on 1000 items, and a MIP start set by ``setSolution`` made HiGHS 1.16 report a wrong
optimum.)

HiGHS comes from the optional ``highspy`` package: without it ``lp_pattern_pack`` returns None and the
packer keeps its greedy plan. Every limit is a count (columns, knapsack work, LP solves), never a clock,
and HiGHS runs on one thread, so the plan is the same on every run (with the same HiGHS release).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

LP_EPS = 1e-7
PATTERNS_PER_PRICING = 8  # improving patterns taken from one knapsack table (other fill levels)
# Dual smoothing (Wentges) of the 1-D pricing on LPs of at least SMOOTHING_MIN_CLASSES lengths: prices are taken
# SMOOTHING of the way towards those of the best Farley bound so far, which damps the prices' swings between
# LP solves (benchmarks/README.md, "Dual smoothing"). On fewer lengths it cost a row where it did not pay.
SMOOTHING = 0.5
SMOOTHING_MIN_CLASSES = 1024
MIN_COLUMNS = 200  # patterns generated before a known bound may end the LP (its columns are the rounding's)


class LpNotSolved(RuntimeError):
    """HiGHS ended a master LP without an optimal solution (numerical trouble): the greedy plan stays."""


@dataclass(frozen=True)
class LpLimits:
    """Work limits of one LP-guided solve (counts, so the outcome does not depend on the machine), for
    the first LP and, afresh, for all the LPs of the rounding together."""

    # Sized on 200 random mixtures of 10k-100k samples (benchmarks/README.md, "Large mixtures"): with ten
    # times less work and exact pricing only, mixes of 1000+ length classes at W=16384 stopped with the LP
    # barely started (its first pricings alone spent the budget) and plans 2-4% over the LP bound. Greedy
    # pricing and the exchange columns now solve most such LPs well inside it (~0.3 s per 1e8 cells). At
    # 1.5e9 cells the first LP of a W=32768 mix of 1,671 lengths stopped at 6,590.0 against its bound of
    # 6,584 and rounded to 6,591 rows, one over the optimum + 0.1%; 2e9 gives 6,589 ("Large mixtures").
    max_columns: int = 8000  # patterns added by the column generation
    max_knapsack_work: int = 2_000_000_000  # knapsack table cells updated, summed over the pricing rounds
    # One pricing's table (capacity + 1 cells per power-of-two chunk of each class's count): its time and
    # memory. The work limit is checked between pricings, so a larger one is not started at all.
    max_pricing_cells: int = 150_000_000
    max_lp_solves: int = 2000  # master LP solves (each followed by one pricing, two when smoothing mis-prices)
    max_rounds: int = 1000  # rounding steps, each followed by a new LP for the demand left
    min_columns: int = MIN_COLUMNS  # patterns generated before a known bound may end the LP


def pricing_cells(values: np.ndarray, counts: np.ndarray, capacity: int) -> int:
    """The most table cells one ``best_patterns`` call can update (every class priced): capacity + 1 per
    power-of-two chunk of each class's count, the count cut to what fits a row."""
    chunks = sum(min(int(c), int(capacity) // int(v)).bit_length() for v, c in zip(values, counts, strict=True))
    return chunks * (int(capacity) + 1)


def best_patterns(
    values: np.ndarray, counts: np.ndarray, capacity: int, prices: np.ndarray, limit: int = 1
) -> tuple[float, list[np.ndarray], int]:
    """Bounded knapsack over classes: the pattern maximising ``sum(prices * a)`` with
    ``sum(values * a) <= capacity`` and ``a <= counts`` (counts split in powers of two).

    Returns the best value, up to ``limit`` patterns (the best, then the best of other fill levels, by
    value, all worth more than 1 when ``limit > 1``) and the work done (table cells updated).
    """
    table = np.zeros(capacity + 1)
    chunks: list[tuple[int, int]] = []  # (class, items)
    took: list[np.ndarray] = []
    for j, (v, c, p) in enumerate(zip(values.tolist(), counts.tolist(), prices.tolist(), strict=True)):
        if p <= LP_EPS:
            continue
        c = min(c, capacity // v)
        step = 1
        while c > 0:
            take = min(step, c)
            c -= take
            step *= 2
            w = v * take
            candidate = table[: capacity + 1 - w] + p * take
            took.append(candidate > table[w:] + 1e-12)  # cell w + i improved by this chunk
            np.maximum(table[w:], candidate, out=table[w:])
            chunks.append((j, take))
    best = float(table.max()) if len(table) else 0.0
    # The table is non-decreasing in the fill; each step up ends a distinct pattern at that fill.
    steps = np.concatenate([[0], np.flatnonzero(np.diff(table) > 0) + 1])
    order = steps[np.argsort(-table[steps], kind="stable")]
    picks = order[:1] if limit == 1 else order[table[order] > 1 + 1e-9][:limit]
    patterns, seen = [], set()
    for fill in picks.tolist():
        pattern = np.zeros(len(values), dtype=np.int64)
        for (j, take), better in zip(reversed(chunks), reversed(took), strict=True):
            w = int(values[j]) * take
            if fill >= w and better[fill - w]:
                pattern[j] += take
                fill -= w
        key = pattern.tobytes()
        if key not in seen:
            seen.add(key)
            patterns.append(pattern)
    return best, patterns, len(chunks) * (capacity + 1)


def plan_patterns(slot_rows: np.ndarray, num_rows: int, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct row patterns of a class-level packing ``[P, classes]`` (first use order) and how
    many rows use each."""
    m = len(counts)
    slot_class = np.repeat(np.arange(m, dtype=np.int64), counts)
    pairs, per_pair = np.unique(slot_rows.astype(np.int64) * m + slot_class, return_counts=True)
    row, cls = np.divmod(pairs, m)
    cuts = np.flatnonzero(np.diff(row)) + 1
    uses: dict[tuple[bytes, bytes], int] = {}
    for row_classes, row_counts in zip(np.split(cls, cuts), np.split(per_pair, cuts), strict=True):
        key = (row_classes.tobytes(), row_counts.tobytes())
        uses[key] = uses.get(key, 0) + 1
    patterns = np.zeros((len(uses), m), dtype=np.int64)
    for p, (row_classes, row_counts) in enumerate(uses):
        patterns[p, np.frombuffer(row_classes, dtype=np.int64)] = np.frombuffer(row_counts, dtype=np.int64)
    return patterns, np.array(list(uses.values()), dtype=np.int64)


def patterns_to_slots(patterns: np.ndarray, rows: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, int]:
    """A class-level packing from ``rows[p]`` rows of each pattern ``p`` that together cover ``counts``:
    ``(slot_rows, num_rows)`` as ``greedy.bfd_classes`` returns it. Surplus slots stay empty; rows left
    with no item are dropped."""
    rows = np.asarray(rows, dtype=np.int64)
    first_row = np.concatenate([[0], np.cumsum(rows)])
    parts = []
    for j, need in enumerate(counts.tolist()):
        users = np.flatnonzero((patterns[:, j] > 0) & (rows > 0))
        slots = [np.repeat(np.arange(first_row[p], first_row[p + 1]), patterns[p, j]) for p in users.tolist()]
        flat = np.concatenate(slots) if slots else np.zeros(0, np.int64)
        if len(flat) < need:
            raise ValueError(f"patterns cover class {j} {len(flat)} times, it has {need} items")
        parts.append(flat[:need])
    slot_rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    used, dense = np.unique(slot_rows, return_inverse=True)
    return dense.astype(np.int64), len(used)


def run_highs(model: Any, highspy: Any) -> None:
    """``model.run()`` on one thread where this process's HiGHS allows it.

    HiGHS keeps one thread scheduler per process, sized by the first solve; a model whose ``threads``
    option differs from it fails at once (model status "Not Set"). In a process that had solved anything
    with HiGHS's default options before (a library caller, a benchmark), every LP here failed, and the
    LP-guided step was skipped without a word: the same lengths gave another plan there than in a fresh
    process. Such a model now runs on the scheduler there is (``threads`` 0); its simplex and MIP runs
    are deterministic whatever the scheduler's size, so the plan is the same (tested).
    """
    status = model.run()
    if status == highspy.HighsStatus.kError and model.getModelStatus() == highspy.HighsModelStatus.kNotset:
        model.setOptionValue("threads", 0)
        model.run()


class _Master:
    """The pattern LP in HiGHS: one ``>= demand`` row per class, one column per pattern (cost 1)."""

    def __init__(self, highspy, counts: np.ndarray, exchanges: np.ndarray | None = None) -> None:
        # The plain core class: ``highspy.Highs`` prints a banner on stdout the first time it is built.
        self.highspy = highspy
        self.model = getattr(highspy, "_Highs", highspy.Highs)()
        # Primal simplex: new columns leave the basis primal feasible (half the iterations of the dual).
        options = (("output_flag", False), ("threads", 1), ("random_seed", 0), ("simplex_strategy", 4))
        for name, value in options:
            self.model.setOptionValue(name, value)
        empty_index, empty_value = np.zeros(0, np.int32), np.zeros(0, np.float64)
        for count in counts.tolist():
            self.model.addRow(float(count), highspy.kHighsInf, 0, empty_index, empty_value)
        self.num_classes = len(counts)
        # Dual-optimal inequalities (Ben Amor, Desrosiers and Valerio de Carvalho): a free column per
        # (big, small) pair, -1 on big's row and +1 on small's, lets a slot of a big item hold a small one.
        # Its dual constraint (small's price <= big's) holds at some optimum of the full LP, so the LP value
        # is the same, while the master stops paying for prices that zig-zag between neighbouring lengths:
        # on a 650-class mix at W=32768, 260 LP solves instead of 1,257 (benchmarks/README.md).
        self.exchanges = np.zeros((0, 2), np.int64) if exchanges is None else np.asarray(exchanges, np.int64)
        for big, small in self.exchanges.tolist():
            index = np.array([big, small], dtype=np.int32)
            self.model.addCol(0.0, 0.0, highspy.kHighsInf, 2, index, np.array([-1.0, 1.0]))
        self.columns: list[np.ndarray] = []
        self.index: dict[bytes, int] = {}
        self.holding: dict[int, list[int]] = {}  # class -> the columns that hold it, in column order

    def add(self, pattern: np.ndarray) -> int:
        """The column of ``pattern``, added if new."""
        key = pattern.tobytes()
        if key not in self.index:
            idx = np.flatnonzero(pattern).astype(np.int32)
            self.model.addCol(
                1.0, 0.0, self.highspy.kHighsInf, len(idx), idx, pattern[idx].astype(np.float64)
            )
            self.index[key] = len(self.columns)
            for j in idx.tolist():
                self.holding.setdefault(j, []).append(len(self.columns))
            self.columns.append(pattern)
        return self.index[key]

    def set_demand(self, demand: np.ndarray) -> None:
        m = self.num_classes
        upper = np.full(m, self.highspy.kHighsInf)
        self.model.changeRowsBounds(m, np.arange(m, dtype=np.int32), demand.astype(np.float64), upper)

    def solve_lp(self) -> tuple[float, np.ndarray, np.ndarray]:
        """Objective, row duals (prices, >= 0) and column values (exchanges first: ``pattern_rows``) of the
        LP over the columns so far."""
        run_highs(self.model, self.highspy)
        if self.model.getModelStatus() != self.highspy.HighsModelStatus.kOptimal:
            raise LpNotSolved(self.model.modelStatusToString(self.model.getModelStatus()))
        solution = self.model.getSolution()
        prices = np.maximum(np.asarray(solution.row_dual, dtype=np.float64), 0.0)
        objective = self.model.getInfo().objective_function_value
        return objective, prices, np.asarray(solution.col_value, dtype=np.float64)

    def pattern_rows(self, values: np.ndarray) -> np.ndarray:
        """Rows per pattern column from ``solve_lp``'s column values, with no exchange left: each exchange's
        flow turns that many rows' big items into small ones (new patterns, as columns), so the rows stay
        the same and cover the same demand. Exchanges come with every big class's incoming ones first, so
        a chain big -> small -> smaller carries on."""
        first = len(self.exchanges)
        x, flows = values[first:].copy(), values[:first]
        for (big, small), flow in zip(self.exchanges.tolist(), flows.tolist(), strict=True):
            while flow > LP_EPS:
                holders = np.asarray(self.holding.get(big, ()), dtype=np.int64)
                holders = holders[x[holders] > LP_EPS]
                if not len(holders):
                    break  # the LP's tolerance: a flow of ~1e-7 rows past what the patterns hold
                p = int(holders[0])
                moved = min(float(x[p]), flow)
                pattern = self.columns[p].copy()
                pattern[big] -= 1
                pattern[small] += 1
                q = self.add(pattern)
                if q >= len(x):
                    x = np.concatenate([x, np.zeros(q + 1 - len(x))])
                x[p] -= moved
                x[q] += moved
                flow -= moved
        return x


@dataclass
class _Work:
    """What the column generation has spent so far, against ``LpLimits``."""

    limits: LpLimits
    columns: int = 0
    knapsack: int = 0
    rounds: int = 0

    @property
    def spent(self) -> bool:
        limits = self.limits
        return (
            self.columns >= limits.max_columns
            or self.knapsack >= limits.max_knapsack_work
            or self.rounds >= limits.max_lp_solves
        )


class Pricing(Protocol):
    """The pricing problem of the pattern LP: the row pattern worth most at the master's prices."""

    def floor(self, demand: np.ndarray) -> int:
        """A cheap lower bound on the rows for ``demand`` (e.g. ceil(total / width))."""
        ...

    def price(self, demand: np.ndarray, prices: np.ndarray) -> tuple[float, list[np.ndarray], int]:
        """An upper bound on the best pattern's value (its exact value when solved), improving patterns
        (value > 1; none when none was found) and the work done."""
        ...


def smoothing_weight(num_classes: int) -> float:
    """``_generate_columns``' dual smoothing weight for a pricing over ``num_classes`` classes: SMOOTHING from
    SMOOTHING_MIN_CLASSES on, else none."""
    return SMOOTHING if num_classes >= SMOOTHING_MIN_CLASSES else 0.0


@dataclass(frozen=True)
class KnapsackPricing:
    """1-D pricing: greedy fills first (``greedy_patterns``), the exact bounded knapsack over length classes
    (``best_patterns``) when none is worth more than one row, unless its table would exceed ``max_cells``:
    then no pattern, and the column generation stops with Farley's bound."""

    values: np.ndarray  # class lengths, divided by their common divisor with the width
    capacity: int
    max_cells: int = LpLimits.max_pricing_cells

    @property
    def smoothing(self) -> float:
        """``_generate_columns``' dual smoothing weight for this LP."""
        return smoothing_weight(len(self.values))

    def floor(self, demand: np.ndarray) -> int:
        return -(-int(demand @ self.values) // self.capacity)

    def price(self, demand: np.ndarray, prices: np.ndarray) -> tuple[float, list[np.ndarray], int]:
        bound, found, work = greedy_patterns(self.values, demand, self.capacity, prices, PATTERNS_PER_PRICING)
        if found:
            return bound, found, work
        live = prices > LP_EPS
        if pricing_cells(self.values[live], demand[live], self.capacity) > self.max_cells:
            return bound, [], work
        return best_patterns(self.values, demand, self.capacity, prices, PATTERNS_PER_PRICING)


def fractional_fill(weights: np.ndarray, upper: np.ndarray, prices: np.ndarray, capacity: int) -> float:
    """The value of filling ``capacity`` with up to ``upper`` items of each class in the order given, the first
    one that does not fit in part: with classes by price per unit of weight, best first, the fractional
    knapsack's value, an upper bound on any pattern's."""
    fill = np.cumsum(weights * upper)
    whole = int(np.searchsorted(fill, capacity, side="right"))
    value = float(prices[:whole] @ upper[:whole])
    if whole < len(weights):
        room = capacity - (int(fill[whole - 1]) if whole else 0)
        value += float(prices[whole]) * room / float(weights[whole])
    return value


def greedy_patterns(
    values: np.ndarray, counts: np.ndarray, capacity: int, prices: np.ndarray, starts: int
) -> tuple[float, list[np.ndarray], int]:
    """Improving patterns (worth more than one row) from greedy fills: classes by price per unit of length,
    from each of the ``starts`` densest classes on; with the fractional knapsack's value, an upper bound on
    the best pattern's (so Farley's bound stays valid), and the work as one table cell per class visited.
    Far cheaper than the exact knapsack, and while the LP is far from solved nearly always improving."""
    live = np.flatnonzero((prices > LP_EPS) & (counts > 0))
    if not len(live):
        return 0.0, [], 0
    order = live[np.lexsort((live, -prices[live] / values[live]))]
    size = values[order]
    take_max = np.minimum(counts[order], capacity // size)
    bound = fractional_fill(size, take_max, prices[order], capacity)
    found: dict[bytes, np.ndarray] = {}
    sizes, limits = size.tolist(), take_max.tolist()
    for start in range(min(starts, len(order))):
        pattern = np.zeros(len(values), dtype=np.int64)
        room = capacity
        for k in range(start, len(order)):
            take = min(limits[k], room // sizes[k])
            if take:
                pattern[order[k]] = take
                room -= take * sizes[k]
        if prices @ pattern > 1 + 1e-6:
            found.setdefault(pattern.tobytes(), pattern)
    return bound, list(found.values()), len(order) * min(starts, len(order))


def _generate_columns(
    master: _Master,
    pricing: Pricing,
    demand: np.ndarray,
    upper: int,
    work: _Work,
    floor: int = 0,
    value_slack: float = 0.0,
) -> tuple[int, np.ndarray]:
    """Column generation until the LP is solved, its bound reaches ``upper``, its value rounds up to
    ``floor`` (a known lower bound: more columns could not lower it further; only after
    ``LpLimits.min_columns`` new patterns, which the rounding needs as much as the value), the pricing
    finds no improving pattern, or the work is spent.

    Returns a lower bound on the rows for ``demand`` (ceil of the LP when solved, else the best of
    Farley's bound ``LP / best pattern value`` and ``floor``; with ``pricing.smoothing``, the best Farley
    bound ``prices @ demand / best pattern value`` over the LP's and the smoothed prices of every round) and
    the last LP's column values.
    ``value_slack`` is added to the best pattern's value in both (the LP solved being Farley's bound at
    value 1): what the pricing may have missed (``lp_rows_bound``).
    """
    floor = max(floor, pricing.floor(demand))
    smoothing = getattr(pricing, "smoothing", 0.0)
    center: np.ndarray | None = None  # the prices of the best Farley bound so far (smoothing's centre)
    best = 0.0  # that bound, before rounding up
    while True:
        objective, prices, values = master.solve_lp()
        patterns: list[np.ndarray] = []
        if smoothing > 0 and center is not None:
            mixed = smoothing * center + (1 - smoothing) * prices
            value_mixed, found, cost = pricing.price(demand, mixed)
            work.knapsack += cost
            if value_mixed > 0 and (bound := float(mixed @ demand) / (value_mixed + value_slack)) > best:
                best, center = bound, mixed
            patterns = [p for p in found if prices @ p > 1 + 1e-9]
        work.rounds += 1
        lp_rows = math.ceil(objective / (1 + value_slack) - 1e-6)
        if not patterns:  # no smoothing, or its prices found nothing the LP's own take: price at those
            value, patterns, cost = pricing.price(demand, prices)
            work.knapsack += cost
            if value <= 1 + 1e-9:
                return lp_rows, master.pattern_rows(values)
            if (bound := objective / (value + value_slack)) > best or center is None:
                best, center = max(best, bound), prices
        lower = max(
            math.ceil(best - 1e-6) if smoothing > 0 else math.ceil(objective / (value + value_slack) - 1e-6),
            floor if work.columns >= work.limits.min_columns else 0,
        )
        if lower >= min(upper, lp_rows) or work.spent or not patterns:
            return lower, master.pattern_rows(values)
        for pattern in patterns:
            master.add(pattern)
        work.columns += len(patterns)


def _sequential_rounding(
    master: _Master,
    x: np.ndarray,
    pricing: Pricing,
    counts: np.ndarray,
    work: _Work,
    complete: Callable[[np.ndarray], int],
    upper: int,
    target: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows per column taken by rounding the LP one step at a time, and the demand left for a greedy
    packer to complete.

    Each round takes the LP's whole rows (rounded down), or, when it has none, one row of its largest
    column cut to the demand left; the LP is then solved again for the demand left (its prices shift
    to the items still scarce). After every round ``complete(demand)`` (rows a greedy packer needs for
    the rest) prices stopping there; the best stopping point wins, ``upper`` (the plan to beat) if none
    is better. The rounding ends when it cannot beat the best (rows taken + the residual LP's bound),
    when the best meets ``target`` (a lower bound on the rows), after ``max_rounds`` or once its own
    work budget is spent.
    """
    taken: dict[int, int] = {}
    demand = counts.copy()
    best = (upper, dict(taken), demand)  # stopping before the first round: the plan to beat
    work = _Work(work.limits)
    for _ in range(work.limits.max_rounds):
        whole = np.floor(x + 1e-9).astype(np.int64)
        if not whole.any():
            column = master.add(np.minimum(master.columns[int(np.argmax(x))], demand))
            whole = np.zeros(len(master.columns), dtype=np.int64)
            whole[column] = 1
        for p in np.flatnonzero(whole).tolist():
            taken[p] = taken.get(p, 0) + int(whole[p])
            demand = np.maximum(demand - master.columns[p] * int(whole[p]), 0)
        rows_taken = sum(taken.values())
        total = rows_taken + (complete(demand) if demand.any() else 0)
        if total < best[0]:
            best = (total, dict(taken), demand)
        if not demand.any() or work.spent or best[0] <= target:
            break
        master.set_demand(demand)
        lower, x = _generate_columns(master, pricing, demand, best[0] - rows_taken, work)
        if rows_taken + lower >= best[0]:
            break
    rows = np.zeros(len(master.columns), dtype=np.int64)
    rows[list(best[1])] = list(best[1].values())
    return rows, best[2]


def residual_patterns(
    values: np.ndarray, demand: np.ndarray, residual_packers: list[Callable]
) -> tuple[np.ndarray, np.ndarray]:
    """The best of ``residual_packers`` on the items of ``demand`` (``packer(values[present],
    demand[present])`` returning ``(slot_rows, num_rows)`` or None; one must succeed): its patterns
    (over all classes) and rows per pattern. ``values`` is any per-class array (lengths, vectors)."""
    present = np.flatnonzero(demand)
    packed = [p(values[present], demand[present]) for p in residual_packers]
    slots, num = min((p for p in packed if p is not None), key=lambda p: p[1])
    patterns, used = plan_patterns(slots, num, demand[present])
    full = np.zeros((len(patterns), len(demand)), dtype=np.int64)
    full[:, present] = patterns
    return full, used


Residual = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # demand -> (patterns, rows per pattern)


def _pack_residual(master: _Master, rows: np.ndarray, demand: np.ndarray, residual: Residual) -> np.ndarray:
    """``rows`` plus the rows ``residual`` packs the items of ``demand`` into (as columns)."""
    if not demand.any():
        return rows
    patterns, used = residual(demand)
    columns = [master.add(pattern) for pattern in patterns]
    out = np.zeros(len(master.columns), dtype=np.int64)
    out[: len(rows)] = rows
    np.add.at(out, columns, used)
    return out


def round_pattern_lp(
    pricing: Pricing,
    counts: np.ndarray,
    start_patterns: np.ndarray,
    start_rows: int,
    residual: Residual,
    lower_bound: int = 0,
    limits: LpLimits | None = None,
    exchanges: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Patterns and rows per pattern covering ``counts`` in fewer rows than a start plan of
    ``start_rows`` rows (its distinct patterns ``start_patterns`` are the first columns), by the
    pattern LP priced by ``pricing`` and sequential rounding, ``residual`` packing what the rounding
    leaves; None if none is found, the LP proves the start optimal, or ``highspy`` is missing.
    ``lower_bound`` (a known bound on the rows) ends the column generation once the LP rounds up to it.
    ``exchanges``: ``(big, small)`` class pairs where a small item fits wherever a big one does, every big
    class's own incoming pairs first (``_Master``).
    """
    try:
        import highspy
    except ImportError:
        return None
    work = _Work(limits or LpLimits())
    master = _Master(highspy, counts, exchanges)
    for pattern in start_patterns:
        master.add(pattern)

    def complete(demand: np.ndarray) -> int:
        return int(residual(demand)[1].sum())

    try:
        lower, x = _generate_columns(master, pricing, counts, start_rows, work, floor=lower_bound)
        if lower >= start_rows or x.sum() > start_rows - 1 + 1e-6:
            return None  # proven optimal, or the LP (stopped by its limits) found nothing better to round
        rows, demand = _sequential_rounding(
            master, x, pricing, counts, work, complete, start_rows, target=lower_bound
        )
    except LpNotSolved:
        return None
    rows = _pack_residual(master, rows, demand, residual)
    if rows.sum() >= start_rows:
        return None
    return np.array(master.columns), rows


def length_exchanges(values: np.ndarray) -> np.ndarray:
    """``(big, small)`` pairs of length classes next to each other in length, longest first: a shorter item
    fits wherever a longer one does (``_Master``'s exchanges)."""
    order = np.argsort(-np.asarray(values), kind="stable")
    return np.stack([order[:-1], order[1:]], axis=1)


def length_pricing(values: np.ndarray, capacity: int, limits: LpLimits) -> KnapsackPricing:
    """The 1-D pricing of length classes ``values`` in rows of ``capacity``, both divided by their common
    divisor (a smaller knapsack table, the same patterns)."""
    scale = math.gcd(int(capacity), *values.tolist())
    return KnapsackPricing(values // scale, int(capacity) // scale, limits.max_pricing_cells)


def lp_rows_bound(
    values: np.ndarray,
    counts: np.ndarray,
    capacity: int,
    start: tuple[np.ndarray, int],
    lower_bound: int = 0,
    limits: LpLimits | None = None,
) -> int:
    """A lower bound on the rows of any packing of ``counts`` items of lengths ``values``: the pattern LP's
    (``ceil(LP)`` once solved, else Farley's bound, never below ``lower_bound``), its column generation
    started from ``start``'s patterns (``(slot_rows, num_rows)``) and ended once the bound reaches its
    rows or ``limits`` are spent; ``lower_bound`` where ``highspy`` is missing or HiGHS fails.

    A plan whose rows it reaches is taken as optimal without a search for a better one, so the bound errs
    low: the pricing skips classes priced at most ``LP_EPS``, which a row holds at most ``capacity //
    min(values)`` of, and their worth is added to every pattern's value."""
    try:
        import highspy
    except ImportError:
        return lower_bound
    start_slots, start_rows = start
    limits = limits or LpLimits()
    pricing = length_pricing(values, capacity, limits)
    master = _Master(highspy, counts, length_exchanges(values))
    for pattern in plan_patterns(start_slots, start_rows, counts)[0]:
        master.add(pattern)
    try:
        slack = LP_EPS * (int(capacity) // int(values.min()))
        lower, _ = _generate_columns(master, pricing, counts, start_rows, _Work(limits), lower_bound, slack)
    except LpNotSolved:
        return lower_bound
    return max(lower, lower_bound)


def lp_pattern_pack(
    values: np.ndarray,
    counts: np.ndarray,
    capacity: int,
    start: tuple[np.ndarray, int],
    residual_packers: list[Callable],
    lower_bound: int = 0,
    limits: LpLimits | None = None,
) -> tuple[np.ndarray, int] | None:
    """A class-level packing with fewer rows than ``start`` (``(slot_rows, num_rows)``), guided by the
    pattern LP (see the module doc); None if none is found, the LP proves ``start`` optimal, or HiGHS
    (``highspy``) is not installed.

    ``residual_packers`` pack the items the rounding leaves (``packer(values, counts)`` returning
    ``(slot_rows, num_rows)`` or None; at least one must succeed). ``start``'s rows are the first
    columns, so the LP begins from the plan it has to beat. ``lower_bound`` (a known bound on the rows,
    e.g. max(L1, L2, DFF)) ends the column generation once the LP rounds up to it.
    """
    start_slots, start_rows = start
    limits = limits or LpLimits()
    out = round_pattern_lp(
        length_pricing(values, capacity, limits),
        counts,
        plan_patterns(start_slots, start_rows, counts)[0],
        start_rows,
        lambda demand: residual_patterns(values, demand, residual_packers),
        lower_bound,
        limits,
        length_exchanges(values),
    )
    return None if out is None else patterns_to_slots(*out, counts)
