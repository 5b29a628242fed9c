"""Empty-a-row local search: remove a row and push its items into the free space of other rows by
exchanges, until nothing of it is left.

A one-pass packer (greedy or refill) ends with rows of mid-sized items whose free space nothing left can
fill, although the items of one such row would fit into the free space of the others taken together. The
search (after Levine and Ducatelle's bin-packing local search) takes the emptiest row's items into a free
set F, then visits the other rows and applies the best exchange of up to two row items S for up to two
free items T that still fits the row: ``sum(T) - sum(S)`` as large as possible and > 0 (the row takes
more, F shrinks), or = 0 with ``|S| > |T|`` (F gets the same amount in more, smaller pieces, which fit
smaller gaps). Every applied move lowers ``(sum F, -|F|)`` lexicographically, so each attempt ends. When
F empties a row is gone and the next emptiest is tried; an attempt that gets stuck is undone, and the
search stops after a few failures or once its work (subset lookups, a count, so deterministic) passes
the cap.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import combinations

MAX_FAILED_ATTEMPTS = 30


def _subsets(items: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(sum, positions) of every subset of 1 or 2 of ``items``, sorted by sum then size (singles first)."""
    out = [(v, (i,)) for i, v in enumerate(items)]
    out += [(items[i] + items[j], (i, j)) for i, j in combinations(range(len(items)), 2)]
    out.sort(key=lambda s: (s[0], len(s[1])))
    return out


def _best_exchange(
    row: list[int], slack: int, free: list[tuple[int, tuple[int, ...]]], free_sums: list[int]
) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """Best (gain, row positions out, free positions in) for one row, or None if no move is acceptable."""
    best = None
    outs = [(0, ())] + [(v, (i,)) for i, v in enumerate(row)]
    outs += [(row[i] + row[j], (i, j)) for i, j in combinations(range(len(row)), 2)]
    for out_sum, out_pos in outs:
        k = bisect_right(free_sums, out_sum + slack) - 1
        if k < 0:
            continue
        in_sum, in_pos = free[k]
        gain = in_sum - out_sum
        if gain < 0 or (gain == 0 and len(out_pos) <= len(in_pos)):
            continue
        key = (gain, len(out_pos) - len(in_pos))
        if best is None or key > best[0]:
            best = (key, out_pos, in_pos)
    if best is None:
        return None
    return best[0][0], best[1], best[2]


def empty_rows(rows: list[list[int]], capacity: int, rows_to_remove: int, max_work: int) -> list[list[int]]:
    """Try to remove up to ``rows_to_remove`` rows from ``rows`` (item sizes per row, each within
    ``capacity``) by the exchanges described above; returns the (possibly) shorter list of rows.

    Items keep their sizes, so the caller maps sizes back to items. ``max_work`` caps the subset lookups.
    """
    rows = [list(r) for r in rows]
    fills = [sum(r) for r in rows]
    work = 0
    removed = 0
    failures = 0
    skip: set[int] = set()  # rows whose emptying failed (by their content, not position)
    while removed < rows_to_remove and failures < MAX_FAILED_ATTEMPTS and work < max_work and len(rows) > 1:
        candidates = [i for i in range(len(rows)) if tuple(sorted(rows[i])) not in skip]
        if not candidates:
            break
        victim = min(candidates, key=lambda i: (fills[i], i))
        snapshot = ([list(r) for r in rows], list(fills))
        free = rows.pop(victim)
        victim_key = tuple(sorted(free))
        fills.pop(victim)
        improved = True
        while free and improved and work < max_work:
            improved = False
            for r in range(len(rows)):
                if not free:
                    break
                subsets = _subsets(free)
                sums = [s for s, _ in subsets]
                work += 1 + len(rows[r]) * (len(rows[r]) + 1) // 2
                move = _best_exchange(rows[r], capacity - fills[r], subsets, sums)
                if move is None:
                    continue
                gain, out_pos, in_pos = move
                row = rows[r]
                taken_out = [row[i] for i in out_pos]
                taken_in = [free[i] for i in in_pos]
                for i in sorted(out_pos, reverse=True):
                    row.pop(i)
                for i in sorted(in_pos, reverse=True):
                    free.pop(i)
                row.extend(taken_in)
                free.extend(taken_out)
                fills[r] += gain
                improved = True
        if free:
            rows, fills = snapshot
            skip.add(victim_key)
            failures += 1
        else:
            removed += 1
    return rows
