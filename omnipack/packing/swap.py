"""Swap local search for rows of few items (Levine and Ducatelle's bin-packing local search).

Greedy fits and the subset-sum refill fill each row as well as the items left allow at that moment; on
mixes where a row holds only two to five items (lengths near W/3-W/5 with a few fixed image sizes) this
leaves hundreds of rows a few percent short, and no re-pack of those rows alone can fix it. The search
frees the least filled rows, then walks every other row and swaps up to two of its items for up to two
free items whenever that fills the row more (so the free items get smaller), and finally places the free
items by first-fit decreasing into the rows' space and new rows. Each round keeps the plan when it has no
more rows; it stops at the target, after ``max_rounds`` or when a round frees no fewer rows.

Works item by item in Python with numpy lookups per row, so it is only applied to a pool of rows (the
engine's slack rows plus spread full rows, a few thousand rows at most) and to small sets.
"""

from __future__ import annotations

import numpy as np

MAX_ROW_ITEMS = 8  # rows with more items only take free items (no swaps): many small items fill rows anyway
MAX_WORK = 150_000  # row visits times swap candidates per search (~1 s); a count, so deterministic


def _best_move(items: list[int], space: int, free: np.ndarray, pair_sums: np.ndarray, pair_idx: np.ndarray):
    """The swap of <= 2 row items for <= 2 free items that fills the row most: (gain, out, into) or None.

    ``free`` holds free sizes ascending, ``pair_sums`` the sums of free pairs ascending with their
    positions in ``pair_idx``; ``out``/``into`` are positions in the row / in ``free``.
    """
    best = None
    removals: list[tuple[int, tuple[int, ...]]] = [(0, ())]
    if len(items) <= MAX_ROW_ITEMS:
        removals += [(items[a], (a,)) for a in range(len(items))]
        removals += [
            (items[a] + items[b], (a, b)) for a in range(len(items)) for b in range(a + 1, len(items))
        ]
    for removed, out in removals:
        limit = removed + space
        # one free item
        k = int(np.searchsorted(free, limit, side="right")) - 1
        if k >= 0 and free[k] > removed:
            gain = int(free[k]) - removed
            if best is None or gain > best[0]:
                best = (gain, out, (k,))
        if len(pair_sums):
            k = int(np.searchsorted(pair_sums, limit, side="right")) - 1
            if k >= 0 and pair_sums[k] > removed:
                gain = int(pair_sums[k]) - removed
                if best is None or gain > best[0]:
                    best = (gain, out, tuple(int(i) for i in pair_idx[k]))
        if best is not None and best[0] == space:
            break  # the row is exactly full: nothing fills it more
    return best


def _pairs(free: np.ndarray, max_free: int) -> tuple[np.ndarray, np.ndarray]:
    m = len(free)
    if m < 2 or m > max_free:
        return np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    a, b = np.triu_indices(m, 1)
    sums = free[a] + free[b]
    order = np.argsort(sums, kind="stable")
    return sums[order], np.stack([a[order], b[order]], axis=1)


def swap_search(
    sizes: np.ndarray,
    row_of: np.ndarray,
    num_rows: int,
    capacity: int,
    target: int,
    max_rounds: int = 30,
    free_rows: int = 4,
    max_free: int = 400,
) -> tuple[np.ndarray, int]:
    """Improve a packing of items ``sizes`` (``row_of[i]`` its row); returns (row_of, rows), never worse."""
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    for i in np.argsort(row_of, kind="stable").tolist():
        rows[int(row_of[i])].append(i)
    size = sizes.tolist()
    best_rows, best_row_of = num_rows, row_of
    work = 0
    for _ in range(max_rounds):
        if work > MAX_WORK or len(rows) <= target:
            break
        fills = [sum(size[i] for i in r) for r in rows]
        order = sorted(range(len(rows)), key=lambda r: (fills[r], r))
        freed = set(order[:free_rows])
        free_ids = [i for r in order[:free_rows] for i in rows[r]]
        rows = [r for k, r in enumerate(rows) if k not in freed]
        fills = [f for k, f in enumerate(fills) if k not in freed]
        free_ids.sort(key=lambda i: (size[i], i))
        dirty = True
        for r in range(len(rows)):
            if fills[r] == capacity or not free_ids:
                continue
            if dirty:
                free = np.array([size[i] for i in free_ids], dtype=np.int64)
                pair_sums, pair_idx = _pairs(free, max_free)
                dirty = False
            items = [size[i] for i in rows[r]]
            work += 1 + (len(items) * (len(items) + 1) // 2 if len(items) <= MAX_ROW_ITEMS else 0)
            move = _best_move(items, capacity - fills[r], free, pair_sums, pair_idx)
            if move is None:
                continue
            gain, out, into = move
            taken = [free_ids[k] for k in into]
            given = [rows[r][a] for a in out]
            rows[r] = [i for a, i in enumerate(rows[r]) if a not in out] + taken
            fills[r] += gain
            for k in sorted(into, reverse=True):
                free_ids.pop(k)
            for i in given:
                free_ids.insert(_insert_at(free_ids, size, i), i)
            dirty = True
        _first_fit(rows, fills, free_ids, size, capacity)
        if len(rows) < best_rows:
            best_rows = len(rows)
            best_row_of = np.empty(len(sizes), dtype=np.int64)
            for r, members in enumerate(rows):
                best_row_of[members] = r
        elif len(rows) > best_rows + free_rows:
            break
    return best_row_of, best_rows


def _first_fit(
    rows: list[list[int]], fills: list[int], free_ids: list[int], size: list[int], capacity: int
) -> None:
    """Place the free items: first fit (largest first) into the rows' space, then new rows."""
    for i in sorted(free_ids, key=lambda i: (-size[i], i)):
        for r in range(len(rows)):
            if fills[r] + size[i] <= capacity:
                rows[r].append(i)
                fills[r] += size[i]
                break
        else:
            rows.append([i])
            fills.append(size[i])


def _insert_at(free_ids: list[int], size: list[int], item: int) -> int:
    lo, hi = 0, len(free_ids)
    key = (size[item], item)
    while lo < hi:
        mid = (lo + hi) // 2
        if (size[free_ids[mid]], free_ids[mid]) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo
