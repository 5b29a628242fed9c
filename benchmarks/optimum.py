"""Exact bin-packing optima for small instances, with HiGHS (``highspy``): benchmarks and tests only.

Gilmore-Gomory: the LP over row patterns (how many items of each length a row holds) is solved by column
generation, pricing new patterns as the packer does (``patterns.KnapsackPricing``: greedy fills, then the exact
bounded knapsack, here at any size).
The packer runs the same LP itself on small plans above the bound (``patterns.lp_pattern_pack``); this
module keeps a clock limit and the MIP, which give a reference independent of that packer's rounding. ``ceil(LP)`` is a lower bound on the rows of any packing, and on practical
instances it equals the optimum (the integer round-up property fails only on rare, constructed
instances). An integer solution over the generated patterns (HiGHS MIP) gives an upper bound; when it
meets ``ceil(LP)`` the optimum is proven.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from omnipack.packing.patterns import KnapsackPricing, length_exchanges, run_highs


@dataclass(frozen=True)
class Optimum:
    lp_bound: int  # ceil of the Gilmore-Gomory LP: no packing has fewer rows
    best_known: int  # rows of the best packing found from the generated patterns (MIP), an upper bound
    patterns: int  # columns generated
    converged: bool  # the LP was solved (lp_bound is ceil(LP)); else Farley's bound at the time limit

    @property
    def proven(self) -> bool:
        return self.best_known == self.lp_bound

    def known(self, packer_rows: int) -> int | None:
        """The optimum when proven by the MIP or by a packer's own result meeting the LP bound."""
        if self.proven or packer_rows <= self.lp_bound:
            return self.lp_bound
        return None


def _classes(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    return values[::-1].copy(), counts[::-1].copy()


def _greedy_patterns(values: np.ndarray, counts: np.ndarray, capacity: int) -> list[np.ndarray]:
    """First-fit decreasing rows as patterns (distinct ones): a feasible start for the master LP."""
    rows: list[list[int]] = []  # per row: [space, *items per class]
    patterns = {}
    space: list[int] = []
    content: list[np.ndarray] = []
    for j, (v, c) in enumerate(zip(values.tolist(), counts.tolist(), strict=True)):
        for _ in range(c):
            for r, s in enumerate(space):
                if s >= v:
                    space[r] -= v
                    content[r][j] += 1
                    break
            else:
                space.append(capacity - v)
                row = np.zeros(len(values), dtype=np.int64)
                row[j] = 1
                content.append(row)
    del rows
    for row in content:
        patterns[row.tobytes()] = row
    return list(patterns.values())


def plan_patterns(lengths: np.ndarray, row_of: np.ndarray) -> list[np.ndarray]:
    """A packing's distinct rows as patterns over ``_classes(lengths)`` (items per length class): a start
    for the master LP of a large instance, where ``_greedy_patterns`` (first fit, item by item) is slow."""
    values, _ = _classes(lengths)
    cls = len(values) - 1 - np.searchsorted(values[::-1], np.asarray(lengths, dtype=np.int64))
    rows = np.unique(np.stack([np.asarray(row_of, dtype=np.int64), cls]), axis=1, return_counts=True)
    (row, c), n = rows
    dense = np.zeros((int(row.max()) + 1, len(values)), dtype=np.int64)
    dense[row, c] = n
    return list(np.unique(dense, axis=0))


def lp_lower_bound(
    lengths: np.ndarray,
    capacity: int,
    start: list[np.ndarray] | None = None,
    upper: int | None = None,
    lp_seconds: float = 30.0,
) -> tuple[int, bool]:
    """``ceil`` of the Gilmore-Gomory LP (or Farley's bound when stopped by ``lp_seconds`` or by reaching
    ``upper``): a lower bound on the rows of any packing, at any sample count (the LP is over length classes).
    Returns (bound, converged)."""
    _, bound, converged, _, _ = _pattern_lp(lengths, capacity, start, upper, lp_seconds)
    return bound, converged


def _pattern_lp(
    lengths: np.ndarray, capacity: int, start: list[np.ndarray] | None, upper: int | None, lp_seconds: float
) -> tuple[object, int, bool, int, list[np.ndarray]]:
    """The column generation: (HiGHS model, bound, converged, exchange columns (the model's first), pattern
    columns)."""
    import highspy

    values, counts = _classes(lengths)
    g = math.gcd(int(capacity), *values.tolist())
    values_s, cap_s = values // g, int(capacity) // g
    m = len(values)
    h = highspy.Highs()
    # One thread, as the packer's own LPs: HiGHS sizes one scheduler per process at its first solve, and a
    # model asking for another size fails at once ("Not Set"; run_highs falls back to the scheduler there is).
    for name, value in (("output_flag", False), ("threads", 1)):
        h.setOptionValue(name, value)
    inf = highspy.kHighsInf
    for d in counts.tolist():
        h.addRow(float(d), inf, 0, np.array([], dtype=np.int32), np.array([], dtype=np.float64))
    # the packer's exchange columns (``patterns._Master``): the same LP value, reached in a fifth of the
    # solves; in an integer solution an exchange is a whole item moved into a longer one's slot
    exchanges = length_exchanges(values_s)
    for big, small in exchanges.tolist():
        h.addCol(0.0, 0.0, inf, 2, np.array([big, small], dtype=np.int32), np.array([-1.0, 1.0]))
    columns: list[np.ndarray] = []

    def add(pattern: np.ndarray) -> None:
        idx = np.flatnonzero(pattern).astype(np.int32)
        h.addCol(1.0, 0.0, inf, len(idx), idx, pattern[idx].astype(np.float64))
        columns.append(pattern)

    for pattern in start if start is not None else _greedy_patterns(values_s, counts, cap_s):
        add(pattern)
    if upper is None:
        upper = int(counts.sum())
    pricing = KnapsackPricing(values_s, cap_s, max_cells=2**62)
    deadline = time.perf_counter() + lp_seconds
    farley, converged = -(-int(values_s @ counts) // cap_s), False  # L1 until an LP is solved
    while True:
        h.setOptionValue("time_limit", max(deadline - time.perf_counter(), 0.01))  # one solve can take minutes
        run_highs(h, highspy)
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kTimeLimit:
            break  # the clock: Farley's bound from the last optimal LP (L1 before one)
        if status != highspy.HighsModelStatus.kOptimal:  # a failure, not a weak bound
            raise RuntimeError(f"pattern LP: HiGHS ended with {h.modelStatusToString(status)}")
        lp = h.getInfo().objective_function_value
        duals = np.maximum(np.asarray(h.getSolution().row_dual, dtype=np.float64)[:m], 0.0)
        # the packer's pricing: greedy fills, the exact knapsack (any size here) when none beats a row; the
        # value is exact or the fractional knapsack's, either an upper bound on the best pattern's
        value, patterns, _ = pricing.price(counts, duals)
        farley = max(farley, math.ceil(lp / max(value, 1.0) - 1e-6))  # each a valid bound: the best so far
        converged = value <= 1 + 1e-9 or farley >= math.ceil(lp - 1e-6)
        if converged or farley >= upper or time.perf_counter() > deadline:
            break
        for pattern in patterns:
            add(pattern)
    return h, max(farley, 0), converged, len(exchanges), columns


def bin_packing_optimum(
    lengths: np.ndarray,
    capacity: int,
    upper: int | None = None,
    lp_seconds: float = 30.0,
    mip_seconds: float = 5.0,
) -> Optimum:
    """Gilmore-Gomory LP bound and the best integer packing over its patterns (see the module doc).

    ``upper`` (rows of a known packing) ends the column generation as soon as Farley's bound
    ``LP_restricted / best_pricing_value`` proves that packing optimal, and skips the MIP then. After
    ``lp_seconds`` the column generation stops with Farley's bound, which is still a valid lower bound.
    """
    import highspy

    if upper is None:
        upper = len(lengths)
    h, lp_bound, converged, first, columns = _pattern_lp(lengths, capacity, None, upper, lp_seconds)
    if lp_bound >= upper:
        return Optimum(lp_bound=lp_bound, best_known=upper, patterns=len(columns), converged=True)
    h.setOptionValue("time_limit", float(mip_seconds))
    total = first + len(columns)
    h.changeColsIntegrality(
        total, np.arange(total, dtype=np.int32), np.full(total, highspy.HighsVarType.kInteger)
    )
    h.run()
    solution = np.asarray(h.getSolution().col_value)[first:]
    mip_rows = int(np.round(solution).sum()) if h.getInfo().primal_solution_status == 2 else upper
    return Optimum(
        lp_bound=lp_bound, best_known=min(mip_rows, upper), patterns=len(columns), converged=converged
    )


def vector_packing_feasible(
    dims: np.ndarray, caps: np.ndarray, rows: int, seconds: float = 120.0, order_by: int = 0
) -> bool | None:
    """Whether items with amounts ``dims`` [n, D] fit ``rows`` rows of budgets ``caps`` [D]: an assignment
    MIP (HiGHS, one thread). True: a packing exists; False: proven impossible; None: undecided in time.

    Symmetry is broken by sorting the items by dimension ``order_by`` and letting the k-th item use only
    rows 0..k. Only for a few hundred items: the model has n x rows binaries.
    """
    import highspy

    n = dims.shape[0]
    order = np.argsort(-dims[:, order_by], kind="stable")
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(seconds))
    h.setOptionValue("threads", 1)
    col: dict[tuple[int, int], int] = {}
    for pos, i in enumerate(order.tolist()):
        for r in range(min(rows, pos + 1)):
            col[i, r] = len(col)
            h.addVar(0, 1)
    h.changeColsIntegrality(
        len(col), np.arange(len(col), dtype=np.int32), np.full(len(col), highspy.HighsVarType.kInteger)
    )
    for i in range(n):
        idx = np.array([col[i, r] for r in range(rows) if (i, r) in col], dtype=np.int32)
        h.addRow(1.0, 1.0, len(idx), idx, np.ones(len(idx)))
    for r in range(rows):
        items = [i for i in range(n) if (i, r) in col]
        idx = np.array([col[i, r] for i in items], dtype=np.int32)
        for d in range(dims.shape[1]):
            h.addRow(-highspy.kHighsInf, float(caps[d]), len(idx), idx, dims[items, d].astype(np.float64))
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return True
    if status == highspy.HighsModelStatus.kInfeasible:
        return False
    return None
