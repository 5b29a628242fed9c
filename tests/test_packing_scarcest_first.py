"""The greedy start that buckets rows by the scarcest budget (``constraints.scarcest_first_pack``), and where
the engine takes it: only with fewer rows than the token-space start."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.packing import engine, pack
from omnipack.packing.constraints import (
    PackConstraints,
    constrained_pack,
    scarcest_budget,
    scarcest_first_pack,
)

from .test_packing import assert_constraints_hold, media_mix
from .test_packing_mix_balanced import image_text_draws

WIDTH = 16384


def omni_mix(seed: int, n: int) -> tuple[np.ndarray, PackConstraints]:
    """The packing benchmark's omni mix: lognormal text (median 150); 60% with 0-4 images of 64-1280 tokens,
    25% a video of 1k-6k tokens, 15% 2-30 s of audio at 25 frames/s; 4 vision patches per vision token.
    The patch budget binds, the tokens' demand is ~87% of it (``media_mix``: ~91%)."""
    rng = np.random.default_rng(seed)
    text, images, image_tokens = image_text_draws(rng, n)
    kind = rng.choice(3, n, p=[0.6, 0.25, 0.15])
    video = np.where(kind == 1, rng.integers(1000, 6001, n), 0)
    frames = np.where(kind == 2, rng.integers(50, 751, n), 0)
    vision = np.where(kind == 0, image_tokens, video)
    real = np.minimum(text + vision + frames, WIDTH)
    lengths = np.minimum(-(-real // 8) * 8, WIDTH)
    resources = {
        "media": (np.where(kind == 0, images, 1), 16),
        "patches": (vision * 4, 3 * WIDTH),
        "audio": (frames, 2000),
    }
    return lengths, PackConstraints(max_samples_per_row=64, resources=resources)


def assert_plan_holds(row_of: np.ndarray, rows: int, lengths: np.ndarray, constraints: PackConstraints) -> None:
    """Every item in one of ``rows`` rows, none empty, every row within the tokens, each budget and the
    sample cap."""
    assert row_of.shape == lengths.shape
    counts = np.bincount(row_of, minlength=rows)
    assert len(counts) == rows and counts.min() >= 1
    assert counts.max() <= (constraints.max_samples_per_row or len(lengths))
    assert np.bincount(row_of, weights=lengths).max() <= WIDTH
    for amounts, budget in constraints.resources.values():
        assert np.bincount(row_of, weights=amounts).max() <= budget


def test_the_scarcest_budget_is_the_one_demanded_most_and_none_where_the_tokens_lead():
    lengths, constraints = omni_mix(0, 2000)
    assert scarcest_budget(lengths, WIDTH, constraints) == "patches"
    roomy = PackConstraints(64, {k: (a, b * 4) for k, (a, b) in constraints.resources.items()})
    assert scarcest_budget(lengths, WIDTH, roomy) is None and scarcest_first_pack(lengths, WIDTH, roomy) is None
    assert scarcest_budget(lengths, WIDTH, PackConstraints(max_samples_per_row=8)) is None


def test_the_start_by_the_scarcest_budget_holds_every_budget_and_cuts_rows_where_that_budget_binds():
    for seed in range(3):
        lengths, constraints = omni_mix(seed, 5000)
        row_of, rows = scarcest_first_pack(lengths, WIDTH, constraints)
        assert_plan_holds(row_of, rows, lengths, constraints)
        assert rows < constrained_pack(lengths, WIDTH, constraints)[1], seed


@pytest.mark.parametrize("start_sample", [50_000, 10_000])
def test_a_large_plan_keeps_the_start_with_fewer_rows(monkeypatch, start_sample):
    """Above SECOND_ORDER_MAX samples the engine runs one greedy start, the one with fewer rows on an evenly
    strided subsample (here the whole set, or every 2nd sample): the scarcest budget's on the omni mix, the
    tokens' on a mix where the tokens bind nearly as hard (there the other start has more rows)."""
    # the fills far over the bound off (seconds here): this is the greedy start
    monkeypatch.setattr(engine, "MORE_FILLS_MIN_GAP", 0)
    monkeypatch.setattr(engine, "SECOND_ORDER_MAX", 1000)
    monkeypatch.setattr(engine, "START_SAMPLE", start_sample)
    monkeypatch.setattr(engine, "VECTOR_SWAP_POOL_ROWS", 0)  # the starts alone
    lengths, constraints = omni_mix(0, 20_000)
    plan = pack(lengths, WIDTH, constraints=constraints)
    assert plan.algorithm == engine.SCARCEST_FIRST
    assert plan.num_rows == scarcest_first_pack(lengths, WIDTH, constraints)[1]
    assert_constraints_hold(plan, constraints)

    lengths, constraints = media_mix(0, 20_000, WIDTH)
    token_rows = constrained_pack(lengths, WIDTH, constraints)[1]
    assert scarcest_first_pack(lengths, WIDTH, constraints)[1] > token_rows
    plan = pack(lengths, WIDTH, constraints=constraints)
    assert (plan.algorithm, plan.num_rows) == ("bfd+constraints", token_rows)
    assert_constraints_hold(plan, constraints)


def test_every_budget_holds_whatever_the_budgets_are_named_and_on_edge_inputs():
    """The tokens join the other budgets under a name of their own: a budget named "tokens" (or so) is still
    checked. Samples that need none of the scarcest budget, no sample cap, a single sample."""
    lengths = np.array([2, 2, 1, 1] * 50, dtype=np.int64)
    patches = np.array([2, 0, 1, 1] * 50)
    for clash in ("tokens", "tokens_", "\0tokens"):
        constraints = PackConstraints(None, {"patches": (patches, 2), clash: (np.array([1, 1, 0, 0] * 50), 1)})
        assert scarcest_budget(lengths, WIDTH, constraints) == "patches"
        assert_plan_holds(*scarcest_first_pack(lengths, WIDTH, constraints), lengths, constraints)
        plan = pack(lengths, WIDTH, constraints=constraints, shuffle=False)
        assert_plan_holds(plan.row_of, plan.num_rows, lengths, constraints)
    one = PackConstraints(3, {"patches": (np.array([5]), 5)})
    row_of, rows = scarcest_first_pack(np.array([8]), WIDTH, one)
    assert (row_of.tolist(), rows) == ([0], 1)
