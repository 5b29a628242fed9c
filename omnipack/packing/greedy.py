"""Best-fit and first-fit decreasing over length classes (counting formulation).

Padded lengths take few distinct values, so items are processed one length class at a time, largest
first. Identical items that land in rows with identical remaining space are interchangeable, so the
algorithms move *counts of rows* between remaining-space buckets instead of single items: a class of
``c`` items of length ``v`` fills the chosen row with ``capacity_left // v`` items before moving on, which
is exactly what the item-by-item algorithm does. Per-item row ids are materialised with numpy at the end.

Both functions take the class values (descending) and counts and return ``(slot_rows, num_rows)``:
``slot_rows`` lists the row of every item in class order (all items of the first class, then the next).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class _RowBuckets:
    """Open rows grouped by remaining space; each bucket is a FIFO of row-id arrays."""

    def __init__(self, min_useful_space: int) -> None:
        self.min_useful_space = min_useful_space
        self.chunks: dict[int, deque[np.ndarray]] = {}
        self.size: dict[int, int] = {}
        self.nonempty: list[int] = []  # sorted remaining spaces that hold rows

    def push(self, space: int, rows: np.ndarray) -> None:
        if space < self.min_useful_space or len(rows) == 0:
            return  # no remaining item fits: the row is closed
        if space in self.size and self.size[space]:
            self.chunks[space].append(rows)
            self.size[space] += len(rows)
        else:
            self.chunks[space] = deque([rows])
            self.size[space] = len(rows)
            insort(self.nonempty, space)

    def pop(self, space: int, k: int) -> np.ndarray:
        """Remove and return the first ``k`` rows of bucket ``space``."""
        queue = self.chunks[space]
        taken = []
        need = k
        while need:
            head = queue.popleft()
            if len(head) > need:
                queue.appendleft(head[need:])
                head = head[:need]
            taken.append(head)
            need -= len(head)
        self.size[space] -= k
        if not self.size[space]:
            self.nonempty.pop(bisect_left(self.nonempty, space))
        return taken[0] if len(taken) == 1 else np.concatenate(taken)


def bfd_classes(
    values: np.ndarray, counts: np.ndarray, capacity: int, open_space: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """Best-fit decreasing: each item goes to the open row with the least remaining space that fits it.

    ``open_space[r]`` optionally gives rows ``0..len-1`` that are already partly filled; new rows follow.
    """
    if len(values) == 0:
        return _EMPTY, 0 if open_space is None else len(open_space)
    buckets = _RowBuckets(int(values[-1]))
    slot_parts: list[np.ndarray] = [_EMPTY]
    num_rows = 0
    if open_space is not None and len(open_space):
        num_rows = len(open_space)
        by_space = np.argsort(open_space, kind="stable")
        sorted_space = open_space[by_space]
        cuts = np.flatnonzero(np.diff(sorted_space)) + 1
        for group in np.split(by_space, cuts):
            buckets.push(int(open_space[group[0]]), group.astype(np.int64))
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        while c:
            i = bisect_left(buckets.nonempty, v)
            if i == len(buckets.nonempty):
                # Nothing fits: open rows and fill each with as many items as fit.
                per_row = capacity // v
                full, rem = divmod(c, per_row)
                if full:
                    rows = np.arange(num_rows, num_rows + full, dtype=np.int64)
                    num_rows += full
                    slot_parts.append(np.repeat(rows, per_row))
                    buckets.push(capacity - per_row * v, rows)
                if rem:
                    rows = np.array([num_rows], dtype=np.int64)
                    num_rows += 1
                    slot_parts.append(np.repeat(rows, rem))
                    buckets.push(capacity - rem * v, rows)
                break
            space = buckets.nonempty[i]
            per_row = space // v
            available = buckets.size[space]
            if c >= available * per_row:
                rows = buckets.pop(space, available)
                slot_parts.append(np.repeat(rows, per_row))
                buckets.push(space - per_row * v, rows)
                c -= available * per_row
                continue
            full, rem = divmod(c, per_row)
            if full:
                rows = buckets.pop(space, full)
                slot_parts.append(np.repeat(rows, per_row))
                buckets.push(space - per_row * v, rows)
            if rem:
                rows = buckets.pop(space, 1)
                slot_parts.append(np.repeat(rows, rem))
                buckets.push(space - rem * v, rows)
            break
    return np.concatenate(slot_parts), num_rows


def ffd_classes(values: np.ndarray, counts: np.ndarray, capacity: int) -> tuple[np.ndarray, int]:
    """First-fit decreasing: each item goes to the lowest-numbered open row that fits it.

    Rows are kept as runs of consecutive row ids with equal remaining space (``_SpaceRuns``); each placement
    is an event (first row, rows, items per row), expanded to one row id per item at the end.
    """
    if len(values) == 0:
        return _EMPTY, 0
    runs = _SpaceRuns(capacity, min_useful=int(values[-1]))
    events: list[tuple[int, int, int]] = []  # (first row, rows, items per row)
    num_rows = 0
    for v, c in zip(values.tolist(), counts.tolist(), strict=True):
        while c:
            found = runs.pop_first_fit(v)
            if found is None:  # no open row fits: open new ones
                per_row = capacity // v
                full, rem = divmod(c, per_row)
                if full:
                    events.append((num_rows, full, per_row))
                    runs.push(capacity - per_row * v, num_rows, full)
                    num_rows += full
                if rem:
                    events.append((num_rows, 1, rem))
                    runs.push(capacity - rem * v, num_rows, 1)
                    num_rows += 1
                break
            space, start, length = found
            per_row = space // v
            filled = min(length, c // per_row)
            if filled:
                events.append((start, filled, per_row))
                runs.push(space - per_row * v, start, filled)
                c -= filled * per_row
            if filled == length:
                continue
            # The run is split: one partially filled row, then the untouched rest.
            rest_start = start + filled
            if c:
                events.append((rest_start, 1, c))
                runs.push(space - c * v, rest_start, 1)
                rest_start += 1
                c = 0
            runs.push(space, rest_start, start + length - rest_start)
    return _row_of_events(events), num_rows


class _SpaceRuns:
    """Open rows as runs of consecutive row ids with equal remaining space: each space bucket is a heap of
    run starts, and ``heads[s]`` (the lowest run start in bucket ``s``) finds the first fit by argmin."""

    def __init__(self, capacity: int, min_useful: int) -> None:
        self.min_useful = min_useful  # rows with less space than the shortest item are closed
        self.no_row = np.iinfo(np.int64).max
        self.heads = np.full(capacity + 1, self.no_row, dtype=np.int64)
        self.heaps: dict[int, list[int]] = {}
        self.run_len: dict[int, int] = {}  # run start -> number of rows in the run

    def push(self, space: int, start: int, length: int) -> None:
        if space < self.min_useful or length == 0:
            return
        self.run_len[start] = length
        heap = self.heaps.setdefault(space, [])
        heapq.heappush(heap, start)
        self.heads[space] = heap[0]

    def pop_first_fit(self, v: int) -> tuple[int, int, int] | None:
        """Remove and return (space, start, length) of the lowest-numbered run with space >= v; None if none."""
        heads = self.heads
        space = v + int(np.argmin(heads[v:]))
        if heads[space] == self.no_row:
            return None
        heap = self.heaps[space]
        start = heapq.heappop(heap)
        heads[space] = heap[0] if heap else self.no_row
        return space, start, self.run_len.pop(start)


def _row_of_events(events: list[tuple[int, int, int]]) -> np.ndarray:
    """Expand events (start, rows, items per row) to one row id per item, keeping event order."""
    table = np.asarray(events, dtype=np.int64).reshape(-1, 3)
    starts, rows_per_event, per_row = table[:, 0], table[:, 1], table[:, 2]
    row_base = np.repeat(starts, rows_per_event)
    event_first = np.repeat(np.cumsum(rows_per_event) - rows_per_event, rows_per_event)
    rows = row_base + np.arange(len(row_base), dtype=np.int64) - event_first
    return np.repeat(rows, np.repeat(per_row, rows_per_event))
