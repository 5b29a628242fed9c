"""The swap local search under several budgets (``packing.vector_swap``): media sets whose patch budget binds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnipack.packing import engine, pack
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.constraints import PackConstraints, constrained_pack
from omnipack.packing.vector_swap import (
    _rows_to_free,
    dimension_weights,
    pooled_vector_swap,
    vector_swap_search,
)

from .test_packing import assert_constraints_hold, media_mix
from .test_packing_bounds_refill import SETTINGS

WIDTH = 16384


def _bound(lengths: np.ndarray, constraints) -> int:
    amounts, budgets = constraints.amounts_matrix(len(lengths))
    return constrained_lower_bounds(lengths, WIDTH, amounts, budgets, constraints.max_samples_per_row)["best"]


def _dims(lengths: np.ndarray, constraints) -> tuple[np.ndarray, np.ndarray]:
    return engine._constrained_dims(lengths, WIDTH, constraints)


def _assert_plan(row_of: np.ndarray, rows: int, dims: np.ndarray, caps: np.ndarray) -> None:
    """Rows numbered densely, none empty, every budget held in every row."""
    assert sorted(np.unique(row_of).tolist()) == list(range(rows))
    loads = np.zeros((rows, dims.shape[1]), dtype=np.int64)
    np.add.at(loads, row_of, dims)
    assert (loads <= caps).all()


@pytest.fixture
def greedy_only(monkeypatch):
    """``pack`` without the swap search and the vector pattern LP: the greedy constrained packers' plan."""
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 0)  # (the deep passes too)
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_SAMPLES", 0)


def test_the_swap_search_reaches_the_vector_bound_where_the_greedy_packers_stop_above_it(monkeypatch):
    """1,000 and 3,000 samples of the media mix: the greedy packers end 3-16 rows over the vector bound (no
    packing has fewer rows), the search at it, with every budget held; the same plan on a second run."""
    # the fills far over the bound off (seconds here): this is the search from the greedy starts
    monkeypatch.setattr(engine, "MORE_FILLS_MIN_GAP", 0)
    for seed, n in ((1, 1000), (3, 1000), (0, 3000)):
        lengths, constraints = media_mix(seed, n, WIDTH)
        bound = _bound(lengths, constraints)
        with monkeypatch.context() as off:
            off.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 0)
            greedy = pack(lengths, WIDTH, constraints=constraints).num_rows
        plan = pack(lengths, WIDTH, constraints=constraints, seed=3)
        assert greedy >= bound + 3 and plan.num_rows == bound, (seed, n, greedy, plan.num_rows, bound)
        assert plan.algorithm.endswith("+swap")
        assert_constraints_hold(plan, constraints)
        assert sorted(plan.members.tolist()) == list(range(n))
        again = pack(lengths, WIDTH, constraints=constraints, seed=3)
        assert np.array_equal(plan.row_of, again.row_of) and np.array_equal(plan.members, again.members)


def test_a_pool_of_the_rows_cuts_rows_and_keeps_the_others_as_they_were(greedy_only):
    """A plan larger than the pool: only pool rows change (the least filled half, the other half spread over
    the rest); every other row keeps exactly its samples."""
    lengths, constraints = media_mix(0, 3000, WIDTH)
    dims, caps = _dims(lengths, constraints)
    start = pack(lengths, WIDTH, constraints=constraints, shuffle=False)
    row_of, rows = pooled_vector_swap(
        dims, caps, start.row_of, start.num_rows, _bound(lengths, constraints), 80
    )
    assert rows < start.num_rows
    _assert_plan(row_of, rows, dims, caps)
    before = {tuple(start.row(r).tolist()) for r in range(start.num_rows)}
    after = {tuple(np.flatnonzero(row_of == r).tolist()) for r in range(rows)}
    assert len(before & after) >= start.num_rows - 80  # the rows outside the pool, untouched


def test_freed_rows_are_the_least_filled_and_one_other_that_changes_every_round():
    fills = np.array([0.9, 0.2, 0.95, 0.1, 0.5, 0.8, 0.3, 0.99])
    rounds = [_rows_to_free(fills, r) for r in range(5)]
    assert all(freed[:3] == [3, 1, 6] for freed in rounds)  # the three least filled, in order
    others = {freed[3] for freed in rounds}
    assert len(others) == 5 and others == {0, 2, 4, 5, 7}  # the fourth walks through all the others
    assert _rows_to_free(np.array([0.5, 0.1, 0.9]), 0) == [1, 0]  # a few rows: all but the fullest


def test_a_budget_nothing_uses_and_a_sample_cap_alone_pack_above_the_bound(monkeypatch):
    """A budget of 0 (every amount 0: ``validate`` allows it) is a dimension nothing uses: ``pack`` leaves it
    out (the bounds, the swap search and the vector pattern LP divided by it) and gives the plan without it.
    A sample cap with no budget: the balanced fill, which levels budgets' shares, is not tried (it failed on
    the empty shares)."""
    for seed, n, pool_rows in ((1, 1000, 2500), (0, 150, 0)):  # the swap search; the LP step (swap off)
        monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", pool_rows)
        lengths, constraints = media_mix(seed, n, WIDTH)
        unused = {**constraints.resources, "unused": (np.zeros(n, dtype=np.int64), 0)}
        with_unused = pack(lengths, WIDTH, constraints=PackConstraints(64, unused), seed=1)
        plain = pack(lengths, WIDTH, constraints=constraints, seed=1)
        assert np.array_equal(with_unused.row_of, plain.row_of) and with_unused.algorithm == plain.algorithm
        assert with_unused.algorithm.endswith("+swap" if pool_rows else "lp-patterns+constraints")
        assert_constraints_hold(with_unused, PackConstraints(64, unused))
    capped = np.random.default_rng(65).integers(1, 1025, 108)
    plan = pack(capped, 1024, constraints=PackConstraints(max_samples_per_row=4))
    assert plan.samples_per_row().max() <= 4 and np.bincount(plan.row_of, weights=capped).max() <= 1024


def test_the_scarcest_budget_weighs_and_budgets_that_bind_together_weigh_alike():
    caps = np.array([100, 100, 100])
    dims = np.array([[87, 100, 99], [0, 0, 0]])  # shares 0.87, 1.0 and 0.99 of a row
    per_row = dimension_weights(dims, caps) * caps
    assert per_row[1] == 1.0 and per_row[0] < 1e-3 and 0.5 < per_row[2] < 1.0


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(0, 30), st.integers(0, 3)), min_size=1, max_size=60),
    st.integers(2, 8),
)
def test_the_search_places_every_item_once_within_every_budget_and_never_adds_rows(raw, cap):
    dims = np.array([(t, p, a, 1) for t, p, a in raw], dtype=np.int64)
    caps = np.array([40, 30, 3, cap], dtype=np.int64)
    target = int(np.ceil(dims.sum(axis=0) / caps).max())
    one_each = np.arange(len(dims), dtype=np.int64)  # a row per item
    row_of, rows = vector_swap_search(dims, caps, one_each, len(dims), target)
    assert target <= rows <= len(dims)
    _assert_plan(row_of, rows, dims, caps)
    start = _first_fit_plan(dims, caps)  # a plan the rounds may not beat: the best one is returned
    start_rows = int(start.max()) + 1
    for row_of, rows in (
        vector_swap_search(dims, caps, start, start_rows, target),
        pooled_vector_swap(dims, caps, start, start_rows, target, 6),
        pooled_vector_swap(dims, caps, start, start_rows, target, 6, spread_shift=0.7, max_work=50_000),
    ):
        assert target <= rows <= start_rows
        _assert_plan(row_of, rows, dims, caps)


def _first_fit_plan(dims: np.ndarray, caps: np.ndarray) -> np.ndarray:
    loads: list[np.ndarray] = []
    row_of = np.empty(len(dims), dtype=np.int32)
    for i, d in enumerate(dims):
        r = next((r for r, load in enumerate(loads) if (load + d <= caps).all()), len(loads))
        if r == len(loads):
            loads.append(np.zeros_like(d))
        loads[r] += d
        row_of[i] = r
    return row_of


def test_a_plan_larger_than_the_pool_gets_pools_one_after_another(monkeypatch):
    """Above VECTOR_SWAP_POOL_ROWS rows each pass searches the rows least filled after the last one: more
    passes, fewer rows (the same plan on every run)."""
    # the fills far over the bound off (seconds here): this is the pools from the greedy start
    monkeypatch.setattr(engine, "MORE_FILLS_MIN_GAP", 0)
    lengths, constraints = media_mix(0, 3000, WIDTH)
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 40)  # of ~425 rows
    monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_BUDGET", 0)
    monkeypatch.setattr(engine, "DEEP_PASSES", 0)
    rows = {}
    for passes in (1, 2, 6):
        monkeypatch.setattr(engine, "VECTOR_SWAP_PASSES", passes)
        plan = pack(lengths, WIDTH, constraints=constraints)
        assert_constraints_hold(plan, constraints)
        rows[passes] = plan.num_rows
    assert rows[6] < rows[2] < rows[1], rows
    assert rows[6] >= _bound(lengths, constraints)


def test_smaller_pools_follow_the_large_ones_while_they_cut_rows(monkeypatch):
    """After the large pools' passes, pools of VECTOR_SWAP_SMALL_POOL_ROWS rows go on cutting rows (each
    reaches its own bound within its work limit); every budget holds, never below the bound."""
    # the fills far over the bound off (seconds here): this is the pools from the greedy start
    monkeypatch.setattr(engine, "MORE_FILLS_MIN_GAP", 0)
    lengths, constraints = media_mix(0, 3000, WIDTH)
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 40)  # of ~425 rows
    monkeypatch.setattr(engine, "VECTOR_SWAP_PASSES", 1)
    monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_POOL_ROWS", (20,))
    monkeypatch.setattr(engine, "DEEP_PASSES", 0)
    rows = {}
    for budget in (0, 3):  # whole searches' work: 3 is 6 passes at the pools' first limit
        monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_BUDGET", budget)
        plan = pack(lengths, WIDTH, constraints=constraints)
        assert_constraints_hold(plan, constraints)
        rows[budget] = plan.num_rows
    assert _bound(lengths, constraints) <= rows[3] < rows[0], rows


def test_pools_shift_their_spread_so_that_each_shift_searches_other_rows():
    """The spread half of a pool moves with ``spread_shift`` (the least filled half stays): shifts give
    pools of other rows, each plan still within every budget and never larger."""
    lengths, constraints = media_mix(0, 3000, WIDTH)
    dims, caps = _dims(lengths, constraints)
    start, start_rows = constrained_pack(lengths, WIDTH, constraints)  # the greedy start, above the bound
    searched = []
    real_search = vector_swap_search

    def recording_search(pool_dims, *args, **kwargs):
        searched.append(pool_dims.sum(axis=0).tolist())
        return real_search(pool_dims, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("omnipack.packing.vector_swap.vector_swap_search", recording_search)
        for shift in (0.0, 0.25, 0.5):
            _, rows = pooled_vector_swap(dims, caps, start, start_rows, 0, 60, spread_shift=shift)
            assert rows <= start_rows
    assert len({tuple(total) for total in searched}) == 3  # three different pools of rows


def _recorded_pools(monkeypatch) -> list[tuple[int, float, int | None, bool]]:
    """Large pools of 40 rows (of ~425), one pass, a work limit of 400,000; every ``pooled_vector_swap`` call
    the engine makes recorded as (pool rows, spread shift, work limit, cut rows). The search from the start
    by the scarcest budget (``budget_first``, whose passes would follow these) and the deep passes are off."""
    monkeypatch.setattr(engine, "BUDGET_FIRST_MAX_ROWS", 0)
    monkeypatch.setattr(engine, "DEEP_PASSES", 0)
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 40)
    monkeypatch.setattr(engine, "VECTOR_SWAP_PASSES", 1)
    monkeypatch.setattr(engine, "VECTOR_SWAP_MAX_WORK", 400_000)
    calls = []
    real_pooled = engine.pooled_vector_swap

    def recording_pooled(dims, caps, row_of, num_rows, target, pool_rows, spread_shift=0.0, max_work=None):
        out = real_pooled(dims, caps, row_of, num_rows, target, pool_rows, spread_shift, max_work)
        calls.append((pool_rows, spread_shift, max_work, out[1] < num_rows))
        return out

    monkeypatch.setattr(engine, "pooled_vector_swap", recording_pooled)
    return calls


def test_small_pools_double_their_work_after_a_pass_that_cuts_nothing(monkeypatch):
    """Small pools start at their size's share of the search's work limit, double it after a pass that cut
    nothing, stop after VECTOR_SWAP_SMALL_IDLE such passes at the full limit (or once the limits given out
    reach the budget), and shift their spread by SPREAD_STEP gaps a pass."""
    lengths, constraints = media_mix(0, 3000, WIDTH)
    monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_POOL_ROWS", (20,))
    calls = _recorded_pools(monkeypatch)
    plan = pack(lengths, WIDTH, constraints=constraints)
    assert_constraints_hold(plan, constraints)
    small = [c for c in calls if c[0] == 20]
    assert [c[1] for c in small] == [k * engine.SPREAD_STEP % 1.0 for k in range(len(small))]
    work = 400_000 * 20 // 40
    idle = 0
    for _, _, given_work, cut in small:
        assert given_work == work
        idle = 0 if cut else idle + (work == 400_000)
        work = work if cut else min(2 * work, 400_000)
    assert sum(c[2] for c in small) <= engine.VECTOR_SWAP_SMALL_BUDGET * 400_000
    stopped_idle = idle == engine.VECTOR_SWAP_SMALL_IDLE
    stopped_budget = sum(c[2] for c in small) + work > engine.VECTOR_SWAP_SMALL_BUDGET * 400_000
    assert stopped_idle or stopped_budget or plan.num_rows <= _bound(lengths, constraints)
    assert any(cut for *_, cut in small) and any(not cut for *_, cut in small)


def test_each_small_pool_size_runs_after_the_last_with_a_budget_of_its_own(monkeypatch):
    """Pools of each VECTOR_SWAP_SMALL_POOL_ROWS size in turn: the next size's passes start once the last
    size's stop, at their own size's share of the work limit and within a budget of their own, and they
    cut rows the larger pools left (never below the bound)."""
    lengths, constraints = media_mix(0, 3000, WIDTH)
    monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_BUDGET", 3)
    calls = _recorded_pools(monkeypatch)
    rows = {}
    for sizes in ((20,), (20, 10)):
        monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_POOL_ROWS", sizes)
        calls.clear()
        plan = pack(lengths, WIDTH, constraints=constraints)
        assert_constraints_hold(plan, constraints)
        rows[sizes] = plan.num_rows
    order = [c[0] for c in calls if c[0] in (20, 10)]
    assert order == sorted(order, reverse=True) and 10 in order, order  # all of 20's passes, then 10's
    for size in (20, 10):
        works = [c[2] for c in calls if c[0] == size]
        assert works[0] == 400_000 * size // 40 and sum(works) <= 3 * 400_000, works
    assert sum(c[2] for c in calls if c[0] in (20, 10)) > 3 * 400_000  # more than one budget: one each
    assert any(cut for size, *_, cut in calls if size == 10)
    assert _bound(lengths, constraints) <= rows[(20, 10)] < rows[(20,)], rows
