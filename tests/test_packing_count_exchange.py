"""The swap search's exchange by bisection for plans under a sample cap alone (``vector_swap``: tokens and a
count per item): it picks the exchange the full comparison of every removal with every offer picks, ties
included, and gives the same plans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from omnipack.packing import PackConstraints, engine, pack, vector_swap
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.constraints import constrained_pack
from omnipack.packing.vector_swap import (
    _best_count_exchange,
    _offers,
    _offers_by_count,
    _removals,
    _tokens_and_count_only,
)

from .test_packing import assert_constraints_hold
from .test_packing_bounds_refill import SETTINGS
from .test_packing_mix_balanced import image_text_media


def _full_comparison(out_sums, sums, sum_values, weights, room) -> tuple[int, int, float]:
    """Every removal against every offer, as the search compares them for other budgets."""
    fits = np.all(sums[None, :, :] - out_sums[:, None, :] <= room, axis=2)
    gain = np.where(fits, sum_values[None, :] - (out_sums @ weights)[:, None], -1.0)
    o, s = divmod(int(np.argmax(gain)), gain.shape[1])
    return o, s, float(gain[o, s])


@SETTINGS
@given(
    row=st.lists(st.sampled_from([8, 16, 24, 40, 64, 200]), min_size=1, max_size=12),
    free=st.lists(st.sampled_from([8, 16, 24, 40, 64, 200, 512]), min_size=1, max_size=14),
    cap=st.integers(1, 16),
    width=st.sampled_from([256, 512, 1024]),
    other_share=st.sampled_from([1.0, 0.97, 0.9, 0.8]),
    tokens_bind=st.booleans(),
)
# A single item and a pair of equal gain (40/256 + 1/16 = 24/256 + 2/16): the single, offered first, is taken.
@example(row=[216], free=[40, 8, 16], cap=16, width=256, other_share=1.0, tokens_bind=True)
def test_bisection_picks_the_exchange_the_full_comparison_picks(
    row, free, cap, width, other_share, tokens_bind
):
    """Few distinct lengths, so that many offers tie; the row at or over its room in either dimension; the
    weights of a plan where the tokens or the count binds, the other at ``other_share`` of it."""
    dims = np.array([[t, 1] for t in [*row, *free]], dtype=np.int64)
    caps = np.array([width, cap], dtype=np.int64)
    shares = np.array([1.0, other_share] if tokens_bind else [other_share, 1.0])
    weights = shares**vector_swap.SCARCITY_POWER / caps
    assert _tokens_and_count_only(dims, caps, weights)
    room = caps - dims[: len(row)].sum(axis=0)
    free_ids = list(range(len(row), len(dims)))
    sets, sums = _offers(dims, free_ids)
    sum_values = sums @ weights
    outs, out_sums = _removals(dims[: len(row)], len(row))
    expected = _full_comparison(out_sums, sums, sum_values, weights, room)
    got = _best_count_exchange(out_sums, out_sums @ weights, _offers_by_count(sums), room, sum_values)
    if expected[2] <= 1e-12:  # no exchange taken: only that matters
        assert got[2] <= 1e-12
    else:
        assert got == expected


def test_other_budgets_or_negligible_token_weights_take_the_full_comparison():
    dims = np.array([[100, 1], [200, 1]], dtype=np.int64)
    caps = np.array([1000, 4], dtype=np.int64)
    assert _tokens_and_count_only(dims, caps, np.array([1e-3, 0.25]))
    assert not _tokens_and_count_only(dims, caps, np.array([1e-20, 0.25]))  # gains would round together
    media = np.array([[100, 2, 1], [200, 0, 1]], dtype=np.int64)
    assert not _tokens_and_count_only(media, np.array([1000, 4, 4]), np.array([1e-3, 0.1, 0.25]))


@pytest.mark.parametrize(
    ("n", "width", "cap", "median", "sigma"), [(1000, 4096, 12, 150, 1.4), (1000, 4096, 10, 300, 0.8)]
)
def test_the_searches_are_the_full_comparisons(monkeypatch, n, width, cap, median, sigma):
    """Text under a sample cap where the tokens bind harder than the cap, and where the cap binds harder: the
    same rounds of the search from the fast best fit's plan give the same plan, sample by sample, with the
    full comparison in place of the bisection (the work limit, which counts them differently, out of reach)."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(median), sigma, n)), 1, width).astype(np.int64)
    lengths = np.minimum(-(-lengths // 8) * 8, width)
    constraints = PackConstraints(max_samples_per_row=cap)
    dims, caps = engine._constrained_dims(lengths, width, constraints)
    row_of, rows = constrained_pack(lengths, width, constraints)  # the fast best fit: rows to cut
    calls = []
    monkeypatch.setattr(
        vector_swap, "_best_count_exchange", _recorded(calls, vector_swap._best_count_exchange)
    )
    search = (dims, caps, row_of, rows, 0)
    bisected = vector_swap.vector_swap_search(*search, max_rounds=10, max_work=10**15)
    assert calls and bisected[1] < rows
    monkeypatch.setattr(vector_swap, "_tokens_and_count_only", lambda *_: False)
    calls.clear()
    full = vector_swap.vector_swap_search(*search, max_rounds=10, max_work=10**15)
    assert not calls
    assert full[1] == bisected[1] and np.array_equal(full[0], bisected[0])


def _recorded(calls: list, fn):
    def wrapper(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return wrapper


def _short_text(seed: int, n: int, width: int) -> np.ndarray:
    """benchmarks/bench_packing_mixes.short_text, padded to 8: lognormal, median 150, sigma 1.4."""
    lengths = np.random.default_rng(seed).lognormal(np.log(150), 1.4, n)
    return np.minimum(-(-np.clip(np.round(lengths), 1, width).astype(np.int64) // 8) * 8, width)


def _bound(lengths: np.ndarray, width: int, cap: int) -> int:
    no_budgets = (np.zeros((len(lengths), 0), np.int64), np.zeros(0, np.int64))
    return constrained_lower_bounds(lengths, width, *no_budgets, cap)["best"]


def test_rows_of_more_than_sixteen_samples_give_up_items(monkeypatch):
    """Under a cap of 24 a row (~21 samples a row here) the bisection lets rows of up to 64 items give up
    items; with the full comparison's limit of 16 they only take free items and the plan ends 2 rows over."""
    # the vector LP on these few lengths off (~7 s): this is the search alone
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_CLASSES", 0)
    lengths, constraints = _short_text(0, 2000, 8192), PackConstraints(max_samples_per_row=24)
    bound = _bound(lengths, 8192, 24)
    plan = pack(lengths, 8192, constraints=constraints)
    assert plan.num_rows == bound
    assert_constraints_hold(plan, constraints)
    monkeypatch.setattr(vector_swap, "MAX_BISECTED_ROW_ITEMS", vector_swap.MAX_ROW_ITEMS)
    assert pack(lengths, 8192, constraints=constraints).num_rows == bound + 2


def test_a_bisected_row_costs_its_bisections_not_a_check_per_offer(monkeypatch):
    """The work limit counts what a row's exchange costs: within the same limit (cut to 1/10, the one search
    alone) the search walks more rows than with every exchange checked in full (charged a check per removal
    and offer) and this plan reaches its bound, two rows fewer."""
    monkeypatch.setattr(vector_swap, "MAX_WORK", 15_000_000)
    monkeypatch.setattr(engine, "DEEP_PASSES", 0)
    monkeypatch.setattr(engine, "BUDGET_FIRST_MAX_ROWS", 0)
    lengths, constraints = _short_text(0, 2500, 4096), PackConstraints(max_samples_per_row=12)
    bound = _bound(lengths, 4096, 12)
    assert pack(lengths, 4096, constraints=constraints).num_rows == bound
    monkeypatch.setattr(vector_swap, "_tokens_and_count_only", lambda *_: False)
    assert pack(lengths, 4096, constraints=constraints).num_rows == bound + 2


def test_pools_under_a_sample_cap_alone_get_more_passes(monkeypatch):
    """A plan larger than a pool gets pool after pool while they cut rows: under a sample cap alone up to
    VECTOR_SWAP_PASSES_BISECTED (here 8; the pools cut down to 150 rows of ~470), not VECTOR_SWAP_PASSES
    (here 2); the passes stop after one that cut nothing."""
    calls = []
    real = engine.pooled_vector_swap

    def recording(dims, caps, row_of, num_rows, target, pool_rows, *rest):
        out = real(dims, caps, row_of, num_rows, target, pool_rows, *rest)
        calls.append((pool_rows, num_rows, out[1]))
        return out

    monkeypatch.setattr(engine, "pooled_vector_swap", recording)
    for name, value in [
        ("VECTOR_SWAP_POOL_ROWS", 150),
        ("VECTOR_SWAP_PASSES", 2),
        ("VECTOR_SWAP_PASSES_BISECTED", 8),
    ]:
        monkeypatch.setattr(engine, name, value)
    monkeypatch.setattr(engine, "DEEP_PASSES", 0)
    monkeypatch.setattr(engine, "BUDGET_FIRST_MAX_ROWS", 0)
    monkeypatch.setattr(engine, "VECTOR_SWAP_SMALL_POOL_ROWS", ())
    monkeypatch.setattr(vector_swap, "MAX_WORK", 20_000_000)
    lengths, constraints = _short_text(0, 5000, 4096), PackConstraints(max_samples_per_row=12)
    plan = pack(lengths, 4096, constraints=constraints)
    large = [(before, after) for pool, before, after in calls if pool == 150]
    assert 2 < len(large) < 8
    assert all(after < before for before, after in large[:-1]) and large[-1][0] == large[-1][1]
    assert plan.num_rows == large[-1][1]
    assert_constraints_hold(plan, constraints)


def test_media_plans_and_rows_of_few_samples_take_the_full_comparison(monkeypatch):
    """Plans with resource budgets never bisect (their plans stay the previous code's); under a sample cap
    alone, rows of ~3 samples (7 removals against ~80 offers, under BISECT_MIN_CHECKS) take the full
    comparison too, and such plans get neither the 30 large-pool passes nor the deep passes above
    DEEP_MAX_SAMPLES (``engine._bisected_plan``)."""

    def never(*args):
        raise AssertionError("bisected")

    monkeypatch.setattr(vector_swap, "_best_count_exchange", never)
    lengths, media = image_text_media(0, 600, 8192)
    constraints = PackConstraints(resources={"media": (media, 10)})
    assert_constraints_hold(pack(lengths, 8192, constraints=constraints), constraints)
    lengths = np.random.default_rng(0).integers(1800, 3200, 600) // 8 * 8
    constraints = PackConstraints(max_samples_per_row=64)
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_CLASSES", 0)  # 175 lengths: the LP would end it
    plan = pack(lengths, 8192, constraints=constraints)
    assert "+swap" in plan.algorithm and plan.row_ptr[-1] == 600
    dims, caps = engine._constrained_dims(lengths, 8192, constraints)
    assert vector_swap.bisected_exchanges(dims, caps)
    assert engine._bisected_plan(dims, caps, 600 // engine.BISECTED_MIN_SAMPLES_PER_ROW)
    assert not engine._bisected_plan(dims, caps, 600 // engine.BISECTED_MIN_SAMPLES_PER_ROW + 1)
