"""The vector pattern LP's lower bound (``vector_patterns.vector_lp_rows_bound``): where a sample cap and the
tokens bind together it can be above every dimension's own bound, and no packing beats it."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.packing import PackConstraints, engine, pack
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.constraints import constrained_pack
from omnipack.packing.patterns import SMOOTHING, SMOOTHING_MIN_CLASSES, LpLimits
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


def test_the_bound_prices_exactly_under_a_cap_alone_and_smooths_many_classes(monkeypatch):
    """``vector_lp_rows_bound`` prices by ``_CapPricing`` under a sample cap alone, by the greedy fills and
    the MIP beside a resource budget; the exact pricing smooths its duals on as many classes as the 1-D
    LP does (``patterns.SMOOTHING_MIN_CLASSES``)."""
    import highspy

    calls = []
    exact_price = _CapPricing.price
    monkeypatch.setattr(_CapPricing, "price", lambda self, *a: calls.append(1) or exact_price(self, *a))
    lengths = _capped_mix(25)
    plan = pack(lengths, WIDTH, constraints=PackConstraints(max_samples_per_row=6), shuffle=False)
    start = (plan.row_of, plan.num_rows)
    vector_lp_rows_bound(lengths, WIDTH, PackConstraints(max_samples_per_row=6), start, 0, UNLIMITED)
    assert calls
    calls.clear()
    media = PackConstraints(max_samples_per_row=6, resources={"media": ((lengths > 400).astype(np.int64), 3)})
    vector_lp_rows_bound(lengths, WIDTH, media, start, 0, UNLIMITED)
    assert not calls
    classes = SMOOTHING_MIN_CLASSES
    many = np.column_stack([np.arange(1, classes + 1), np.ones(classes, np.int64)])
    caps = np.array([10 * classes, 4])
    assert _CapPricing(highspy, many, caps).smoothing == SMOOTHING > 0
    assert _CapPricing(highspy, many[:-1], caps).smoothing == 0


def _few_lengths(n: int, seed: int) -> np.ndarray:
    """Text of few lengths (the random sweep's mixture 151 in small): 47% spikes at 168/327/718 tokens, 31%
    short (lognormal, median 18), 22% at 2,008; ~80 distinct lengths at 1,000 samples."""
    rng = np.random.default_rng(seed)
    spikes = rng.choice([327, 718, 168], n)
    short = np.clip(np.round(rng.lognormal(np.log(18), 1.1, n)), 1, 4096)
    share = rng.random(n)
    return np.where(share < 0.47, spikes, np.where(share < 0.78, short, 2008)).astype(np.int64)


def test_few_item_vectors_get_the_vector_lp_above_300_samples(monkeypatch):
    """1,000 samples of ~80 lengths under a cap of 7 at W=4096: more samples than CONSTRAINED_LP_MAX_SAMPLES,
    but few item vectors, so the vector pattern LP runs (priced exactly) and its plan wins, within a row of
    the vector bound where the greedy fit ends 15% over. With CONSTRAINED_LP_MAX_CLASSES 0 it does not run."""
    lengths = _few_lengths(1000, 0)
    constraints = PackConstraints(max_samples_per_row=7)
    assert engine._few_vector_classes(lengths, 4096, constraints)
    row_of, num_rows, name = engine._assign_constrained(lengths, 4096, constraints, improve=True)
    bound = engine._constrained_bound(lengths, 4096, constraints)
    assert name == "lp-patterns+constraints" and num_rows <= bound + 1
    assert constrained_pack(lengths, 4096, constraints)[1] >= bound * 1.15
    assert np.bincount(row_of, minlength=num_rows).max() <= 7
    assert np.bincount(row_of, weights=lengths, minlength=num_rows).max() <= 4096
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_CLASSES", 0)
    assert not engine._few_vector_classes(lengths, 4096, constraints)
