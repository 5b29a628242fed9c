"""The balanced fill's other levels (every budget, the binding ones) and bucketed amounts (patch counts)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnipack.packing import PackConstraints, engine, vector_fill
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.constraints import constrained_pack
from omnipack.packing.vector_fill import (
    LEVEL_ALL,
    LEVEL_BINDING,
    LEVEL_BUDGETS,
    LEVEL_CAP,
    MAX_AMOUNT_VECTORS,
    _amount_buckets,
    balanced_fill,
    fill_levels,
)

from .test_packing_bounds_refill import SETTINGS
from .test_packing_mix_balanced import _capped_text, check_constrained


def capped_media(n: int, seed: int, cap: int = 6, width: int = 8192) -> tuple[np.ndarray, PackConstraints]:
    """Text of median W/10 (lognormal, sigma 0.8) under a cap of ``cap`` a row, 0-4 media items on 40% of the
    samples with 100-3,000 patches each (32 items and 4 W patches a row: neither binds). The tokens and the
    cap bind together (~6 samples and ~W tokens a row), and the patch counts take ~n distinct amounts."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(width / 10), 0.8, n)), 1, width).astype(np.int64)
    media = np.where(rng.random(n) < 0.4, rng.integers(1, 5, n), 0)
    patches = media * rng.integers(100, 3000, n)
    resources = {"media": (media, 32), "patches": (patches, 4 * width)}
    return lengths, PackConstraints(max_samples_per_row=cap, resources=resources)


def _bound(lengths: np.ndarray, width: int, constraints: PackConstraints) -> int:
    amounts, budgets = constraints.amounts_matrix(len(lengths))
    return constrained_lower_bounds(lengths, width, amounts, budgets, constraints.max_samples_per_row)["best"]


def test_buckets_keep_few_amounts_exact_and_order_the_others():
    """Media counts (0-4) stay exact; patch counts (thousands of values) go into buckets, 0 its own and the
    buckets in the patches' order; at most MAX_AMOUNT_VECTORS keys in all."""
    _, constraints = capped_media(3000, 0)
    amounts, _ = constraints.amounts_matrix(3000)
    assert len(np.unique(amounts, axis=0)) > 10 * MAX_AMOUNT_VECTORS
    keys = _amount_buckets(amounts)
    assert 16 < len(np.unique(keys, axis=0)) <= MAX_AMOUNT_VECTORS
    assert np.array_equal(keys[:, 0], amounts[:, 0])
    assert np.array_equal(keys[:, 1] == 0, amounts[:, 1] == 0)
    order = np.argsort(amounts[:, 1], kind="stable")
    assert np.all(np.diff(keys[order, 1]) >= 0)


def test_levels_give_distinct_fills():
    """With a cap beside two budgets: levelling the budgets, the cap, every one, and the binding ones (here
    the cap alone, the same dimensions as the cap's level, so left out). Without a cap, one level."""
    lengths, constraints = capped_media(500, 0)
    assert fill_levels(lengths, 8192, constraints) == [LEVEL_BUDGETS, LEVEL_CAP, LEVEL_ALL]
    media = constraints.resources["media"][0]
    tight = PackConstraints(max_samples_per_row=21, resources={"media": (media, 2)})
    assert fill_levels(lengths, 8192, tight) == [LEVEL_BUDGETS, LEVEL_CAP, LEVEL_ALL, LEVEL_BINDING]
    uncapped = PackConstraints(resources=constraints.resources)
    assert fill_levels(lengths, 8192, uncapped) == [LEVEL_BUDGETS]


@SETTINGS
@given(
    st.integers(16, 120),
    st.lists(
        st.tuples(st.integers(1, 120), st.integers(0, 4), st.integers(0, 400)), min_size=10, max_size=80
    ),
    st.sampled_from([None, 2, 5]),
    st.sampled_from([LEVEL_BUDGETS, LEVEL_CAP, LEVEL_ALL, LEVEL_BINDING]),
)
def test_bucketed_fill_respects_every_budget(capacity, raw, cap, level):
    """10-80 patch counts of 0-479 (each its draw plus its index: nearly all distinct) against a budget of
    600, bucketed (MAX_AMOUNT_VECTORS lowered to 8): each bucket's largest amounts decide what a row takes,
    so every budget and the cap hold; the same plan twice; the exact fill where the amounts take at most 8
    vectors."""
    lengths = np.minimum(np.array([r[0] for r in raw], dtype=np.int64), capacity)
    media = np.array([r[1] for r in raw], dtype=np.int64)
    patches = np.array([r[2] for r in raw], dtype=np.int64) + np.arange(len(raw))
    resources = {"media": (media, 6), "patches": (patches, 600)}
    constraints = PackConstraints(max_samples_per_row=cap, resources=resources)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vector_fill, "MAX_AMOUNT_VECTORS", 8)
        _check_bucketed_fill(lengths, capacity, constraints, level)


def _check_bucketed_fill(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, level: str
) -> None:
    filled = balanced_fill(lengths, capacity, constraints, level, bucketed=True)
    if filled is None:  # nothing to level: LEVEL_BINDING where no budget binds as hard as the tokens
        assert level == LEVEL_BINDING
        return
    row_of, num_rows = filled
    check_constrained(row_of, num_rows, lengths, capacity, constraints)
    assert num_rows >= _bound(lengths, capacity, constraints)
    assert np.array_equal(balanced_fill(lengths, capacity, constraints, level, bucketed=True)[0], row_of)
    exact = balanced_fill(lengths, capacity, constraints, level)
    assert exact is None or np.array_equal(exact[0], row_of)


def test_a_row_spends_each_items_own_amounts(monkeypatch):
    """One bucket for every non-zero patch count (MAX_AMOUNT_VECTORS lowered to 1): a row takes an item while
    the bucket's largest amount (300) fits what is left, and what is left falls by the item's own amount.
    Ten items of 99-100 patches and one of 300 against 1,000 a row: two rows (by the largest amount alone,
    four)."""
    monkeypatch.setattr(vector_fill, "MAX_AMOUNT_VECTORS", 1)
    patches = np.array([100] * 5 + [99] * 5 + [300], dtype=np.int64)
    constraints = PackConstraints(resources={"patches": (patches, 1000)})
    row_of, num_rows = balanced_fill(np.ones(11, dtype=np.int64), 4096, constraints, bucketed=True)
    check_constrained(row_of, num_rows, np.ones(11, dtype=np.int64), 4096, constraints)
    assert num_rows == 2


def test_a_cap_beside_media_budgets_starts_at_its_bound(monkeypatch):
    """``capped_media`` at 1,000 samples: the greedy starts and the exact fill end 7% over the vector bound;
    the fills of a plan more than 2% over (the cap levelled, the patch counts bucketed) reach it. Off
    (MORE_FILLS_MIN_GAP = 0), or waiting for a plan 50% over, the start stays where it was."""
    lengths, constraints = capped_media(1000, 0)
    bound = _bound(lengths, 8192, constraints)
    fast = (*constrained_pack(lengths, 8192, constraints), "bfd+constraints")
    row_of, num_rows, name = engine._other_constrained_packers(lengths, 8192, constraints, fast, bound)
    check_constrained(row_of, num_rows, lengths, 8192, constraints)
    assert num_rows == bound and name == "balanced-fill(cap)+constraints"
    for gap in (0, 0.5):
        monkeypatch.setattr(engine, "MORE_FILLS_MIN_GAP", gap)
        start = engine._other_constrained_packers(lengths, 8192, constraints, fast, bound)
        assert start[1] >= bound * 1.05 and not start[2].startswith("balanced-fill(")


def test_plans_above_the_second_order_limit_get_the_fills_too(monkeypatch):
    """Above SECOND_ORDER_MAX samples (lowered here to 500) the one greedy start far over the bound gets the
    same fills: the capped mix at 1,000 samples starts at its bound from the fill that levels the cap."""
    lengths, constraints = capped_media(1000, 0)
    monkeypatch.setattr(engine, "SECOND_ORDER_MAX", 500)
    row_of, num_rows, name = engine._assign_constrained(lengths, 8192, constraints, improve=True)
    check_constrained(row_of, num_rows, lengths, 8192, constraints)
    assert num_rows == _bound(lengths, 8192, constraints) and name == "balanced-fill(cap)+constraints"
    monkeypatch.setattr(engine, "MORE_FILLS_MIN_GAP", 0)
    name = engine._assign_constrained(lengths, 8192, constraints, improve=True)[2]
    assert not name.startswith("balanced-fill(")


def test_seven_budgets_that_no_bucketing_keeps_at_64_groups_get_no_bucketed_fill():
    """Seven budgets of 0/1 amounts take over 64 vectors, and one bucket a budget keeps them all: no
    bucketed fill (None), and the starts of ``pack`` (``_other_constrained_packers``), far over the bound so
    that they ask for the fills, go on without them."""
    rng = np.random.default_rng(0)
    n = 300
    lengths = rng.integers(100, 1500, n)
    resources = {f"r{k}": (rng.integers(0, 2, n), 3) for k in range(7)}
    constraints = PackConstraints(max_samples_per_row=10, resources=resources)
    assert len(np.unique(constraints.amounts_matrix(n)[0], axis=0)) > 64
    for level in fill_levels(lengths, 4096, constraints):
        assert balanced_fill(lengths, 4096, constraints, level, bucketed=True) is None
    bound = _bound(lengths, 4096, constraints)
    fast = (*constrained_pack(lengths, 4096, constraints), "bfd+constraints")
    assert fast[1] > bound * 1.02
    row_of, num_rows, _ = engine._other_constrained_packers(lengths, 4096, constraints, fast, bound)
    check_constrained(row_of, num_rows, lengths, 4096, constraints)
    assert num_rows <= fast[1]


def test_large_plans_try_the_cap_levelled_fill_where_amounts_take_few_vectors(monkeypatch):
    """Above SECOND_ORDER_MAX (lowered to 1,000) the start tries the exact fill that levels the budgets only,
    so the fills far over the bound include the one that levels the cap: the capped text with one image on
    10% of the samples, 15% over from the first, at its bound from the second (every budget levelled: 12%)."""
    lengths = _capped_text(2000)
    media = (np.random.default_rng(1).random(2000) < 0.1).astype(np.int64)
    constraints = PackConstraints(max_samples_per_row=12, resources={"media": (media, 16)})
    monkeypatch.setattr(engine, "SECOND_ORDER_MAX", 1000)
    bound = _bound(lengths, 8192, constraints)
    start = engine._large_plan_start(lengths, 8192, constraints)
    assert start[1] > bound * 1.1
    row_of, num_rows, name = engine._assign_constrained(lengths, 8192, constraints, improve=True)
    check_constrained(row_of, num_rows, lengths, 8192, constraints)
    assert num_rows == bound and name == "balanced-fill(cap)+constraints"
