"""The write stage builds the next rows on background threads (one, or its worker's share of the CPUs): same
rows, same order, errors surface at their row and stop further building."""

from __future__ import annotations

import threading
import time

import pytest

from omnipack.stages.write import _built_ahead


def test_rows_come_back_in_order_built_by_one_thread() -> None:
    threads: set[int] = set()

    def build(r: int) -> int:
        threads.add(threading.get_ident())
        return r * r

    rows = list(range(50))
    assert list(_built_ahead(build, rows)) == [r * r for r in rows]
    assert len(threads) == 1 and threading.get_ident() not in threads  # off the writing thread, one thread


def test_an_error_surfaces_at_its_row_and_later_rows_are_not_built() -> None:
    built: list[int] = []

    def build(r: int) -> int:
        built.append(r)
        if r == 3:
            raise ValueError("bad row 3")
        return r

    got = []
    with pytest.raises(ValueError, match="bad row 3"):
        for x in _built_ahead(build, list(range(100)), ahead=2):
            got.append(x)
    assert got == [0, 1, 2]
    assert max(built) <= 3 + 2  # at most `ahead` rows past the failing one were started


def test_rows_come_back_in_order_from_several_threads() -> None:
    threads: set[int] = set()

    def build(r: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.002 * (r % 5))  # rows finish out of order, and the GIL is free meanwhile
        return r * r

    rows = list(range(60))
    assert list(_built_ahead(build, rows, threads=3)) == [r * r for r in rows]
    assert 1 < len(threads) <= 3 and threading.get_ident() not in threads
