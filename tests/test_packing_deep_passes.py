"""The deep passes of the swap search (``engine._deep_swap_passes``): constrained plans left more than 0.1%
and more than a row above the vector bound get them, and end within that."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.packing import engine, pack

from .test_packing import assert_constraints_hold
from .test_packing_budget_first import WIDTH, _bound, image_text


def test_a_plan_two_rows_over_its_bound_ends_one_over():
    """One of the 5,000-sample image-text sets of benchmarks/README.md: every other step leaves it two rows
    over its bound of 1,096 (0.18%); the deep passes end a row over (0.09%), every limit held."""
    lengths, constraints = image_text(11, 5000)
    bound = _bound(lengths, constraints)
    with pytest.MonkeyPatch.context() as off:
        off.setattr(engine, "DEEP_PASSES", 0)
        without = pack(lengths, WIDTH, constraints=constraints)
    plan = pack(lengths, WIDTH, constraints=constraints)
    assert without.num_rows == bound + 2 and not without.algorithm.endswith("+deep")
    assert plan.num_rows == bound + 1 and plan.algorithm == without.algorithm + "+deep"
    assert_constraints_hold(plan, constraints)
    assert np.bincount(plan.row_of, weights=lengths).max() <= WIDTH
    assert sorted(plan.members.tolist()) == list(range(len(lengths)))


@pytest.fixture
def deep_calls(monkeypatch) -> list[tuple[int, int]]:
    """``(rows, goal)`` of every deep pass call of ``pack``, which leave the plan as it is; the other steps
    that run above the bound (the budget-first search, the vector pattern LP) off."""
    calls = []

    def recording(lengths, capacity, constraints, row_of, num_rows, goal):
        calls.append((num_rows, goal))
        return row_of, num_rows

    monkeypatch.setattr(engine, "_deep_swap_passes", recording)
    monkeypatch.setattr(engine, "BUDGET_FIRST_MAX_ROWS", 0)
    monkeypatch.setattr(engine, "CONSTRAINED_LP_MAX_SAMPLES", 0)
    return calls


def _with_bound(monkeypatch, bound: int) -> None:
    monkeypatch.setattr(engine, "_constrained_bound", lambda *args: bound)


def test_a_row_over_is_left_and_two_rows_over_get_the_passes(monkeypatch, deep_calls):
    """With the bound taken as two rows under the plan the passes run, to a goal of one row over it; one
    row under it (so under 0.1% of rows from it) they do not."""
    lengths, constraints = image_text(0, 200)
    rows = pack(lengths, WIDTH, constraints=constraints).num_rows  # at its bound: no step runs
    assert deep_calls == []
    _with_bound(monkeypatch, rows - 1)
    pack(lengths, WIDTH, constraints=constraints)
    assert deep_calls == []
    _with_bound(monkeypatch, rows - 2)
    pack(lengths, WIDTH, constraints=constraints)
    assert deep_calls == [(rows, rows - 1)]


def test_the_tolerance_counts_per_mille_of_the_bound(monkeypatch, deep_calls):
    """At a tolerance of 100 per mille (so that it counts on a plan of ~45 rows), the largest bound whose goal
    (the bound and a tenth of it) is under the plan's rows gives the passes that goal; one more does not."""
    lengths, constraints = image_text(0, 200)
    rows = pack(lengths, WIDTH, constraints=constraints).num_rows
    monkeypatch.setattr(engine, "DEEP_TOLERANCE_PER_MILLE", 100)
    bound = max(b for b in range(rows) if b + b // 10 < rows)
    assert bound // 10 > 1  # the per-mille term decides, not the one row
    _with_bound(monkeypatch, bound)
    pack(lengths, WIDTH, constraints=constraints)
    assert deep_calls == [(rows, bound + bound // 10)]
    deep_calls.clear()
    _with_bound(monkeypatch, bound + 1)
    pack(lengths, WIDTH, constraints=constraints)
    assert deep_calls == []


def test_a_plan_over_the_row_limit_gets_no_passes(monkeypatch, deep_calls):
    """Two rows over the bound: a plan of DEEP_MAX_ROWS rows gets the passes, one of a row more does not."""
    lengths, constraints = image_text(0, 200)
    rows = pack(lengths, WIDTH, constraints=constraints).num_rows
    _with_bound(monkeypatch, rows - 2)
    monkeypatch.setattr(engine, "DEEP_MAX_ROWS", rows)
    pack(lengths, WIDTH, constraints=constraints)
    assert deep_calls == [(rows, rows - 1)]
    deep_calls.clear()
    monkeypatch.setattr(engine, "DEEP_MAX_ROWS", rows - 1)
    pack(lengths, WIDTH, constraints=constraints)
    assert deep_calls == []
