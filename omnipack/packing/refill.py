"""Subset-sum refill: pack rows one at a time, each filled as full as any subset of the items left allows.

A greedy decreasing fit (BFD/FFD) places each item for good, so on mixes of large and mid-sized items it
strands mid-sized items at the end in rows nothing left can top up. The refill (Gupta and Ho's "minimum
bin slack") seeds a row with the largest item left and completes it with the subset of the remaining
items whose sum is closest to the row width, found exactly by a bounded subset-sum over length classes
(Python integers as bitsets, counts split in powers of two). When several subsets tie it prefers the one
of larger items, keeping small items for later rows, where they close gaps.

It works on length classes: once a row's pattern (items per class) is found, the same pattern is
repeated while its items last and its seed is still the largest item. A repeat fills exactly as much as
the first copy, and no other subset of what is left could fill more (the best sum can only shrink as
items go), so this is the row-by-row algorithm, at one subset-sum per distinct pattern.
"""

from __future__ import annotations

import numpy as np


def _best_fill(values: list[int], counts: list[int], space: int) -> tuple[list[int], int]:
    """Items to take per class (values descending) for the largest total <= ``space``, and the work done
    (bitset shifts times their length in 64-bit words).

    Ties go to subsets of larger items: the backtrack drops every small-class chunk it can do without.
    """
    reachable = 1
    mask = (1 << (space + 1)) - 1
    chunks: list[tuple[int, int, int]] = []  # (class, size, items)
    before: list[int] = []  # reachable sums before each chunk
    full = False
    for j, (v, c) in enumerate(zip(values, counts, strict=True)):
        c = min(c, space // v)
        step = 1
        while c > 0 and not full:
            take = min(step, c)
            c -= take
            step *= 2
            before.append(reachable)
            reachable = (reachable | (reachable << (v * take))) & mask
            chunks.append((j, v * take, take))
            full = bool(reachable >> space)
        if full:
            break
    target = reachable.bit_length() - 1
    taken = [0] * len(values)
    for (j, size, take), prior in zip(reversed(chunks), reversed(before), strict=True):
        if not target:
            break
        if (prior >> target) & 1:
            continue  # reachable with larger items only
        taken[j] += take
        target -= size
    return taken, len(chunks) * (space // 64 + 1)


def refill_classes(
    values: np.ndarray, counts: np.ndarray, capacity: int, max_work: int | None = None
) -> tuple[np.ndarray, int] | None:
    """Minimum-slack packing of length classes (``values`` strictly descending, ``counts`` per class).

    Returns ``(slot_rows, num_rows)`` like ``greedy.bfd_classes``: the row of every item in class order;
    None once the subset-sums' work (see ``_best_fill``) passes ``max_work``, which bounds the time on
    inputs with many distinct lengths and few repeated patterns (a count, so the outcome is deterministic).
    """
    vals = [int(v) for v in values]
    left = [int(c) for c in counts]
    num_classes = len(vals)
    slot_parts: list[list[np.ndarray]] = [[] for _ in range(num_classes)]
    num_rows = 0
    first = 0
    work = 0
    while True:
        while first < num_classes and not left[first]:
            first += 1
        if first == num_classes:
            break
        left[first] -= 1
        space = capacity - vals[first]
        # Candidate classes: still available and small enough for the space left.
        cand = [j for j in range(first, num_classes) if left[j] and vals[j] <= space]
        taken: list[int] = []
        if cand:
            taken, cost = _best_fill([vals[j] for j in cand], [left[j] for j in cand], space)
            work += cost
            if max_work is not None and work > max_work:
                return None
        pattern = {first: 1}
        for j, t in zip(cand, taken, strict=True):
            if t:
                pattern[j] = pattern.get(j, 0) + t
        left[first] += 1
        repeats = min(left[j] // m for j, m in pattern.items())
        rows = np.arange(num_rows, num_rows + repeats, dtype=np.int64)
        num_rows += repeats
        for j, m in pattern.items():
            left[j] -= m * repeats
            slot_parts[j].append(np.repeat(rows, m) if m > 1 else rows)
    flat = [np.concatenate(parts) for parts in slot_parts if parts]
    return (np.concatenate(flat) if flat else np.zeros(0, np.int64)), num_rows
