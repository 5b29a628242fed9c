"""The LP-guided steps (``packing.patterns``, ``packing.vector_patterns``): plans at the optimum where the
greedy steps stop above it."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from omnipack.packing import engine, lower_bounds, pack, patterns
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.constraints import constrained_bfd
from omnipack.packing.greedy import ffd_classes
from omnipack.packing.patterns import lp_pattern_pack, patterns_to_slots, plan_patterns
from omnipack.packing.vector_patterns import _VectorPricing, constrained_lp_pack

from .test_packing import assert_constraints_hold, media_mix
from .test_packing_bounds_refill import SETTINGS, capped_classes, padded


def _crops(seed: int, n: int = 1000) -> np.ndarray:
    """W=4096, 97% crops of 0.9k-2.1k tokens, 3% lognormal text: rows of 2-4 items (mixture 144's shape)."""
    rng = np.random.default_rng(seed)
    real = np.where(rng.random(n) < 0.97, rng.uniform(902, 2106, n), rng.lognormal(np.log(489), 0.94, n))
    return padded(real, 4096)


@SETTINGS
@given(st.integers(8, 300), st.lists(st.integers(1, 300), min_size=1, max_size=150))
def test_patterns_of_a_packing_rebuild_a_packing_with_the_same_rows(capacity, raw):
    _, values, counts = capped_classes(capacity, raw)
    slots, rows = ffd_classes(values, counts, capacity)
    patterns, uses = plan_patterns(slots, rows, counts)
    assert uses.sum() == rows and (patterns @ values <= capacity).all()
    rebuilt, rebuilt_rows = patterns_to_slots(patterns, uses, counts)
    assert rebuilt_rows == rows
    assert np.bincount(rebuilt, weights=np.repeat(values, counts)).max() <= capacity
    assert sorted(np.unique(rebuilt).tolist()) == list(range(rows))


def test_surplus_pattern_slots_stay_empty_and_empty_rows_are_dropped():
    counts = np.array([2, 1])  # items of lengths 5 and 3
    patterns = np.array([[1, 1], [0, 1]])  # 2 rows of (5, 3) and one of (3): 3 rows, 2 needed
    slots, rows = patterns_to_slots(patterns, np.array([2, 1]), counts)
    assert rows == 2 and slots.tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="cover class 0 2 times, it has 3"):
        patterns_to_slots(patterns, np.array([2, 1]), np.array([3, 1]))


def test_lp_step_reaches_the_optimum_where_the_greedy_steps_stop_above_it():
    pytest.importorskip("highspy")
    # Seed 0 is the pairing-scan test's set (test_packing_swap.py): the greedy steps end at 365 rows (the
    # pairing scan; 371 before it) and FFD at 381, while the Gilmore-Gomory LP bound is 359
    # (benchmarks/optimum.py: LP 358.27), so 359 rows is the optimum. max(L1, L2, DFF) is 358.
    lengths = _crops(0)
    plan = pack(lengths, 4096)
    assert plan.num_rows == 359, plan.algorithm
    assert plan.algorithm == "lp-patterns"
    assert max(lower_bounds(lengths, 4096).values()) == 358
    assert np.bincount(plan.row_of, weights=lengths).max() <= 4096
    assert sorted(plan.members.tolist()) == list(range(len(lengths)))


def test_lp_step_runs_on_large_plans(monkeypatch):
    """30,000 crops (rows of 2-4 items; the pairing scan stops at PAIR_SCAN_MAX): the step works on length
    classes, so it runs at this size in seconds. Without it (its old 20,000-sample limit) the plan is the
    greedy one, 4.4% over the simple bound, against 0.8% with it."""
    pytest.importorskip("highspy")
    lengths = _crops(0, 30_000)
    bound = max(lower_bounds(lengths, 4096).values())
    plan = pack(lengths, 4096)
    assert plan.algorithm == "lp-patterns"
    assert plan.num_rows <= 1.01 * bound
    assert np.bincount(plan.row_of, weights=lengths).max() <= 4096
    assert sorted(plan.members.tolist()) == list(range(len(lengths)))
    monkeypatch.setattr(engine, "LP_MAX_SAMPLES", 20_000)
    greedy = pack(lengths, 4096)
    assert greedy.algorithm != "lp-patterns" and greedy.num_rows > 1.04 * bound


def _wide_mix(seed: int, n: int) -> np.ndarray:
    """W=16384: 63% items of 5.2k-6.2k tokens, 31% lognormal around 2.7k, 6% short (mixture 71's shape): 852
    length classes at 6000 items, rows of 3-4 items."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    long = rng.uniform(5200, 6210, n)
    real = np.where(u < 0.63, long, np.where(u < 0.94, rng.lognormal(np.log(2727), 0.65, n), rng.uniform(100, 400, n)))
    return padded(real, 16384)


def test_lp_step_has_the_work_to_solve_many_length_classes(monkeypatch):
    """Hundreds of length classes at W=16384: each exact knapsack pricing updates millions of cells. With
    exact pricing alone and no exchange columns, the earlier budget (1.5e8 cells, 400 LP solves, 2000
    columns) stopped the LP after its first pricings and the plan stayed 5.6% over the simple bound; with
    LpLimits' budget, or with greedy pricing and the exchange columns even within the earlier one, it is
    1.8% over (the LP bound of such mixes is above the simple one: benchmarks/README.md, "Large mixtures")."""
    pytest.importorskip("highspy")
    lengths = _wide_mix(0, 6000)
    bound = max(lower_bounds(lengths, 16384).values())
    plan = pack(lengths, 16384)
    assert plan.algorithm == "lp-patterns" and plan.num_rows <= 1.02 * bound
    assert np.bincount(plan.row_of, weights=lengths).max() <= 16384
    assert sorted(plan.members.tolist()) == list(range(len(lengths)))
    earlier = patterns.LpLimits(max_columns=2000, max_knapsack_work=150_000_000, max_lp_solves=400)
    monkeypatch.setattr(patterns, "LpLimits", lambda: earlier)
    assert pack(lengths, 16384).num_rows <= 1.02 * bound
    monkeypatch.setattr(patterns, "length_exchanges", lambda values: np.zeros((0, 2), np.int64))
    monkeypatch.setattr(patterns, "greedy_patterns", lambda *args: (0.0, [], 0))
    assert pack(lengths, 16384).num_rows > 1.05 * bound


@SETTINGS
@given(st.integers(8, 300), st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(0, 2**32 - 1))
def test_greedy_pricing_bounds_the_best_pattern_and_its_patterns_fit(capacity, raw, seed):
    """The greedy pricing's value is at least the exact knapsack's best (Farley's bound stays valid), and its
    patterns fit the width, respect the counts and are worth more than one row."""
    _, values, counts = capped_classes(capacity, raw)
    # prices near a row's share (a full row worth ~1): improving patterns exist, and greedy often misses the best
    prices = np.random.default_rng(seed).uniform(0.7, 1.5, len(values)) * values / capacity
    exact, _, _ = patterns.best_patterns(values, counts, capacity, prices)
    value, greedy, _ = patterns.greedy_patterns(values, counts, capacity, prices, 4)
    assume(greedy)
    assert value >= exact - 1e-9
    for pattern in greedy:
        assert pattern @ values <= capacity and (pattern <= counts).all() and (pattern >= 0).all()
        assert prices @ pattern > 1


def _solved_lp(values: np.ndarray, counts: np.ndarray, capacity: int, exchanges: np.ndarray | None):
    highspy = pytest.importorskip("highspy")
    pricing = patterns.KnapsackPricing(values, capacity)
    master = patterns._Master(highspy, counts, exchanges)
    for pattern in plan_patterns(*ffd_classes(values, counts, capacity), counts)[0]:
        master.add(pattern)
    work = patterns._Work(patterns.LpLimits(max_knapsack_work=10**12, max_columns=10**6, max_lp_solves=10**6))
    solved = {}
    to_rows = master.pattern_rows

    def spy(values: np.ndarray) -> np.ndarray:  # the LP's own values (rows and flows), before the substitution
        solved["values"] = values.copy()
        return to_rows(values)

    master.pattern_rows = spy
    solved["bound"], rows = patterns._generate_columns(master, pricing, counts, int(counts.sum()), work)
    first = len(master.exchanges)
    return master, solved["values"][first:].sum(), rows, work.rounds, solved["values"][:first], solved["bound"]


@pytest.mark.parametrize("seed", [0, 1])
def test_exchange_columns_keep_the_lp_bound_in_fewer_solves_and_leave_whole_patterns(seed):
    """A column per pair of neighbouring lengths (a shorter item takes a longer one's slot) keeps the LP's
    bound (dual-optimal inequalities) and needs fewer LP solves; the rows it returns are over patterns only,
    each within the width, covering every class, as many as the LP's value."""
    lengths = _wide_mix(seed, 500)
    values, counts = np.unique(lengths, return_counts=True)
    values, counts = values[::-1].copy(), counts[::-1].copy()
    capacity = 16384
    scale = np.gcd.reduce([capacity, *values.tolist()])
    values, capacity = values // scale, capacity // scale
    _, plain, plain_rows, plain_solves, _, _ = _solved_lp(values, counts, capacity, None)
    exchanges = patterns.length_exchanges(values)
    master, value, rows, solves, flows, _ = _solved_lp(values, counts, capacity, exchanges)
    # the column generation stops once Farley's bound meets ceil(LP): the same bound, LP values within its gap
    assert math.ceil(value - 1e-6) == math.ceil(plain - 1e-6) and plain_rows.sum() == pytest.approx(plain, abs=1e-6)
    assert solves < plain_solves
    columns = np.array(master.columns)
    assert len(rows) == len(columns) and (rows >= -1e-9).all() and rows.sum() == pytest.approx(value, abs=1e-6)
    assert (columns @ values <= capacity).all() and (columns >= 0).all()
    assert (rows @ columns >= counts - 1e-6).all()
    assert flows.max() > 0.5  # the LP used the exchanges: the checks above are of their substitution


def test_lp_step_gives_the_same_plan_on_every_run():
    pytest.importorskip("highspy")
    lengths = _crops(0)
    first, second = pack(lengths, 4096, seed=3), pack(lengths, 4096, seed=3)
    assert first.num_rows == second.num_rows
    assert np.array_equal(first.row_of, second.row_of)
    assert np.array_equal(first.members, second.members)


def _photos_with_captions(seed: int, n: int = 300) -> np.ndarray:
    """W=4096: 80% single photos at four fixed sizes (plus a short prompt), 20% lognormal captions."""
    rng = np.random.default_rng(seed)
    is_photo = rng.random(n) < 0.8
    photos = rng.choice([1100, 1400, 1700, 2300], n) + rng.integers(10, 80, n)
    return padded(np.where(is_photo, photos, rng.lognormal(np.log(300), 0.8, n)), 4096)


def test_a_plan_the_lp_bound_proves_optimal_skips_the_later_steps(monkeypatch):
    """Seed 57: the slack-row refill leaves 112 rows against a simple bound of 111, and the pattern LP's bound
    is 112. The early bound (a small LP budget) proves that plan optimal, so the swap search, the pairing
    scan and the LP step (which could not remove a row; ~0.04 s here against ~0.007 s) never run; the plan
    is the one they would have left."""
    pytest.importorskip("highspy")
    lengths = _photos_with_captions(57)
    assert max(lower_bounds(lengths, 4096).values()) == 111
    monkeypatch.setattr(engine, "EARLY_LP_MAX_SAMPLES", 0)
    ran: list[str] = []
    for step in ("_swap_pool", "_pair_large_then_refill", "_lp_guided"):
        inner = getattr(engine, step)
        monkeypatch.setattr(engine, step, lambda *a, _inner=inner, _step=step: ran.append(_step) or _inner(*a))
    without = pack(lengths, 4096)
    assert without.num_rows == 112 and "_swap_pool" in ran  # the later steps ran, and found no row fewer
    monkeypatch.setattr(engine, "EARLY_LP_MAX_SAMPLES", 4096)
    ran.clear()
    plan = pack(lengths, 4096)
    assert ran == [] and plan.num_rows == 112 and plan.algorithm == without.algorithm
    assert np.array_equal(plan.row_of, without.row_of) and np.array_equal(plan.members, without.members)


def test_the_lp_rows_bound_is_the_lps_and_never_below_the_bound_given(monkeypatch):
    """``lp_rows_bound`` on the crops set: ceil(358.27) = 359 with the step's limits; on the early budget it
    stops before it is solved (these crops need hundreds of LP solves) and gives the simple bound, not more;
    without HiGHS, the bound it was given."""
    pytest.importorskip("highspy")
    lengths = _crops(0)
    values, counts = np.unique(lengths, return_counts=True)
    values, counts = values[::-1].copy(), counts[::-1].copy()
    start = ffd_classes(values, counts, 4096)
    simple = max(lower_bounds(lengths, 4096).values())
    assert patterns.lp_rows_bound(values, counts, 4096, start, simple) == 359
    early = patterns.lp_rows_bound(values, counts, 4096, start, simple, engine.EARLY_LP_LIMITS)
    assert early == simple == 358
    monkeypatch.setitem(sys.modules, "highspy", None)
    assert patterns.lp_rows_bound(values, counts, 4096, start, simple) == simple


@pytest.mark.parametrize("seed", [0, 1])
def test_dual_smoothing_solves_the_same_lp_in_fewer_solves(monkeypatch, seed):
    """Pricing at a mix of the LP's prices and those of the best Farley bound so far (Wentges smoothing, on
    LPs of SMOOTHING_MIN_CLASSES lengths and more; lowered here to this 500-odd-length mix) solves the same LP
    to the same value in fewer LP solves; the bound it returns is the LP's."""
    lengths = _wide_mix(seed, 2000)
    values, counts = np.unique(lengths, return_counts=True)
    values, counts = values[::-1].copy(), counts[::-1].copy()
    scale = np.gcd.reduce([16384, *values.tolist()])
    values, capacity = values // scale, 16384 // scale
    exchanges = patterns.length_exchanges(values)
    monkeypatch.setattr(patterns, "SMOOTHING_MIN_CLASSES", len(values) + 1)
    assert patterns.KnapsackPricing(values, capacity).smoothing == 0
    _, plain, _, plain_solves, _, plain_bound = _solved_lp(values, counts, capacity, exchanges)
    monkeypatch.setattr(patterns, "SMOOTHING_MIN_CLASSES", len(values))
    assert patterns.KnapsackPricing(values, capacity).smoothing == patterns.SMOOTHING > 0
    _, smoothed, rows, solves, _, bound = _solved_lp(values, counts, capacity, exchanges)
    assert smoothed == pytest.approx(plain, abs=1e-6) and rows.sum() == pytest.approx(plain, abs=1e-6)
    assert bound == plain_bound == math.ceil(plain - 1e-6)
    assert solves < plain_solves


def _highs_scheduler_of(threads: int) -> None:
    """This process's HiGHS thread scheduler, made anew with ``threads`` threads by a first solve."""
    import highspy

    highspy.Highs.resetGlobalScheduler(True)
    model = highspy._Highs()
    model.setOptionValue("output_flag", False)
    model.setOptionValue("threads", threads)
    model.addVar(0.0, 1.0)
    assert model.run() == highspy.HighsStatus.kOk


def test_the_lp_steps_run_in_a_process_whose_highs_runs_on_more_threads(monkeypatch):
    """A process that solved with HiGHS before, with more threads (HiGHS's default on a larger machine):
    HiGHS keeps that scheduler for the process, and a one-thread model fails there at once. The LP steps
    still run, to the plan a fresh process gives (before: "Not Set", the greedy plan, without a word)."""
    pytest.importorskip("highspy")
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 0)  # the swap search alone reaches the bound here
    lengths = _crops(0)
    media, constraints = media_mix(7, 60, 16384)
    fresh, fresh_media = pack(lengths, 4096), pack(media, 16384, constraints=constraints)
    _highs_scheduler_of(2)
    try:
        plan, media_plan = pack(lengths, 4096), pack(media, 16384, constraints=constraints)
    finally:
        _highs_scheduler_of(1)
    assert (plan.algorithm, plan.num_rows) == ("lp-patterns", 359)
    assert np.array_equal(plan.row_of, fresh.row_of) and np.array_equal(plan.members, fresh.members)
    assert media_plan.algorithm == "lp-patterns+constraints"
    assert np.array_equal(media_plan.row_of, fresh_media.row_of)


def test_without_highspy_the_greedy_plan_stays(monkeypatch):
    monkeypatch.setitem(sys.modules, "highspy", None)  # `import highspy` raises ImportError
    lengths = _crops(0)
    values, counts = np.unique(lengths, return_counts=True)
    values, counts = values[::-1].copy(), counts[::-1].copy()
    start = ffd_classes(values, counts, 4096)
    assert lp_pattern_pack(values, counts, 4096, start, [lambda v, c: ffd_classes(v, c, 4096)]) is None
    plan = pack(lengths, 4096)
    assert plan.algorithm != "lp-patterns" and plan.num_rows <= start[1]


# The constrained step (``packing.vector_patterns``): media sets whose patch budget binds. The swap search
# (``packing.vector_swap``), which runs before it and reaches the bound on these sets too, is off in its tests.


@pytest.fixture
def lp_step_alone(monkeypatch):
    """The steps before the vector pattern LP that reach the bound on these sets first, off: the swap search
    and the greedy start by the scarcest budget."""
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 0)
    monkeypatch.setattr(engine, "scarcest_first_pack", lambda *args: None)


def _assert_within_every_budget(plan, lengths: np.ndarray, constraints, capacity: int) -> None:
    assert np.bincount(plan.row_of, weights=lengths).max() <= capacity
    assert_constraints_hold(plan, constraints)
    assert sorted(plan.members.tolist()) == list(range(len(lengths)))


def test_vector_lp_step_reaches_the_vector_bound_where_the_greedy_packers_stop_above_it(monkeypatch, lp_step_alone):
    pytest.importorskip("highspy")
    lengths, constraints = media_mix(7, 60, 16384)
    amounts, budgets = constraints.amounts_matrix(len(lengths))
    bound = constrained_lower_bounds(lengths, 16384, amounts, budgets, 64)["best"]
    assert bound == 10  # the patch budget's own bound: no packing has fewer rows, so 10 is the optimum
    with monkeypatch.context() as without:
        without.setattr(engine, "CONSTRAINED_LP_MAX_SAMPLES", 0)
        without.setattr(engine, "CONSTRAINED_LP_MAX_CLASSES", 0)
        assert pack(lengths, 16384, constraints=constraints).num_rows == 11
    plan = pack(lengths, 16384, constraints=constraints)
    assert (plan.num_rows, plan.algorithm) == (10, "lp-patterns+constraints")
    _assert_within_every_budget(plan, lengths, constraints, 16384)


@pytest.mark.parametrize(("seed", "n"), [(1, 100), (2, 150)])
def test_vector_lp_step_gives_the_same_plan_on_every_run_within_every_budget(seed, n, lp_step_alone):
    pytest.importorskip("highspy")
    lengths, constraints = media_mix(seed, n, 16384)
    first = pack(lengths, 16384, constraints=constraints, seed=5)
    second = pack(lengths, 16384, constraints=constraints, seed=5)
    assert first.algorithm == "lp-patterns+constraints"
    assert np.array_equal(first.row_of, second.row_of) and np.array_equal(first.members, second.members)
    _assert_within_every_budget(first, lengths, constraints, 16384)


def test_vector_lp_step_without_highspy_keeps_the_greedy_plan(monkeypatch, lp_step_alone):
    lengths, constraints = media_mix(7, 60, 16384)
    start = constrained_bfd(lengths, 16384, constraints)
    monkeypatch.setitem(sys.modules, "highspy", None)
    assert constrained_lp_pack(lengths, 16384, constraints, start) is None
    plan = pack(lengths, 16384, constraints=constraints)
    assert plan.algorithm != "lp-patterns+constraints" and plan.num_rows == 11


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=7))
def test_vector_pricing_finds_the_best_pattern(raw):
    """The pricing's value caps every pattern's and it returns the best one when one beats a row (brute force)."""
    highspy = pytest.importorskip("highspy")
    vectors = np.unique(np.array(raw, dtype=np.int64), axis=0)
    caps = np.array([12, 6, 3], dtype=np.int64)
    rng = np.random.default_rng(len(raw))
    counts = rng.integers(1, 3, len(vectors))
    prices = rng.uniform(0, 1, len(vectors))
    pricing = _VectorPricing(highspy, vectors, caps)
    value, patterns, _ = pricing.price(counts, prices)
    grids = np.stack(np.meshgrid(*[np.arange(c + 1) for c in counts], indexing="ij"), -1).reshape(
        -1, len(counts)
    )
    feasible = grids[(grids @ vectors <= caps).all(axis=1)]
    best = float((feasible @ prices).max())
    assert value >= best - 1e-6
    for pattern in patterns:
        assert (pattern @ vectors <= caps).all() and (pattern <= counts).all() and pattern @ prices > 1
    if best > 1 + 1e-6:
        assert patterns


def test_a_pricing_larger_than_its_limit_is_not_started(monkeypatch):
    """2000 length classes of 10 items at W=131072: one exact knapsack pricing would update ~1e9 cells
    (seconds and ~0.5 GB of tables), more than one pricing may (``LpLimits.max_pricing_cells``). When the greedy
    fills find no improving pattern, such a pricing returns none (the column generation stops there, with
    Farley's bound from the fractional knapsack's value) instead of running; at a smaller W it runs."""
    calls = []
    exact = patterns.best_patterns
    monkeypatch.setattr(patterns, "best_patterns", lambda *a, **k: calls.append(a[2]) or exact(*a, **k))
    values = np.arange(2000, 4000, dtype=np.int64) * 16
    counts = np.full(2000, 10, dtype=np.int64)
    prices = values / 131072 * 0.9  # a full row is worth 0.9 at most: nothing improves
    pricing = patterns.KnapsackPricing(values, 131072)
    value, found, _ = pricing.price(counts, prices)
    assert found == [] and value >= 0.9 - 1e-9 and calls == []
    small = patterns.KnapsackPricing(values[:100] // 16, 4096 // 16)
    value, found, _ = small.price(counts[:100], prices[:100] * 131072 / 4096)
    assert calls == [256] and value <= 0.9 + 1e-9 and found == []


def test_many_length_classes_get_the_lp_step_only_well_above_the_bound(monkeypatch):
    """Above LP_MANY_CLASSES lengths the step costs tens of seconds at W=32768: it runs on plans more than
    LP_MANY_CLASSES_GAP over the bound, not on plans a row or two over it; with fewer lengths it runs on any plan
    above the bound; above LP_MAX_CLASSES never."""
    calls = []
    monkeypatch.setattr(engine, "lp_pattern_pack", lambda *a, **k: calls.append(len(a[0])))
    monkeypatch.setattr(engine, "LP_MANY_CLASSES", 50)
    monkeypatch.setattr(engine, "LP_MAX_CLASSES", 80)
    counts = np.full(100, 10, dtype=np.int64)
    slots = np.zeros(1000, dtype=np.int64)
    for classes in (40, 60, 100):
        values = np.arange(1, classes + 1, dtype=np.int64) * 16
        for rows in (2001, 2003):  # 0.05% and 0.15% over a bound of 2000
            engine._lp_guided(slots, rows, values, counts[:classes], 4096, 2000)
    assert calls == [40, 40, 60]
