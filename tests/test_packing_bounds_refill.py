"""DFF and vector lower bounds against brute-forced optima; the subset-sum refill and the FFD guarantee."""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from omnipack.packing import PackConstraints, lower_bounds, pack
from omnipack.packing.bounds import _largest_ratio_below, constrained_lower_bounds, coupled_bound, dff_bound
from omnipack.packing.engine import _classes, _refill_slack_rows
from omnipack.packing.greedy import bfd_classes
from omnipack.packing.plan import group_by_row
from omnipack.packing.refill import refill_classes

SETTINGS = settings(max_examples=60, deadline=None)  # the packing tests' hypothesis settings


def capped_classes(capacity: int, raw: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hypothesis' item sizes capped at ``capacity``, and their size classes (values, counts)."""
    lengths = np.minimum(np.array(raw, dtype=np.int64), capacity)
    return (lengths, *_classes(lengths, capacity))


def padded(real: np.ndarray, width: int) -> np.ndarray:
    """Token counts (rounded, at least 1, at most ``width``) padded to a multiple of 8, as rows hold them."""
    real = np.clip(np.round(real), 1, width).astype(np.int64)
    return np.minimum(-(-real // 8) * 8, width)


def optimum_rows(vectors: np.ndarray, caps: np.ndarray) -> int:
    """Fewest rows by exhaustive search over subsets (n <= 9): vectors [n, D] within caps [D]."""
    n = len(vectors)
    fits = np.zeros(1 << n, dtype=bool)
    for mask in range(1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        fits[mask] = bool(np.all(vectors[members].sum(axis=0) <= caps)) if members else True

    @cache
    def rows(left: int) -> int:
        if not left:
            return 0
        low = left & -left  # the lowest item left opens a row; try every row it can be in
        best = n
        sub = left
        while sub:
            if sub & low and fits[sub]:
                best = min(best, 1 + rows(left & ~sub))
            sub = (sub - 1) & left
        return best

    return rows((1 << n) - 1)


small_instances = st.integers(2, 40).flatmap(
    lambda cap: st.tuples(
        st.lists(st.integers(1, cap), min_size=1, max_size=9).map(lambda x: np.array(x, dtype=np.int64)),
        st.just(cap),
    )
)


@SETTINGS
@given(small_instances)
def test_every_bound_is_at_most_the_optimum_and_the_packer_at_least_it(case):
    lengths, capacity = case
    optimum = optimum_rows(lengths[:, None], np.array([capacity]))
    bounds = lower_bounds(lengths, capacity)
    assert max(bounds.values()) <= optimum
    assert pack(lengths, capacity).num_rows >= optimum


def test_dff_bound_beats_l1_and_l2_where_thirds_cannot_pair():
    # Nine items just over a third: two per row, so 5 rows; l1 and l2 only see 4.
    lengths = np.full(9, 101)
    bounds = lower_bounds(lengths, 300)
    assert bounds["l1"] == bounds["l2"] == 4
    assert bounds["dff"] == 5 == optimum_rows(lengths[:, None], np.array([300]))


def test_dff_bound_of_nothing_is_zero():
    assert dff_bound(np.zeros(11, dtype=np.int64), 10) == 0
    assert lower_bounds(np.zeros(0, dtype=np.int64), 10) == {"l1": 0, "l2": 0, "dff": 0}


@st.composite
def small_vector_instances(draw):
    n = draw(st.integers(1, 8))
    capacity = draw(st.integers(4, 30))
    budget = draw(st.integers(1, 6))
    lengths = np.array(draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n)), dtype=np.int64)
    media = np.array(draw(st.lists(st.integers(0, budget), min_size=n, max_size=n)), dtype=np.int64)
    max_samples = draw(st.none() | st.integers(1, 4))
    return lengths, capacity, media, budget, max_samples


@SETTINGS
@given(small_vector_instances())
def test_vector_bound_is_at_most_the_constrained_optimum(case):
    lengths, capacity, media, budget, max_samples = case
    vectors = np.stack([lengths, media, np.ones_like(lengths)], axis=1)
    caps = np.array([capacity, budget, max_samples or len(lengths)])
    optimum = optimum_rows(vectors, caps)
    bounds = constrained_lower_bounds(lengths, capacity, media[:, None], np.array([budget]), max_samples)
    assert bounds["best"] == max(v for k, v in bounds.items() if k != "best") <= optimum
    constraints = PackConstraints(max_samples_per_row=max_samples, resources={"media": (media, budget)})
    assert pack(lengths, capacity, constraints=constraints).num_rows >= optimum


def test_conflict_bound_couples_two_budgets():
    # Four token-heavy items (6 of 10 tokens, 2 of 4 media) and four media-heavy ones (1 token, 3 media):
    # no two share a row, so 8 rows. Tokens alone allow 4 rows, media alone 6; the media-heavy items fit
    # no token-heavy row, so they need rows of their own: 4 + ceil(12 / 4) = 7.
    lengths = np.array([6, 6, 6, 6, 1, 1, 1, 1])
    media = np.array([2, 2, 2, 2, 3, 3, 3, 3])
    bounds = constrained_lower_bounds(lengths, 10, media[:, None], np.array([4]))
    assert bounds["tokens"] == 4 and bounds["resource0"] == 6
    assert bounds["conflict"] == bounds["best"] == 7
    assert optimum_rows(np.stack([lengths, media], 1), np.array([10, 4])) == 8


def test_coupled_bound_counts_the_patches_long_texts_keep_out():
    # Six image samples (3 tokens, 3 patches) and two text samples (5 tokens, no patches), rows of 10 tokens
    # and 6 patches. Tokens allow 3 rows (28 / 10), patches 3 (18 / 6), and no item is over half of a
    # budget. But a row holding a text sample has 5 tokens left, so at most one image (3 of its 6 patches):
    # each text sample keeps 3 patches out of its row, (18 + 2 * 3) / 6 = 4 rows, the optimum.
    lengths = np.array([3] * 6 + [5] * 2)
    patches = np.array([3] * 6 + [0] * 2)
    bounds = constrained_lower_bounds(lengths, 10, patches[:, None], np.array([6]))
    assert bounds["tokens"] == bounds["resource0"] == 3 and bounds["conflict"] < 4
    assert bounds["coupled"] == bounds["best"] == 4
    assert optimum_rows(np.stack([lengths, patches], 1), np.array([10, 6])) == 4
    constraints = PackConstraints(resources={"patches": (patches, 6)})
    assert pack(lengths, 10, constraints=constraints).num_rows == 4


def test_coupled_bound_rounds_the_ratio_down():
    # Tokens per patch just below 1/3 for one item: the ratio as a small fraction is rounded down, never up
    # (rounded up, that item's n_i = a_i - alpha b_i would be < 0 and the size it adds not valid).
    a = np.array([100_000_001, 1])
    b = np.array([300_000_004, 3])
    ratio = _largest_ratio_below(a, b)
    assert ratio is not None and ratio <= Fraction(100_000_001, 300_000_004)
    assert np.all(ratio.denominator * a >= ratio.numerator * b)
    assert coupled_bound(np.array([5, 5]), 10, np.array([0, 0]), 6) == 0  # no item has the budget's amount
    assert _largest_ratio_below(np.array([1, 3]), np.array([5120, 4000])) == Fraction(1, 5120)  # images a row


def test_coupled_bound_with_a_budget_far_above_any_item():
    # A sample cap of 2**60 ("no cap"): c = q * 2**60 - ... leaves int64; every item's excess is 0 there.
    lengths = np.array([3] * 6 + [5] * 2)
    patches = np.array([3] * 6 + [0] * 2)
    assert coupled_bound(np.ones(8, dtype=np.int64), 2**60, patches, 6) == 3
    constraints = PackConstraints(max_samples_per_row=2**60, resources={"patches": (patches, 6)})
    assert pack(lengths, 10, constraints=constraints).num_rows == 4


def check_class_slots(slot_rows, num_rows, values, counts, capacity):
    assert len(slot_rows) == counts.sum()
    fills = np.bincount(slot_rows, weights=np.repeat(values, counts), minlength=num_rows)
    assert fills.min() > 0 and fills.max() <= capacity


@SETTINGS
@given(st.integers(8, 200), st.lists(st.integers(1, 200), min_size=1, max_size=80))
def test_refill_places_every_item_once_within_capacity(capacity, raw):
    lengths, values, counts = capped_classes(capacity, raw)
    slot_rows, num_rows = refill_classes(values, counts, capacity)
    check_class_slots(slot_rows, num_rows, values, counts, capacity)
    bfd_slots, bfd_rows = bfd_classes(values, counts, capacity)
    slot_rows, num_rows = _refill_slack_rows(bfd_slots, bfd_rows, values, counts, capacity)
    check_class_slots(slot_rows, num_rows, values, counts, capacity)
    assert num_rows >= max(lower_bounds(lengths, capacity).values())


def bimodal(seed: int, n: int, width: int) -> np.ndarray:
    """The benchmark's bimodal image-text mix, padded to 8 (greedy fits strand mid-sized items)."""
    rng = np.random.default_rng(seed)
    text = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    large = rng.random(n) < 0.5
    image = np.where(
        large, rng.integers(int(0.2 * width), int(0.55 * width) + 1, n), rng.integers(512, 1537, n)
    )
    return padded(text + image, width)


def test_refill_closes_the_bimodal_gap_that_bfd_and_ffd_leave():
    lengths = bimodal(1, 20_000, 8192)
    bound = max(lower_bounds(lengths, 8192).values())
    ffd = pack(lengths, 8192, algorithm="ffd")
    plan = pack(lengths, 8192)
    assert ffd.num_rows > bound * 1.003  # the greedy fits are well off the bound here
    assert "refill" in plan.algorithm
    assert plan.num_rows <= bound * 1.001
    fills = np.bincount(plan.row_of, weights=lengths, minlength=plan.num_rows)
    assert np.array_equal(fills, plan.row_fill) and fills.max() <= 8192
    again = pack(lengths, 8192)
    assert (
        again.members.tobytes() == plan.members.tobytes() and again.row_of.tobytes() == plan.row_of.tobytes()
    )


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from([512, 1024, 4096]), st.integers(50, 2000))
def test_never_more_rows_than_classic_ffd(seed, width, n):
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.integers(1, width // 8, n) * 8 + rng.integers(0, 2, n) * width // 3, width)
    assert pack(lengths, width).num_rows <= pack(lengths, width, algorithm="ffd").num_rows


def test_group_by_row_is_a_stable_sort_past_16_bit_row_ids():
    rng = np.random.default_rng(0)
    for num_rows in (3, 70_000, 2**20):
        row_of = rng.integers(0, num_rows, 200_000).astype(np.int32)
        expected = np.argsort(row_of, kind="stable")
        assert np.array_equal(group_by_row(row_of, num_rows), expected)
