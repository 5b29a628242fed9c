"""Tests for omnipack.packing: validity, optimality references, determinism, constraints, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omnipack.packing import PackConstraints, PackPlan, lower_bounds, pack, packing_stats
from omnipack.packing.balance import attention_cost, coefficient_of_variation
from omnipack.packing.constraints import constrained_bfd, constrained_pack
from omnipack.packing.engine import _assign_by_classes

SETTINGS = settings(max_examples=60, deadline=None)


# --- slow, obviously-correct references -------------------------------------------------------------


def reference_fit_decreasing(lengths: np.ndarray, capacity: int, best: bool) -> list[list[int]]:
    """Item-by-item BFD (least remaining space) or FFD (lowest row); items by length desc, index asc."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    space: list[int] = []
    for i in order:
        v = int(lengths[i])
        fits = [r for r in range(len(rows)) if space[r] >= v]
        if not fits:
            rows.append([i])
            space.append(capacity - v)
            continue
        r = min(fits, key=lambda r: (space[r], r)) if best else fits[0]
        rows[r].append(i)
        space[r] -= v
    return rows


def row_fills(rows: list[list[int]], lengths: np.ndarray) -> list[int]:
    """Sorted row fills: BFD ties (rows with equal space) change contents but never this multiset."""
    return sorted(int(lengths[row].sum()) for row in rows)


def plan_rows(plan: PackPlan) -> list[list[int]]:
    return [plan.row(r).tolist() for r in range(plan.num_rows)]


def assert_valid(plan: PackPlan, lengths: np.ndarray, capacity: int) -> None:
    n = len(lengths)
    assert plan.members.dtype == np.int32 and plan.row_of.dtype == np.int32
    assert plan.row_ptr[0] == 0 and plan.row_ptr[-1] == n
    assert np.all(np.diff(plan.row_ptr) >= 1)  # no empty rows
    assert np.array_equal(np.sort(plan.members), np.arange(n))  # every sample exactly once
    for r in range(plan.num_rows):
        row = plan.row(r)
        assert np.all(np.diff(row) > 0)  # ascending sample index
        assert np.all(plan.row_of[row] == r)
        assert int(lengths[row].sum()) == plan.row_fill[r] <= capacity


lengths_and_capacity = st.integers(1, 64).flatmap(
    lambda cap: st.tuples(
        st.lists(st.integers(1, cap), min_size=1, max_size=60).map(lambda x: np.array(x, dtype=np.int64)),
        st.just(cap),
    )
)


# --- properties --------------------------------------------------------------------------------------


@SETTINGS
@given(lengths_and_capacity, st.sampled_from(["bfd", "ffd"]), st.booleans(), st.integers(0, 3))
def test_every_sample_placed_once_and_rows_fit(case, algorithm, balance, seed):
    lengths, capacity = case
    plan = pack(lengths, capacity, algorithm=algorithm, balance=balance, seed=seed)
    assert_valid(plan, lengths, capacity)
    bounds = lower_bounds(lengths, capacity)
    assert plan.num_rows >= bounds["l2"] >= bounds["l1"] == -(-int(lengths.sum()) // capacity)


@SETTINGS
@given(lengths_and_capacity, st.sampled_from(["bfd", "ffd"]))
def test_counting_algorithms_match_item_by_item_reference(case, algorithm):
    lengths, capacity = case
    row_of, num_rows = _assign_by_classes(lengths, capacity, algorithm)
    rows = [np.flatnonzero(row_of == r).tolist() for r in range(num_rows)]
    reference = reference_fit_decreasing(lengths, capacity, best=algorithm == "bfd")
    assert num_rows == len(reference)
    assert row_fills(rows, lengths) == row_fills(reference, lengths)
    if algorithm == "ffd":
        # FFD has no ties: row ids and memberships must match exactly.
        assert sorted(map(sorted, rows)) == sorted(map(sorted, reference))


@SETTINGS
@given(lengths_and_capacity)
def test_bfd_never_worse_than_ffd(case):
    lengths, capacity = case
    ffd = pack(lengths, capacity, algorithm="ffd")
    assert pack(lengths, capacity, algorithm="bfd").num_rows <= ffd.num_rows


@SETTINGS
@given(lengths_and_capacity, st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_deterministic_and_seed_only_reorders_rows(case, seed_a, seed_b):
    lengths, capacity = case
    a1 = pack(lengths, capacity, seed=seed_a)
    a2 = pack(lengths, capacity, seed=seed_a)
    for name in ("row_ptr", "members", "row_of", "row_fill"):
        assert getattr(a1, name).tobytes() == getattr(a2, name).tobytes()
    b = pack(lengths, capacity, seed=seed_b)
    unshuffled = pack(lengths, capacity, shuffle=False)
    as_sets = lambda p: sorted(map(tuple, plan_rows(p)))  # noqa: E731
    assert as_sets(a1) == as_sets(b) == as_sets(unshuffled)


@SETTINGS
@given(lengths_and_capacity, st.integers(1, 20), st.booleans())
def test_window_rows_never_span_windows(case, window, balance):
    lengths, capacity = case
    plan = pack(lengths, capacity, window=window, balance=balance)
    assert_valid(plan, lengths, capacity)
    window_of = np.arange(len(lengths)) // window
    for r in range(plan.num_rows):
        assert len(set(window_of[plan.row(r)].tolist())) == 1


@st.composite
def constrained_cases(draw):
    capacity = draw(st.integers(4, 64))
    n = draw(st.integers(1, 50))
    lengths = np.array(draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n)), dtype=np.int64)
    max_samples = draw(st.none() | st.integers(1, 6))
    media_budget = draw(st.integers(1, 5))
    media = np.array(draw(st.lists(st.integers(0, media_budget), min_size=n, max_size=n)), dtype=np.int64)
    patch_budget = draw(st.integers(10, 100))
    patches = np.array(draw(st.lists(st.integers(0, patch_budget), min_size=n, max_size=n)), dtype=np.int32)
    constraints = PackConstraints(
        max_samples_per_row=max_samples,
        resources={"media": (media, media_budget), "patches": (patches, patch_budget)},
    )
    return lengths, capacity, constraints


@SETTINGS
@given(constrained_cases(), st.booleans(), st.sampled_from([None, 7]))
def test_constraints_respected_exactly(case, balance, window):
    lengths, capacity, constraints = case
    plan = pack(lengths, capacity, constraints=constraints, balance=balance, window=window)
    assert_valid(plan, lengths, capacity)
    if constraints.max_samples_per_row is not None:
        assert plan.samples_per_row().max() <= constraints.max_samples_per_row
    for amounts, budget in constraints.resources.values():
        per_row = np.bincount(plan.row_of, weights=amounts, minlength=plan.num_rows)
        assert per_row.max() <= budget


def assert_constraints_hold(plan: PackPlan, constraints: PackConstraints) -> None:
    if constraints.max_samples_per_row is not None:
        assert plan.samples_per_row().max() <= constraints.max_samples_per_row
    for amounts, budget in constraints.resources.values():
        per_row = np.bincount(plan.row_of, weights=amounts, minlength=plan.num_rows)
        assert per_row.max() <= budget


@SETTINGS
@given(constrained_cases(), st.integers(0, 2**31 - 1))
def test_constrained_deterministic_and_near_exact_reference(case, seed):
    lengths, capacity, constraints = case
    a = pack(lengths, capacity, constraints=constraints, seed=seed)
    b = pack(lengths, capacity, constraints=constraints, seed=seed)
    for name in ("row_ptr", "members", "row_of", "row_fill"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes()
    assert_valid(a, lengths, capacity)
    assert_constraints_hold(a, constraints)
    # Small inputs also run the exact item-by-item constrained BFD and keep the better plan.
    _, exact_rows = constrained_bfd(lengths, capacity, constraints)
    assert a.num_rows <= exact_rows


def media_mix(seed: int, n: int, width: int) -> tuple[np.ndarray, PackConstraints]:
    """Benchmark-like image/audio mix whose patch and frame budgets bind (rows well above l1)."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, n, p=[0.6, 0.25, 0.15])  # image-text, video, audio
    text = rng.integers(16, 600, n)
    images = np.where(kind == 0, rng.integers(0, 5, n), 0)
    image_tokens = images * rng.integers(64, 1281, n)
    video = np.where(kind == 1, rng.integers(1000, 6001, n), 0)
    frames = np.where(kind == 2, rng.integers(50, 751, n), 0)
    lengths = np.minimum((text + image_tokens + video + frames + 7) // 8 * 8, width)
    media = np.where(kind == 0, images, 1)
    resources = {
        "media": (media, 16),
        "patches": (4 * (image_tokens + video), 3 * width),
        "audio": (frames, 2000),
    }
    return lengths, PackConstraints(max_samples_per_row=64, resources=resources)


def test_constrained_rows_no_worse_than_exact_bfd_when_budgets_bind():
    # The fast packer alone (what inputs above the exact-BFD size get) on a realistic mix.
    lengths, constraints = media_mix(5, 4000, 16384)
    row_of, fast_rows = constrained_pack(lengths, 16384, constraints)
    for amounts, budget in constraints.resources.values():
        assert np.bincount(row_of, weights=amounts, minlength=fast_rows).max() <= budget
    assert np.bincount(row_of, weights=lengths, minlength=fast_rows).max() <= 16384
    _, exact_rows = constrained_bfd(lengths, 16384, constraints)
    bound = max(-(-int(a.sum()) // b) for a, b in constraints.resources.values())
    assert bound <= fast_rows <= exact_rows


def test_constrained_pack_large_binding_input_is_valid():
    # No timing assert (shared machine); the exact BFD would take minutes here, this runs in ~1 s.
    lengths, constraints = media_mix(6, 100_000, 16384)
    row_of, num_rows = constrained_pack(lengths, 16384, constraints)
    assert np.bincount(row_of, minlength=num_rows).min() >= 1
    for amounts, budget in constraints.resources.values():
        assert np.bincount(row_of, weights=amounts, minlength=num_rows).max() <= budget


def test_constrained_without_limits_matches_plain_bfd_rows():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 300, 2000)
    loose = PackConstraints(max_samples_per_row=10_000, resources={"x": (np.zeros(2000, np.int64), 1)})
    assert pack(lengths, 512, constraints=loose).num_rows == pack(lengths, 512).num_rows


def test_balance_keeps_rows_and_lowers_cost_spread():
    rng = np.random.default_rng(2)
    lengths = np.clip(np.round(rng.lognormal(np.log(400), 1.0, 20_000)), 1, 4096).astype(np.int64)
    plain = pack(lengths, 4096)
    balanced = pack(lengths, 4096, balance=True)
    assert_valid(balanced, lengths, 4096)
    assert plain.num_rows <= balanced.num_rows <= plain.num_rows * 1.001
    cv = lambda p: coefficient_of_variation(attention_cost(p.row_of, p.num_rows, lengths))  # noqa: E731
    assert cv(balanced) < 0.95 * cv(plain)


def test_balance_with_constraints_keeps_row_count():
    rng = np.random.default_rng(4)
    lengths = np.clip(np.round(rng.lognormal(np.log(400), 1.0, 3000)), 1, 4096).astype(np.int64)
    media = PackConstraints(max_samples_per_row=12, resources={"images": (rng.integers(0, 3, 3000), 8)})
    plain = pack(lengths, 4096, constraints=media)
    balanced = pack(lengths, 4096, constraints=media, balance=True)
    assert_valid(balanced, lengths, 4096)
    assert balanced.num_rows == plain.num_rows
    assert balanced.samples_per_row().max() <= 12


def test_sft_mix_reaches_lower_bound():
    rng = np.random.default_rng(3)
    lengths = np.clip(np.round(rng.lognormal(np.log(400), 1.0, 100_000) / 8) * 8, 8, 4096).astype(np.int64)
    bounds = lower_bounds(lengths, 4096)
    assert pack(lengths, 4096).num_rows <= max(bounds["l1"], bounds["l2"]) * 1.001


# --- lower bounds --------------------------------------------------------------------------------


def test_l2_counts_items_over_half():
    # Three items just over half never share a row: l1 says 2, l2 says 3.
    bounds = lower_bounds(np.array([6, 6, 6]), 10)
    assert (bounds["l1"], bounds["l2"]) == (2, 3)


@SETTINGS
@given(lengths_and_capacity)
def test_l2_matches_direct_formula(case):
    lengths, capacity = case
    best = 0
    for k in range(capacity // 2 + 1):
        j1 = lengths[lengths > capacity - k]
        j2 = lengths[(lengths > capacity / 2) & (lengths <= capacity - k)]
        j3 = lengths[(lengths >= k) & (lengths <= capacity / 2)]
        extra = max(0, -(-(int(j3.sum()) - (len(j2) * capacity - int(j2.sum()))) // capacity))
        best = max(best, len(j1) + len(j2) + extra)
    assert lower_bounds(lengths, capacity)["l2"] == max(best, lower_bounds(lengths, capacity)["l1"])


# --- stats -----------------------------------------------------------------------------------------


def test_packing_stats_is_json_and_consistent():
    import json

    real = np.array([5, 3, 7, 1, 8])
    padded = (real + 3) // 4 * 4
    plan = pack(padded, 16)
    stats = packing_stats(real, padded, plan, 16)
    json.dumps(stats)
    slots = plan.num_rows * 16
    assert stats["rows"] == plan.num_rows
    assert stats["real_efficiency"] == pytest.approx(real.sum() / slots)
    assert stats["padded_efficiency"] == pytest.approx(padded.sum() / slots)
    assert stats["alignment_overhead"] == pytest.approx((padded - real).sum() / slots)
    assert sum(k * v for k, v in stats["samples_per_row_histogram"].items()) == len(real)


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "match"),
    [([4, 0, 3], "sample 1 has length 0"), ([4, 3, 17], "sample 2 has length 17"), ([2, -1], "sample 1")],
)
def test_bad_lengths_name_first_offender(lengths, match):
    with pytest.raises(ValueError, match=match):
        pack(np.array(lengths), 16)


def test_other_bad_input():
    with pytest.raises(ValueError, match="algorithm"):
        pack(np.array([1]), 4, algorithm="worst")
    with pytest.raises(ValueError, match="integers"):
        pack(np.array([1.5]), 4)
    with pytest.raises(ValueError, match="window"):
        pack(np.array([1]), 4, window=0)
    too_many = PackConstraints(resources={"patches": (np.array([3, 9, 2]), 8)})
    with pytest.raises(ValueError, match="'patches': sample 1 needs 9"):
        pack(np.array([1, 1, 1]), 4, constraints=too_many)
    with pytest.raises(ValueError, match="shape"):
        pack(np.array([1, 1]), 4, constraints=PackConstraints(resources={"m": (np.array([1]), 2)}))


def test_a_numpy_integer_capacity_packs_as_the_same_int():
    """A width read from an array (``np.int64``) gives the plan of the same Python int: the refill's
    bitsets are Python ints, which an int64 width used to overflow."""
    lengths = np.random.default_rng(0).integers(100, 700, size=200)
    plan, want = pack(lengths, np.int64(1000)), pack(lengths, 1000)
    assert plan.num_rows == want.num_rows and np.array_equal(plan.row_of, want.row_of)
    with pytest.raises(TypeError):
        pack(lengths, 1000.0)


def test_empty_input_gives_empty_plan():
    plan = pack(np.zeros(0, dtype=np.int64), 8)
    assert plan.num_rows == 0 and plan.row_ptr.tolist() == [0] and len(list(plan.rows())) == 0
