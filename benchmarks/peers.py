"""Re-implementations of peer packers, written from their published descriptions (not their code).

Each takes padded lengths in input order and the row width and returns a row id per sample. They keep
each peer's *scope* (chunk or buffer size), which is where most of their efficiency loss comes from.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort

import numpy as np


def _per_chunk(lengths: np.ndarray, chunk: int, pack_chunk) -> np.ndarray:
    row_of = np.empty(len(lengths), dtype=np.int64)
    next_row = 0
    for start in range(0, len(lengths), chunk):
        part = pack_chunk(lengths[start : start + chunk].tolist())
        row_of[start : start + len(part)] = np.asarray(part) + next_row
        next_row += max(part) + 1
    return row_of


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[int]:
    """BFD: largest first, into the open row with the least space that fits (TRL ``bfd``)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    open_rows: list[tuple[int, int]] = []  # sorted (space, row)
    row_of = [0] * len(lengths)
    rows = 0
    for i in order:
        v = lengths[i]
        k = bisect_left(open_rows, (v, -1))
        if k == len(open_rows):
            row, space = rows, capacity
            rows += 1
        else:
            space, row = open_rows.pop(k)
        row_of[i] = row
        insort(open_rows, (space - v, row))
    return row_of


def greedy_knapsack(lengths: list[int], capacity: int) -> list[int]:
    """LLaMA-Factory / NeMo-VLM knapsack: sort ascending, fill one row at a time with the largest
    remaining item that fits, until nothing fits."""
    remaining = sorted(range(len(lengths)), key=lambda i: lengths[i])
    keys = [lengths[i] for i in remaining]
    row_of = [0] * len(lengths)
    row = 0
    while remaining:
        space = capacity
        while True:
            k = bisect_right(keys, space) - 1
            if k < 0:
                break
            i = remaining.pop(k)
            space -= keys.pop(k)
            row_of[i] = row
        row += 1
    return row_of


def worst_fit_decreasing(lengths: list[int], capacity: int) -> list[int]:
    """Qwen ``pack_data`` (binpacking.to_constant_volume): largest first, into the emptiest row if it
    fits, else a new row."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    fill_heap: list[tuple[int, int]] = []  # (fill, row): emptiest row on top
    row_of = [0] * len(lengths)
    for i in order:
        v = lengths[i]
        if fill_heap and fill_heap[0][0] + v <= capacity:
            fill, row = heapq.heappop(fill_heap)
        else:
            fill, row = 0, len(fill_heap)
        row_of[i] = row
        heapq.heappush(fill_heap, (fill + v, row))
    return row_of


def next_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """torchtune: in dataset order, start a new row whenever the next sample does not fit."""
    row_of = np.empty(len(lengths), dtype=np.int64)
    row, fill = 0, 0
    for i, v in enumerate(lengths.tolist()):
        if fill + v > capacity:
            row, fill = row + 1, 0
        row_of[i] = row
        fill += v
    return row_of


PEERS = {
    "TRL bfd /1000": lambda lengths, w: _per_chunk(lengths, 1000, lambda c: best_fit_decreasing(c, w)),
    "LLaMA-Factory knapsack /1000": lambda lengths, w: _per_chunk(
        lengths, 1000, lambda c: greedy_knapsack(c, w)
    ),
    "Qwen pack_data WFD /256": lambda lengths, w: _per_chunk(
        lengths, 256, lambda c: worst_fit_decreasing(c, w)
    ),
    "Energon knapsack buffer 20": lambda lengths, w: _per_chunk(lengths, 20, lambda c: greedy_knapsack(c, w)),
    "torchtune next-fit": next_fit,
}


def _lightbinpack_obfd():
    """lightbinpack (PyPI, C++) ``obfd``: counting sort + segment tree best fit over the whole set.

    Optional (``pip install lightbinpack``, builds from its sdist with g++); None when not installed.
    """
    try:
        import lightbinpack
    except ImportError:
        return None

    def run(lengths: np.ndarray, capacity: int) -> np.ndarray:
        bins = lightbinpack.obfd(lengths.tolist(), capacity)
        row_of = np.empty(len(lengths), dtype=np.int64)
        for r, members in enumerate(bins):
            row_of[members] = r
        return row_of

    return run


LIGHTBINPACK_OBFD = _lightbinpack_obfd()
if LIGHTBINPACK_OBFD is not None:
    PEERS["lightbinpack obfd (C++)"] = LIGHTBINPACK_OBFD
