"""The mixed re-pack of slack rows (bimodal mix) and the balanced fill for two binding budgets."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from omnipack.packing import PackConstraints, engine, lower_bounds, pack
from omnipack.packing.bounds import constrained_lower_bounds
from omnipack.packing.constraints import constrained_pack
from omnipack.packing.engine import _classes, _mix_and_repack
from omnipack.packing.greedy import bfd_classes
from omnipack.packing.refill import refill_classes
from omnipack.packing.vector_fill import LEVEL_CAP, MAX_AMOUNT_VECTORS, balanced_fill

from .test_packing_bounds_refill import SETTINGS, bimodal, capped_classes, check_class_slots


@SETTINGS
@given(st.integers(8, 200), st.lists(st.integers(1, 200), min_size=1, max_size=120))
def test_mixed_repack_places_every_item_once_within_capacity(capacity, raw):
    _, values, counts = capped_classes(capacity, raw)
    for start in (bfd_classes(values, counts, capacity), refill_classes(values, counts, capacity)):
        slot_rows, num_rows = _mix_and_repack(*start, values, counts, capacity)
        check_class_slots(slot_rows, num_rows, values, counts, capacity)
        assert num_rows <= start[1]


def test_mixed_repack_closes_the_bimodal_gap_at_4096(monkeypatch):
    # Seeds where the refill alone ends 0.4-0.5% over the bound (rows of three ~1.2k items, 300-500 free).
    # On seed 4 the LP-guided step after it now reaches the bound (7284) first; it is off here so that
    # the test still covers the mixed re-pack.
    monkeypatch.setattr(engine, "LP_MAX_SAMPLES", 0)
    for seed in (0, 4):
        lengths = bimodal(seed, 20_000, 4096)
        bound = max(lower_bounds(lengths, 4096).values())
        values, counts = _classes(lengths, 4096)
        assert refill_classes(values, counts, 4096)[1] > bound * 1.003
        plan = pack(lengths, 4096)
        assert "mix" in plan.algorithm
        assert plan.num_rows <= bound * 1.001
        assert plan.num_rows <= pack(lengths, 4096, algorithm="ffd").num_rows
        fills = np.bincount(plan.row_of, weights=lengths, minlength=plan.num_rows)
        assert fills.max() <= 4096 and np.array_equal(np.sort(plan.members), np.arange(len(lengths)))


def image_text_draws(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The benchmark's image-text draws: (text tokens, median 150; images, 0-4; their tokens, 64-1280 each)."""
    text = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    num_images = rng.integers(0, 5, n)
    image_tokens = np.zeros(n, dtype=np.int64)
    for k in range(1, 5):
        has = num_images >= k
        image_tokens[has] += rng.integers(64, 1281, int(has.sum()))
    return text, num_images, image_tokens


def image_text_media(seed: int, n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The benchmark's image-text mix: text median 150 plus 0-4 images of 64-1280 tokens; padded to 8."""
    text, num_images, image_tokens = image_text_draws(np.random.default_rng(seed), n)
    return np.minimum((text + image_tokens + 7) // 8 * 8, width), num_images


def check_constrained(row_of, num_rows, lengths, capacity, constraints):
    assert len(row_of) == len(lengths) and row_of.min() >= 0 and row_of.max() == num_rows - 1
    assert np.bincount(row_of, weights=lengths, minlength=num_rows).max() <= capacity
    if constraints.max_samples_per_row is not None:
        assert np.bincount(row_of, minlength=num_rows).max() <= constraints.max_samples_per_row
    for amounts, budget in constraints.resources.values():
        assert np.bincount(row_of, weights=amounts, minlength=num_rows).max() <= budget


@SETTINGS
@given(
    st.integers(16, 120),
    st.lists(st.tuples(st.integers(1, 120), st.integers(0, 4), st.integers(0, 9)), min_size=1, max_size=80),
    st.sampled_from([None, 2, 5]),
)
def test_balanced_fill_respects_every_budget(capacity, raw, cap):
    lengths = np.minimum(np.array([r[0] for r in raw], dtype=np.int64), capacity)
    constraints = PackConstraints(
        max_samples_per_row=cap,
        resources={
            "media": (np.array([r[1] for r in raw], dtype=np.int64), 6),
            "frames": (np.array([r[2] for r in raw], dtype=np.int64), 9),
        },
    )
    row_of, num_rows = balanced_fill(lengths, capacity, constraints)
    check_constrained(row_of, num_rows, lengths, capacity, constraints)
    amounts, budgets = constraints.amounts_matrix(len(lengths))
    assert num_rows >= constrained_lower_bounds(lengths, capacity, amounts, budgets, cap)["best"]
    again = balanced_fill(lengths, capacity, constraints)
    assert again[1] == num_rows and np.array_equal(again[0], row_of)


@SETTINGS
@given(st.integers(16, 120), st.lists(st.integers(1, 120), min_size=1, max_size=80), st.integers(1, 6))
def test_a_sample_cap_alone_holds_and_places_every_sample(capacity, raw, cap):
    """No resource budget, a sample cap (the fill levels it as a count of one per sample): the cap and the
    width hold, every sample is placed once, no row is empty, the same plan twice. Without the cap it
    declines."""
    lengths = np.minimum(np.array(raw, dtype=np.int64), capacity)
    constraints = PackConstraints(max_samples_per_row=cap)
    filled = balanced_fill(lengths, capacity, constraints)
    assert filled is not None
    row_of, num_rows = filled
    check_constrained(row_of, num_rows, lengths, capacity, constraints)
    assert np.bincount(row_of, minlength=num_rows).min() >= 1
    assert np.array_equal(balanced_fill(lengths, capacity, constraints)[0], row_of)
    assert balanced_fill(lengths, capacity, PackConstraints()) is None


def test_text_under_a_binding_sample_cap_reaches_its_bound():
    """Text (lognormal, median 400) under a cap of 12 samples a row at W=8192: each row needs ~12 samples and
    ~W tokens at once. The best fit by tokens ends 31% over the vector bound; the fill, levelling the cap with
    the tokens, and so ``pack``, at it."""
    n = 2000
    lengths = _capped_text(n)
    constraints = PackConstraints(max_samples_per_row=12)
    no_budgets = (np.zeros((n, 0), np.int64), np.zeros(0, np.int64))
    bound = constrained_lower_bounds(lengths, 8192, *no_budgets, 12)["best"]
    assert constrained_pack(lengths, 8192, constraints)[1] > bound * 1.3
    row_of, num_rows = balanced_fill(lengths, 8192, constraints)
    check_constrained(row_of, num_rows, lengths, 8192, constraints)
    plan = pack(lengths, 8192, constraints=constraints)
    assert num_rows == bound and plan.num_rows == bound and plan.algorithm == "balanced-fill+constraints"
    check_constrained(plan.row_of, plan.num_rows, lengths, 8192, constraints)


def _capped_text(n: int) -> np.ndarray:
    """Text lengths (lognormal, median 400, sigma 1), padded to 8, at most 8192: with a cap of 12 samples a
    row both the cap and the tokens bind."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.round(rng.lognormal(np.log(400), 1.0, n)), 1, 8192).astype(np.int64)
    return np.minimum(-(-lengths // 8) * 8, 8192)


def test_a_cap_beside_a_budget_that_does_not_bind_is_levelled_in_a_second_fill():
    """The capped text with one image on 10% of the samples (at most 16 a row: never binding). The fill
    that levels the media budget ends 15% over the bound; the one that levels the cap (the budget a limit
    only) at it, and ``pack`` keeps that one."""
    lengths = _capped_text(2000)
    media = (np.random.default_rng(1).random(2000) < 0.1).astype(np.int64)
    constraints = PackConstraints(max_samples_per_row=12, resources={"media": (media, 16)})
    bound = constrained_lower_bounds(lengths, 8192, media[:, None], np.array([16]), 12)["best"]
    assert balanced_fill(lengths, 8192, constraints)[1] > bound * 1.1
    row_of, num_rows = balanced_fill(lengths, 8192, constraints, LEVEL_CAP)
    check_constrained(row_of, num_rows, lengths, 8192, constraints)
    plan = pack(lengths, 8192, constraints=constraints)
    assert num_rows == bound and plan.num_rows == bound and plan.algorithm == "balanced-fill+constraints"
    check_constrained(plan.row_of, plan.num_rows, lengths, 8192, constraints)


def test_plans_above_the_second_order_limit_start_from_the_fill(monkeypatch):
    """Above SECOND_ORDER_MAX samples the one greedy start is the fill where it has fewer rows: the capped
    text (here with the limit lowered to 1,000 samples) at its bound, where the best fit ends 31% over."""
    lengths = _capped_text(2000)
    constraints = PackConstraints(max_samples_per_row=12)
    monkeypatch.setattr(engine, "SECOND_ORDER_MAX", 1000)
    plan = pack(lengths, 8192, constraints=constraints)
    bound = constrained_lower_bounds(lengths, 8192, np.zeros((2000, 0), np.int64), np.zeros(0, np.int64), 12)
    assert plan.num_rows == bound["best"] and plan.algorithm == "balanced-fill+constraints"
    check_constrained(plan.row_of, plan.num_rows, lengths, 8192, constraints)


def test_windows_take_the_fill_too():
    """Plans packed in windows (``window=``) take the fill where it has fewer rows than the fast best fit: the
    capped text in windows of 500 at the sum of the windows' bounds, where the best fit ends 29% over, and
    no row spans two windows."""
    lengths, window = _capped_text(2000), 500
    constraints = PackConstraints(max_samples_per_row=12)
    plan = pack(lengths, 8192, constraints=constraints, window=window)
    no_budgets = (np.zeros((window, 0), np.int64), np.zeros(0, np.int64))
    starts = range(0, len(lengths), window)
    bounds = [constrained_lower_bounds(lengths[s : s + window], 8192, *no_budgets, 12) for s in starts]
    bounds = [bound["best"] for bound in bounds]
    fast = [constrained_pack(lengths[s : s + window], 8192, constraints)[1] for s in starts]
    assert sum(fast) > sum(bounds) * 1.25
    assert plan.num_rows == sum(bounds)
    check_constrained(plan.row_of, plan.num_rows, lengths, 8192, constraints)
    assert all(len(set((plan.row(r) // window).tolist())) == 1 for r in range(plan.num_rows))


def test_balanced_fill_declines_many_distinct_amounts():
    lengths = np.full(MAX_AMOUNT_VECTORS + 1, 8)
    constraints = PackConstraints(resources={"patches": (np.arange(MAX_AMOUNT_VECTORS + 1), 1000)})
    assert balanced_fill(lengths, 64, constraints) is None


def test_two_binding_budgets_reach_the_vector_bound():
    # Tokens and 10 media items per row bind together: best fit leaves rows full in one dimension only.
    lengths, media = image_text_media(0, 6000, 8192)
    constraints = PackConstraints(resources={"media": (media, 10)})
    bound = constrained_lower_bounds(lengths, 8192, media[:, None], np.array([10]))["best"]
    assert constrained_pack(lengths, 8192, constraints)[1] > bound * 1.01
    plan = pack(lengths, 8192, constraints=constraints)
    assert plan.algorithm == "balanced-fill+constraints"
    assert plan.num_rows <= bound * 1.002
    check_constrained(plan.row_of, plan.num_rows, lengths, 8192, constraints)
