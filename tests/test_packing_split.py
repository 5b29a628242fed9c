"""Large plans under a sample cap alone whose start is far over the bound, and which the whole plan's steps
leave over their goal, are packed again in stratified groups (``engine._split_if_fewer``): the samples dealt
in turn by length, each group packed by every step, the merged plan's seams closed by swap passes."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.packing import PackConstraints, engine, pack
from omnipack.packing.constraints import constrained_pack

from .test_packing import assert_constraints_hold, assert_valid
from .test_packing_count_exchange import _bound, _short_text
from .test_packing_mix_balanced import image_text_media


@pytest.mark.parametrize(("n", "count"), [(10, 3), (7, 7), (1000, 6), (5, 1)])
def test_groups_deal_the_samples_in_turn_by_length(n, count):
    """Every sample in one group, each group ascending; sorted by length, the groups' k-th longest samples are
    neighbours in the whole set's order (so every group holds the set's lengths in the same proportions)."""
    lengths = np.random.default_rng(n).integers(1, 50, n) * 8
    groups = engine._dealt_by_length(lengths, count)
    assert len(groups) == count
    assert np.array_equal(np.sort(np.concatenate(groups)), np.arange(n))
    assert all(np.all(np.diff(group) > 0) for group in groups)
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    ranks = np.empty(n, dtype=np.int64)
    ranks[np.lexsort((np.arange(n), -lengths))] = np.arange(n)
    for index, group in enumerate(groups):
        assert np.array_equal(np.sort(ranks[group]), np.arange(index, n, count))


def test_the_merge_passes_close_the_groups_seams(monkeypatch):
    """Three groups of 241 equal samples under a cap of 12: each group packs into 20 full rows and one of a
    single sample; the passes over the merged plan put those three into one row (the bound), where the groups
    alone leave 63 rows."""
    monkeypatch.setattr(engine, "SPLIT_ROWS", 21)
    lengths = np.full(723, 8, dtype=np.int64)
    constraints = PackConstraints(max_samples_per_row=12)
    monkeypatch.setattr(engine, "SPLIT_MERGE_PASSES", 0)
    row_of, rows = engine._split_and_merged(lengths, 4096, constraints, 63, 61)
    assert rows == 63 and np.bincount(row_of).max() <= 12
    assert sorted(np.bincount(row_of)) == [1, 1, 1] + [12] * 60
    monkeypatch.setattr(engine, "SPLIT_MERGE_PASSES", 6)
    row_of, rows = engine._split_and_merged(lengths, 4096, constraints, 63, 61)
    assert rows == 61 and np.bincount(row_of, minlength=rows).max() <= 12


def _recorded_groups(monkeypatch) -> list[tuple[int, bool]]:
    """The (samples, improve) ``_assign_constrained`` is called with (the whole plan first, then each group)."""
    calls = []
    real = engine._assign_constrained

    def recording(lengths, capacity, constraints, improve):
        calls.append((len(lengths), improve))
        return real(lengths, capacity, constraints, improve)

    monkeypatch.setattr(engine, "_assign_constrained", recording)
    return calls


def _stalling_pools(monkeypatch) -> None:
    """Sizes at which the whole plan (~280 rows) stalls above its goal, as short text's large plans do: pools
    and the split's groups of 100 rows, one pass over pools, no small pools, deep passes for groups only."""
    for name, value in [
        ("VECTOR_SWAP_POOL_ROWS", 100),
        ("SPLIT_ROWS", 100),
        ("VECTOR_SWAP_PASSES_BISECTED", 1),
        ("VECTOR_SWAP_SMALL_POOL_ROWS", ()),
        ("DEEP_MAX_ROWS", 100),
    ]:
        monkeypatch.setattr(engine, name, value)


def test_a_large_plan_its_steps_leave_over_the_goal_is_packed_again_in_groups(monkeypatch):
    """Short text under a cap of 12 (the balanced fill's start 2-3% over): where the whole plan's steps leave
    the ~280-row plan over ``deep_goal``, it is packed again in three groups of 1,000 samples, each by every
    step (``improve``) and not split again, to the bound; every sample placed once, the cap and widths held,
    deterministic."""
    # the vector LP on these few lengths off (~5 s): this is the groups' search
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_CLASSES", 0)
    _stalling_pools(monkeypatch)
    lengths, constraints = _short_text(3, 3000, 4096), PackConstraints(max_samples_per_row=12)
    bound = _bound(lengths, 4096, 12)
    monkeypatch.setattr(engine, "SPLIT_ROWS", 0)
    whole = pack(lengths, 4096, constraints=constraints)
    assert whole.num_rows > engine.deep_goal(bound)
    monkeypatch.setattr(engine, "SPLIT_ROWS", 100)
    calls = _recorded_groups(monkeypatch)
    plan = pack(lengths, 4096, constraints=constraints)
    assert calls == [(3000, True), (1000, True), (1000, True), (1000, True)]
    assert plan.algorithm == "balanced-fill+constraints+split" and plan.num_rows == bound
    assert_valid(plan, lengths, 4096)
    assert_constraints_hold(plan, constraints)
    again = pack(lengths, 4096, constraints=constraints)
    assert np.array_equal(again.row_of, plan.row_of)


def test_a_plan_its_steps_take_within_the_goal_is_not_split(monkeypatch):
    """The same plan where the pools do not stall (the default passes): the whole plan's steps reach the
    goal, so it is never packed in groups (on other capped text those reach the bound where the groups end a
    few rows over)."""
    for name in ("VECTOR_SWAP_POOL_ROWS", "SPLIT_ROWS"):
        monkeypatch.setattr(engine, name, 100)
    lengths, constraints = _short_text(3, 3000, 4096), PackConstraints(max_samples_per_row=12)
    calls = _recorded_groups(monkeypatch)
    plan = pack(lengths, 4096, constraints=constraints)
    assert calls == [(3000, True)] and "+split" not in plan.algorithm
    assert plan.num_rows <= engine.deep_goal(_bound(lengths, 4096, 12))


@pytest.mark.parametrize(
    "case",
    ["short text", "split off", "swap search off", "start near the bound", "media budgets", "few samples a row"],
)
def test_the_split_needs_a_large_cap_only_plan_far_over_its_bound(monkeypatch, case):
    """From the fast best fit's start (each case over 100 rows and more than 1% over its bound): the split
    needs a sample cap alone, rows of at least BISECTED_MIN_SAMPLES_PER_ROW samples, a start more than
    SPLIT_MIN_GAP over the bound and more rows than SPLIT_ROWS; SPLIT_ROWS = 0 turns it off, and so does the
    swap search off (VECTOR_SWAP_POOL_ROWS = 0: the groups would not be searched)."""
    for name in ("VECTOR_SWAP_POOL_ROWS", "SPLIT_ROWS"):
        monkeypatch.setattr(engine, name, 100)
    lengths, constraints = _short_text(3, 3000, 4096), PackConstraints(max_samples_per_row=12)
    if case == "split off":
        monkeypatch.setattr(engine, "SPLIT_ROWS", 0)
    elif case == "swap search off":
        monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 0)
    elif case == "start near the bound":
        monkeypatch.setattr(engine, "SPLIT_MIN_GAP", 0.5)
    elif case == "media budgets":
        lengths, media = image_text_media(0, 1200, 4096)
        constraints = PackConstraints(max_samples_per_row=12, resources={"media": (media, 10)})
    elif case == "few samples a row":  # ~2.5 a row
        lengths = np.random.default_rng(0).integers(1200, 2000, 600) // 8 * 8
        constraints = PackConstraints(max_samples_per_row=64)
    bound = engine._constrained_bound(lengths, 4096, constraints)
    rows = constrained_pack(lengths, 4096, constraints)[1]
    assert rows > max(100, bound * 1.01)
    assert engine._split_pays(lengths, 4096, constraints, rows, bound) == (case == "short text")


def test_media_plans_are_not_split(monkeypatch):
    for name in ("VECTOR_SWAP_POOL_ROWS", "SPLIT_ROWS"):
        monkeypatch.setattr(engine, name, 100)
    lengths, media = image_text_media(0, 1200, 4096)
    constraints = PackConstraints(max_samples_per_row=12, resources={"media": (media, 10)})
    calls = _recorded_groups(monkeypatch)
    plan = pack(lengths, 4096, constraints=constraints)
    assert calls == [(len(lengths), True)] and "+split" not in plan.algorithm
    assert_constraints_hold(plan, constraints)


def test_a_split_with_no_fewer_rows_than_the_plan_is_not_kept(monkeypatch):
    """Where the merged groups have as many rows as the whole plan's steps left, that plan is kept, sample by
    sample (a tie goes to the earlier plan)."""
    # the vector LP on these few lengths off (~3 s): this is the groups' search
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_CLASSES", 0)
    _stalling_pools(monkeypatch)
    lengths, constraints = _short_text(3, 3000, 4096), PackConstraints(max_samples_per_row=12)
    monkeypatch.setattr(engine, "SPLIT_ROWS", 0)
    whole = pack(lengths, 4096, constraints=constraints)
    monkeypatch.setattr(engine, "SPLIT_ROWS", 100)
    tie = (np.zeros(len(lengths), dtype=np.int32), whole.num_rows)  # not a plan: kept, it would show
    monkeypatch.setattr(engine, "_split_and_merged", lambda *args: tie)
    plan = pack(lengths, 4096, constraints=constraints)
    assert plan.algorithm == whole.algorithm and "+split" not in plan.algorithm
    assert np.array_equal(plan.row_of, whole.row_of)
