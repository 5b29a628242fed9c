"""The LP-guided step (``packing.patterns``): plans at the optimum where the greedy steps stop above it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from omnipack.packing import lower_bounds, pack
from omnipack.packing.greedy import ffd_classes
from omnipack.packing.patterns import lp_pattern_pack, patterns_to_slots, plan_patterns

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


def test_lp_step_gives_the_same_plan_on_every_run():
    pytest.importorskip("highspy")
    lengths = _crops(0)
    first, second = pack(lengths, 4096, seed=3), pack(lengths, 4096, seed=3)
    assert first.num_rows == second.num_rows
    assert np.array_equal(first.row_of, second.row_of)
    assert np.array_equal(first.members, second.members)


def test_without_highspy_the_greedy_plan_stays(monkeypatch):
    monkeypatch.setitem(sys.modules, "highspy", None)  # `import highspy` raises ImportError
    lengths = _crops(0)
    values, counts = np.unique(lengths, return_counts=True)
    values, counts = values[::-1].copy(), counts[::-1].copy()
    start = ffd_classes(values, counts, 4096)
    assert lp_pattern_pack(values, counts, 4096, start, [lambda v, c: ffd_classes(v, c, 4096)]) is None
    plan = pack(lengths, 4096)
    assert plan.algorithm != "lp-patterns" and plan.num_rows <= start[1]
