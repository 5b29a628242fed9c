"""The vector pattern LP's lower bound (``vector_patterns.vector_lp_rows_bound``): where a sample cap and the
tokens bind together it can be above every dimension's own bound, and no packing beats it."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.packing import PackConstraints, pack
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.patterns import LpLimits
from omnipack.packing.vector_patterns import _CapPricing, _VectorPricing, vector_lp_rows_bound

pytest.importorskip("highspy")

WIDTH = 1000
UNLIMITED = LpLimits(max_columns=10**5, max_knapsack_work=10**13, max_lp_solves=5000, max_rounds=5000)


def _capped_mix(seed: int, n: int = 40) -> np.ndarray:
    """A quarter of the items just under or over half a row, the rest short (lognormal, median 15): a cap of
    6 leaves the rows of two long items little room for four more, which each dimension's bound misses."""
    rng = np.random.default_rng(seed)
    short = np.clip(np.round(rng.lognormal(np.log(15), 1.09, n)), 1, WIDTH).astype(np.int64)
    long = rng.integers(452, 601, n)
    return np.where(rng.random(n) < 0.25, long, short)


def _vector_bound(lengths: np.ndarray, cap: int) -> int:
    n = len(lengths)
    no_amounts, no_budgets = np.zeros((n, 0), np.int64), np.zeros(0, np.int64)
    return constrained_lower_bounds(lengths, WIDTH, no_amounts, no_budgets, cap)["best"]


def test_the_lp_bound_is_above_each_dimensions_bound_and_no_plan_beats_it():
    lengths = _capped_mix(25)
    constraints = PackConstraints(max_samples_per_row=6)
    plan = pack(lengths, WIDTH, constraints=constraints, shuffle=False)
    bound = _vector_bound(lengths, 6)
    lp = vector_lp_rows_bound(lengths, WIDTH, constraints, (plan.row_of, plan.num_rows), 0, UNLIMITED)
    assert lp > bound  # 8 against 7: the plan's 8 rows are optimal, which the vector bound cannot show
    assert lp == plan.num_rows


@pytest.mark.parametrize("seed", range(6))
def test_the_lp_bound_never_exceeds_a_plan_and_never_falls_below_the_bound_given(seed):
    lengths = _capped_mix(100 + seed, n=60)
    for constraints in (
        PackConstraints(max_samples_per_row=6),
        PackConstraints(
            max_samples_per_row=8,
            resources={"media": ((lengths > 400).astype(np.int64) * 2, 3)},  # one long item a row, by media
        ),
    ):
        plan = pack(lengths, WIDTH, constraints=constraints, shuffle=False)
        start = (plan.row_of, plan.num_rows)
        lp = vector_lp_rows_bound(lengths, WIDTH, constraints, start, 0, UNLIMITED)
        assert lp <= plan.num_rows
        # a floor above what the LP proves is returned as it is: the caller's own bound
        assert vector_lp_rows_bound(lengths, WIDTH, constraints, start, lp + 3, UNLIMITED) == lp + 3


def test_a_spent_work_limit_gives_a_bound_no_packing_beats_even_from_a_poor_start():
    """From a start of one sample a row (the restricted LP's value far above the optimum) and limits that stop
    the column generation at once, the bound is Farley's, not the restricted LP's value."""
    lengths = _capped_mix(25)
    constraints = PackConstraints(max_samples_per_row=6)
    optimum = pack(lengths, WIDTH, constraints=constraints, shuffle=False).num_rows  # 8: the LP bound's count
    one_a_row = (np.arange(len(lengths), dtype=np.int32), len(lengths))
    for limits in (
        LpLimits(max_columns=1, max_knapsack_work=10**13, max_lp_solves=1, max_rounds=1, min_columns=0),
        LpLimits(max_columns=3, max_knapsack_work=10**13, max_lp_solves=2, max_rounds=2, min_columns=0),
        UNLIMITED,
    ):
        assert vector_lp_rows_bound(lengths, WIDTH, constraints, one_a_row, 0, limits) <= optimum
    assert vector_lp_rows_bound(lengths, WIDTH, constraints, one_a_row, 0, UNLIMITED) == optimum


def test_a_budget_nothing_uses_is_left_out():
    """A budget of 0 with every amount 0 (``PackConstraints.validate`` lets it through) bounds nothing."""
    lengths = _capped_mix(25)
    unused = {"media": (np.zeros(len(lengths), np.int64), 0)}
    constraints = PackConstraints(6, unused)
    plan = pack(lengths, WIDTH, constraints=constraints, shuffle=False)
    bound = vector_lp_rows_bound(lengths, WIDTH, constraints, (plan.row_of, plan.num_rows), 0, UNLIMITED)
    assert bound == 8 == plan.num_rows


def _mip_pricing(vectors: np.ndarray, caps: np.ndarray) -> _VectorPricing:
    """The MIP pricing solved to the end (no node limit, no gap): the oracle of the exact one."""
    import highspy

    pricing = _VectorPricing(highspy, vectors, caps)
    pricing.model.setOptionValue("mip_max_nodes", 10**7)
    pricing.model.setOptionValue("mip_rel_gap", 0.0)
    return pricing


@pytest.mark.parametrize("seed", range(4))
def test_the_exact_pricing_under_a_cap_is_the_knapsacks_optimum(seed):
    """Under a sample cap alone the LP bound prices by dynamic programming (``_CapPricing``): on 30 random
    knapsacks (up to 24 lengths, caps 1-8, 1-5 copies each) its value is the MIP's optimum, and its patterns
    hold the row (tokens and cap) and the copies, the first worth that value."""
    import highspy

    rng = np.random.default_rng(seed)
    for _ in range(30):
        width, cap = int(rng.integers(20, 300)), int(rng.integers(1, 9))
        lengths = np.unique(rng.integers(1, width + 1, int(rng.integers(1, 25)))) * int(rng.integers(1, 4))
        vectors = np.column_stack([lengths, np.ones(len(lengths), np.int64)])
        caps = np.array([width, cap])
        prices = rng.random(len(lengths)) * lengths / width * 1.5
        demand = rng.integers(1, 6, len(lengths))
        value, patterns, _ = _CapPricing(highspy, vectors, caps).price(demand, prices)
        oracle = _mip_pricing(vectors, caps)
        expected, _, _ = oracle._mip(np.minimum(demand, oracle.fit), prices)
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)
        for pattern in patterns:
            assert (pattern <= demand).all() and pattern @ lengths <= width and pattern.sum() <= cap
            assert pattern @ prices > 1
        assert (value > 1 + 1e-9) == bool(patterns)
        if patterns:
            assert patterns[0] @ prices == pytest.approx(value)


def test_the_cap_pricing_hands_a_table_too_large_to_the_mip():
    """Past ``max_cells`` the exact pricing is not built: the greedy fills and the MIP price, as elsewhere
    (their value here the fractional bound, above the exact optimum)."""
    import highspy

    lengths = np.arange(1, 31) * 7
    vectors = np.column_stack([lengths, np.ones(30, np.int64)])
    caps, demand, prices = np.array([400, 5]), np.full(30, 3), lengths / 300
    exact = _CapPricing(highspy, vectors, caps).price(demand, prices)
    handed = _CapPricing(highspy, vectors, caps, max_cells=10).price(demand, prices)
    plain = _VectorPricing(highspy, vectors, caps).price(demand, prices)
    assert handed[0] == plain[0] and [p.tolist() for p in handed[1]] == [p.tolist() for p in plain[1]]
    assert handed[0] > exact[0] + 1e-6
