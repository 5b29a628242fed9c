"""``pack``: validate lengths, choose the algorithm and scope, build the plan."""

from __future__ import annotations

import operator

import numpy as np

from .balance import balance_costs
from .bounds import best_bound, constrained_lower_bounds, lower_bounds
from .budget_first import budget_first_pack
from .constraints import (
    PackConstraints,
    constrained_bfd,
    constrained_pack,
    scarcest_budget,
    scarcest_first_pack,
)
from .greedy import bfd_classes, ffd_classes
from .patterns import LpLimits, lp_pattern_pack, lp_rows_bound
from .plan import PackPlan, build_plan
from .refill import refill_classes
from .swap import swap_search
from .vector_fill import LEVEL_BUDGETS, LEVEL_CAP, balanced_fill, fill_levels, fits_balanced_fill
from .vector_patterns import constrained_lp_pack
from .vector_swap import MAX_WORK as VECTOR_SWAP_MAX_WORK
from .vector_swap import bisected_exchanges, pooled_vector_swap

ALGORITHMS = ("bfd", "ffd")
EXACT_CONSTRAINED_MAX = 4096  # samples up to which the exact constrained BFD also runs (~0.1 s)
SECOND_ORDER_MAX = 250_000  # samples up to which the constrained packer also tries its other item order
# The greedy start that buckets rows by the scarcest budget, not the tokens (``scarcest_first_pack``): on
# larger plans chosen, or not, on a subsample of START_SAMPLE samples.
SCARCEST_FIRST = "bfd+constraints(scarcest first)"
BUDGET_FIRST = "budget-first+constraints"  # the search from ``budget_first``'s start (with "+swap")
START_SAMPLE = 50_000
REFILL_TARGET = 0.0005  # over the bound after the slack-row refill, refill the whole set (when small)
FULL_REFILL_MAX = 2_000_000  # samples up to which the whole-set refill is tried
REFILL_MAX_WORK = 8_000_000  # subset-sum work (bitset words shifted) per refill: ~0.5-1.5 s
POOL_SHARES = (0.5, 1, 2, 4)  # full rows mixed into the FFD re-pack, per row that is not full
MIX_MAX_SLACK_SHARE = 0.25  # the mixed re-pack runs when at most this share of rows is not exactly full
SWAP_MAX_ROWS = 600  # rows in the swap search's pool (its rounds walk every pool row in Python)
PAIR_SCAN_MAX = 4096  # samples up to which the large-item pairing scan runs (a refill per threshold: seconds)
PAIR_THRESHOLDS = 16  # thresholds tried by the pairing scan (spread evenly over the lengths above W/3)
PAIR_MIN_SHARE = 0.2  # the scan runs when at least this share of items is above W/3 (rows of 2-4 items)
# Samples up to which a plan still above the bound gets the LP-guided step. The step works on length classes
# (its LP, knapsacks and rounding are bounded by LpLimits' counts), so the sample count only adds linear
# numpy work: 1M crops in rows of 2-4 take 3-4 s and 3.3% fewer rows than the greedy plan (benchmarks/README.md).
# A count, not a clock, so plans stay deterministic; plans at the bound (the 4M text set) never reach it.
LP_MAX_SAMPLES = 1_000_000
# Distinct lengths up to which it runs (one LP row each; the greedy pricing walks them, an exact pricing
# larger than LpLimits.max_pricing_cells is not run). Above LP_MANY_CLASSES a plan takes 10-35 s at W=32768
# (benchmarks/README.md), so there it runs only on plans more than LP_MANY_CLASSES_GAP over the bound.
LP_MAX_CLASSES = 3_000
LP_MANY_CLASSES = 2_000
LP_MANY_CLASSES_GAP = 0.001
# Samples up to which a constrained plan above the vector bound gets the vector pattern LP (an LP row per
# distinct item vector, which on media sets is every item; 2-10 s at 200-300 samples, see benchmarks/README.md).
CONSTRAINED_LP_MAX_SAMPLES = 300
# Or at any size where the items take at most this many distinct vectors (the LP's rows, so its cost): text
# of 52 lengths under a cap of 7 (12,123 samples, W=4096) from 2,072 rows, 10% over, to 1,888, its LP bound,
# in 0.5 s (benchmarks/README.md).
CONSTRAINED_LP_MAX_CLASSES = 300
# Rows up to which a constrained plan above the vector bound gets the swap search whole; a larger plan gets it
# on a pool of this many of its rows (``vector_swap.pooled_vector_swap``; its work is a count, ~1-3 s).
# 0 turns the step off. A larger plan gets up to VECTOR_SWAP_PASSES pools, one after another while they cut
# rows: on 50k-sample media plans each pass still cuts rows (omni: 6,928 to 6,897, 6,879, 6,866, ...).
VECTOR_SWAP_POOL_ROWS = 2500
VECTOR_SWAP_PASSES = 6
# The same under a sample cap alone, where the search finds exchanges by bisection
# (``vector_swap.bisected_exchanges``) and a pool of 2,500 rows cuts rows fastest (short text, ~11 samples
# a row, 100,000 samples: ~9 rows/s, against ~2.5 for pools of 500): there 22 passes took the plan to 0.18%
# over the bound in 32 s, where 6 left it at 0.46% in 59 s (benchmarks/README.md).
VECTOR_SWAP_PASSES_BISECTED = 30
# Plans of fewer samples a row on average take neither those passes nor the deep passes above
# DEEP_MAX_SAMPLES: their rows mostly take the full comparison (``vector_swap.BISECT_MIN_CHECKS``), and a
# reader measured 1.5-2x the time there (~3 samples a row, cap 64) for a few rows.
BISECTED_MIN_SAMPLES_PER_ROW = 6
# Then, while a plan larger than one pool is still above the bound, pools of VECTOR_SWAP_SMALL_POOL_ROWS rows
# (each size in turn, the next once the last stops, with a budget of its own):
# a small pool reaches its own bound within its work limit, so more rows go per second (omni 200k: ~70 rows a
# pass of 500 rows, ~32 a pass of 2,500); the large pools come first, as their wider exchanges close the last
# rows of mid-sized plans (two omni 50k plans: at the bound and 1 row over, against 1 and 2 over with small
# pools alone). A small pool's work limit starts at the search's scaled to its size (~0.6 s a pass) and
# doubles, up to the whole, after a pass that cut nothing; its spread half shifts every pass, so the next pass
# searches other rows. They stop after VECTOR_SWAP_SMALL_IDLE passes in a row at the whole limit that cut
# nothing, or once the limits given out would pass VECTOR_SWAP_SMALL_BUDGET whole searches (0: no small
# pools). On the 1M-sample sets (benchmarks/README.md) omni spends the budget on ~170 cheap passes, to 0.07%
# over the bound; image-text's stall after ~60, doubled ones go on to 0.07%. Pools of 125 rows after those of
# 500 close rows the larger pools leave (omni 1M: 136,813 to 136,771 rows, 2.3 to 3.0 min a plan; image-text
# 50k: 10,978 to 10,973, +3 s); pools of 125 alone do worse at 1M (image-text 218,925 against 218,860).
VECTOR_SWAP_SMALL_POOL_ROWS = (500, 125)
VECTOR_SWAP_SMALL_BUDGET = 34  # whole searches' work (vector_swap.MAX_WORK) per size: ~34 x 3 s at 1M samples
VECTOR_SWAP_SMALL_IDLE = 3
# The spread's shift per pass, in gaps between its rows: the golden ratio, whose multiples mod 1 never repeat
# and spread evenly over the gap.
SPREAD_STEP = 0.6180339887498949
# A plan under a sample cap alone (exchanges by bisection) whose start has more than VECTOR_SWAP_POOL_ROWS rows
# and is more than SPLIT_MIN_GAP over the vector bound, and which every step above leaves over ``deep_goal``, is
# packed again in groups of about SPLIT_ROWS rows: its samples dealt in turn by length, each group packed by
# every step (the swap search takes it whole), then up to SPLIT_MERGE_PASSES swap passes over the merged plan's
# least filled rows; the plan with fewer rows wins. Pools of a large plan's rows hold its least filled rows,
# whose samples are not a copy of the whole set; a group is. Short text under a cap of 12 (start 2.1-2.7% over)
# at 260,000 samples: 0.69% over to 0.07%. It runs only after the whole plan's steps: on other capped text
# those reach the bound where the groups end a few rows over it, each group's last row partly filled (a
# reviewer's sweep: 6 of 11 plans 1-5 rows more). 0: off (benchmarks/README.md).
SPLIT_ROWS = 2000
SPLIT_MIN_GAP = 0.01
SPLIT_MERGE_PASSES = 6
# A plan more than MORE_FILLS_MIN_GAP over the vector bound after the greedy starts and the balanced fill also
# gets the fills that level every budget and the cap, or the binding ones only, and, where the amounts take
# many vectors (patch counts), fills over buckets of them (``vector_fill.balanced_fill``, bucketed). Under a
# cap beside media budgets the greedy starts end 10-33% over the bound (benchmarks/README.md); 0: off.
MORE_FILLS_MIN_GAP = 0.02
# A constrained plan of up to this many rows still above the vector bound after the swap search gets a second
# search, from the start by the scarcest budget alone (``budget_first``: its 1-D plan, the other limits
# restored). On the sweeps of benchmarks/README.md it takes the three image-text plans of 200-2,000 samples
# (45-441 rows) left a row over their bound to it, so to the optimum, in 0.1-1 s more; on the plans of 5k-10k
# samples (1,080-2,190 rows) it gained no row and took 1-2 s more. 0: off. Plans of more samples a row cost its
# search more: near 1,000 rows, 2-3 s more at 10k-19k samples for no row, so it runs only up to
# BUDGET_FIRST_MAX_SAMPLES samples (the gains above were all at 2,000 samples or fewer).
BUDGET_FIRST_MAX_ROWS = 1000
BUDGET_FIRST_MAX_SAMPLES = 5000
# A constrained plan of up to DEEP_MAX_ROWS rows (as VECTOR_SWAP_POOL_ROWS: the plans the swap search takes
# whole; larger ones get the pools of VECTOR_SWAP_SMALL_POOL_ROWS) and DEEP_MAX_SAMPLES samples, still more
# than DEEP_TOLERANCE_PER_MILLE per mille and more than one row above the vector bound (``deep_goal``) after
# every other step, gets up to DEEP_PASSES more passes of the swap search over pools of DEEP_POOL_ROWS rows
# (the spread shifted every pass), each with DEEP_WORK times the search's work limit, ending at the goal.
# On the sweeps of benchmarks/README.md (image-text and omni, 5,000 and 10,000 samples, 32 seeds each) it
# took the 10 image-text plans left 0.14-0.23% over to within 0.1%, in 1-14 s more (the plans within the
# goal never reach it). Where it gains nothing it costs up to 4 passes, ~11-13 s at 5,000 samples (bimodal
# image-text, ~1,670 rows); a plan searched whole stops after a pass that cut nothing (the next would repeat
# it). One row over is left alone: on two 2,500-sample plans (~550 rows) a pass found no row there (~3 s
# each); the bound may not be tight. A pass costs up to ~13 s at its work limit, more with more samples a
# row (text under a sample cap of 12, before the balanced fill levelled the cap: 140 s for 4 passes at
# 20,000 samples), so DEEP_MAX_SAMPLES; but not under a sample cap alone, whose exchanges the search finds
# by bisection (``vector_swap.bisected_exchanges``): there a pass costs per row what it does on media rows,
# and short text at 20,000 samples (~11 a row under a cap of 12) ends within 0.05% in 1-5 s.
# DEEP_PASSES = 0: off.
DEEP_TOLERANCE_PER_MILLE = 1
DEEP_MAX_ROWS = VECTOR_SWAP_POOL_ROWS  # the plans the swap search takes whole
DEEP_MAX_SAMPLES = 10_000
DEEP_POOL_ROWS = 1000
DEEP_PASSES = 4
DEEP_WORK = 10
# Plans up to this many samples still above the bound after the slack-row refill first ask the pattern LP for
# its bound, on a small budget (~0.02-0.1 s): a plan it proves optimal skips the later steps, which cannot
# remove a row from it and cost 0.1-0.2 s on such plans (the W=4096 repack of benchmarks/README.md).
EARLY_LP_MAX_SAMPLES = 4096
# 20 LP solves add at most 20 * PATTERNS_PER_PRICING columns: the knapsack cells and the solves are what bind.
EARLY_LP_LIMITS = LpLimits(max_knapsack_work=12_000_000, max_pricing_cells=12_000_000, max_lp_solves=20)


def validate_lengths(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Return ``lengths`` as int64 after checking 0 < length <= capacity (errors name the first offender)."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero((arr <= 0) | (arr > capacity))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"sample {i} has length {int(arr[i])}, outside (0, capacity={capacity}]")
    return arr


def _descending_order(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Sample indices by descending length, ties by ascending index."""
    if capacity < 2**16:
        # A stable sort of a 16-bit key is a radix sort in numpy: O(n).
        return np.argsort((capacity - lengths).astype(np.uint16), kind="stable")
    return np.argsort(-lengths, kind="stable")


def _classes(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct lengths, descending, and how many samples have each."""
    count_at = np.bincount(lengths, minlength=capacity + 1)
    values = np.flatnonzero(count_at)[::-1]
    return values, count_at[values]


def _assign_by_classes(lengths: np.ndarray, capacity: int, algorithm: str) -> tuple[np.ndarray, int]:
    """Run a counting BFD/FFD and map its per-class slots back to sample indices."""
    values, counts = _classes(lengths, capacity)
    run = bfd_classes if algorithm == "bfd" else ffd_classes
    slot_rows, num_rows = run(values, counts, capacity)
    return _slots_to_samples(slot_rows, lengths, capacity), num_rows


def _slots_to_samples(slot_rows: np.ndarray, lengths: np.ndarray, capacity: int) -> np.ndarray:
    """``slot_rows`` lists rows in class order (length desc, then index asc): give each sample its row."""
    row_of = np.empty(len(lengths), dtype=np.int32)
    row_of[_descending_order(lengths, capacity)] = slot_rows
    return row_of


def _repack_rows(
    slot_rows: np.ndarray,
    num_rows: int,
    values: np.ndarray,
    counts: np.ndarray,
    capacity: int,
    repack: np.ndarray,
    packer,
) -> tuple[np.ndarray, int]:
    """Keep the rows not marked in ``repack`` (renumbered densely, in order) and re-pack the items of the
    marked rows with ``packer(values, counts)`` (class level, returns ``(slot_rows, rows)`` or None)."""
    slot_class = np.repeat(np.arange(len(values)), counts)
    pool = repack[slot_rows]
    if not pool.any():
        return slot_rows, num_rows
    keep = ~repack
    kept = int(keep.sum())
    new_id = np.cumsum(keep) - 1
    pool_counts = np.bincount(slot_class[pool], minlength=len(values))
    present = pool_counts > 0
    packed = packer(values[present], pool_counts[present])
    if packed is None:
        return slot_rows, num_rows
    pool_slots, pool_rows = packed
    out = np.empty_like(slot_rows)
    out[~pool] = new_id[slot_rows[~pool]]
    out[pool] = pool_slots + kept  # pool slots are in class order, as the class packers emit them
    return out, kept + pool_rows


def _row_fill(slot_rows: np.ndarray, num_rows: int, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return np.bincount(slot_rows, weights=np.repeat(values, counts), minlength=num_rows)


def _refill_slack_rows(
    slot_rows: np.ndarray, num_rows: int, values: np.ndarray, counts: np.ndarray, capacity: int
) -> tuple[np.ndarray, int]:
    """Keep the exactly full rows of a class-level packing and re-pack the items of all other rows with
    the subset-sum refill (a small pool: greedy fits leave their waste in few rows)."""
    slack = _row_fill(slot_rows, num_rows, values, counts) < capacity
    return _repack_rows(
        slot_rows,
        num_rows,
        values,
        counts,
        capacity,
        slack,
        lambda v, c: refill_classes(v, c, capacity, max_work=REFILL_MAX_WORK),
    )


def _mix_and_repack(
    slot_rows: np.ndarray, num_rows: int, values: np.ndarray, counts: np.ndarray, capacity: int
) -> tuple[np.ndarray, int]:
    """Re-pack the rows that are not exactly full together with evenly spread exactly full rows, by FFD
    and by the subset-sum refill; the best of a few pool sizes.

    A refill or a greedy fit ends with rows of the few lengths left over, which no exchange among
    themselves can top up (on the bimodal mix: three ~1.2k items and 300-500 tokens free, nothing that
    small left). Full rows from all over the plan bring back the variety of lengths a re-pack needs to
    end with full rows. Each re-pack keeps the other rows, so it works on a few thousand rows at most.
    """
    slack = _row_fill(slot_rows, num_rows, values, counts) < capacity
    full_rows = np.flatnonzero(~slack)
    best = (slot_rows, num_rows)
    if not slack.any() or slack.sum() > MIX_MAX_SLACK_SHARE * num_rows:
        return best  # nothing to do, or no full rows to speak of: the re-pack would redo the whole set
    for share in POOL_SHARES:
        take = min(len(full_rows), int(share * slack.sum()) + 64)
        repack = slack.copy()
        repack[full_rows[np.linspace(0, len(full_rows) - 1, take).round().astype(np.int64)]] = True
        for packer in (
            lambda v, c: ffd_classes(v, c, capacity),
            lambda v, c: refill_classes(v, c, capacity, max_work=REFILL_MAX_WORK),
        ):
            out = _repack_rows(slot_rows, num_rows, values, counts, capacity, repack, packer)
            if out[1] < best[1]:
                best = out
    return best


def _pair_large_then_refill(
    values: np.ndarray, counts: np.ndarray, capacity: int, bound: int
) -> tuple[np.ndarray, int] | None:
    """Pair the largest items among themselves (FFD), refill the rest, for a scan of thresholds; the best.

    On mixes of rows of 2-4 items (most items above W/3, which at most two share a row), a subset-sum fill
    completes each large seed exactly with two smaller items while it can, and so spends the small items
    that the mid-sized ones need later: the plan ends with hundreds of pairs of mid-sized items, each row
    a third empty. The optimum (the Gilmore-Gomory LP's patterns) does the opposite: the largest items share
    rows with each other, at some waste, and the others form large + medium + small triples. Which items
    count as "largest" depends on the mix, so a threshold t is scanned: items above t are packed by FFD
    (pairs), the rest by the refill, and the rows that are not full are refilled together.
    """
    large = values[values * 3 > capacity]
    if not len(large) or counts[values * 3 > capacity].sum() < PAIR_MIN_SHARE * counts.sum():
        return None
    spread = np.linspace(0, len(large) - 1, min(PAIR_THRESHOLDS, len(large))).round().astype(np.int64)
    thresholds = large[spread]
    best = None
    for t in np.unique(thresholds).tolist():
        above = values > t
        if not above.any():
            continue
        paired_slots, paired_rows = ffd_classes(values[above], counts[above], capacity)
        rest = refill_classes(values[~above], counts[~above], capacity, max_work=REFILL_MAX_WORK)
        if rest is None:
            return best
        slots = np.concatenate([paired_slots, rest[0] + paired_rows])  # class order: values descending
        out = _refill_slack_rows(slots, paired_rows + rest[1], values, counts, capacity)
        if best is None or out[1] < best[1]:
            best = out
            if best[1] <= bound:
                break
    return best


def _swap_pool(
    slot_rows: np.ndarray, num_rows: int, values: np.ndarray, counts: np.ndarray, capacity: int
) -> tuple[np.ndarray, int]:
    """Re-pack the least filled rows plus evenly spread exactly full rows (at most SWAP_MAX_ROWS) by FFD,
    then improve that by the swap local search (``swap.swap_search``)."""
    fill = _row_fill(slot_rows, num_rows, values, counts)
    slack_rows = np.flatnonzero(fill < capacity)
    if not len(slack_rows):
        return slot_rows, num_rows
    slack_rows = slack_rows[np.argsort(fill[slack_rows], kind="stable")][: SWAP_MAX_ROWS // 2]
    full_rows = np.flatnonzero(fill == capacity)
    take = min(len(full_rows), SWAP_MAX_ROWS - len(slack_rows))
    repack = np.zeros(num_rows, dtype=bool)
    repack[slack_rows] = True
    if take:
        repack[full_rows[np.linspace(0, len(full_rows) - 1, take).round().astype(np.int64)]] = True

    def packer(v: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, int]:
        start, rows = ffd_classes(v, c, capacity)
        sizes = np.repeat(v, c)
        return swap_search(sizes, start, rows, capacity, target=-(-int(sizes.sum()) // capacity))

    return _repack_rows(slot_rows, num_rows, values, counts, capacity, repack, packer)


def _assign(
    lengths: np.ndarray,
    capacity: int,
    algorithm: str,
    constraints: PackConstraints | None,
    improve: bool,
    lp: bool = True,
) -> tuple[np.ndarray, int, str]:
    """``(row_of, num_rows, algorithm used)``; ``lp`` is ``_improve``'s (1-D plans)."""
    if constraints is not None:
        return _assign_constrained(lengths, capacity, constraints, improve)
    values, counts = _classes(lengths, capacity)
    run = bfd_classes if algorithm == "bfd" else ffd_classes
    slot_rows, num_rows = run(values, counts, capacity)
    used = algorithm
    if improve and algorithm == "bfd":
        slot_rows, num_rows, used = _improve(slot_rows, num_rows, lengths, values, counts, capacity, lp)
    return _slots_to_samples(slot_rows, lengths, capacity), num_rows, used


def _assign_constrained(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, improve: bool
) -> tuple[np.ndarray, int, str]:
    """The constrained fast best fit; with ``improve``, the steps that may cut rows (the other item order,
    the start by the scarcest budget, the balanced fill, the exact BFD, the swap search on plans above the
    vector bound, on plans of up to BUDGET_FIRST_MAX_ROWS rows still above it the swap search from the start
    by that budget alone, on small plans (or of few item vectors) still above it the vector pattern LP, on
    plans of up to DEEP_MAX_ROWS rows still above ``deep_goal`` the deep passes); the plan with the fewest
    rows wins, ties keep the earlier one. Above SECOND_ORDER_MAX samples there is one greedy start, chosen
    on a subsample (``_large_plan_start``). A start far over the bound also gets the other fills
    (``_more_fills_if_fewer``). A large plan under a sample cap alone whose start was far over the bound and
    whose steps left it over ``deep_goal`` is packed again in stratified groups, each by these steps
    (``_split_if_fewer``)."""
    if not improve:
        # Windows (bounded memory) take the fast best fit, and the balanced fill where it fits (a few ms per
        # thousand samples): under a sample cap a best fit by tokens alone ends 20-33% over the bound.
        plan = (*constrained_pack(lengths, capacity, constraints), "bfd+constraints")
        return _filled_if_fewer(lengths, capacity, constraints, plan, bound=0)
    if len(lengths) > SECOND_ORDER_MAX:
        bound = _constrained_bound(lengths, capacity, constraints)
        start = _large_plan_start(lengths, capacity, constraints)
        tried = (LEVEL_BUDGETS,)  # by ``_large_plan_start``, where the amounts take few vectors
        row_of, num_rows, name = _more_fills_if_fewer(lengths, capacity, constraints, start, bound, tried)
    else:
        row_of, num_rows = constrained_pack(lengths, capacity, constraints)
        name = "bfd+constraints"
        bound = _constrained_bound(lengths, capacity, constraints)
        if num_rows > bound:
            plan = _other_constrained_packers(lengths, capacity, constraints, (row_of, num_rows, name), bound)
            row_of, num_rows, name = plan
    start = (num_rows, name)
    if num_rows > bound and VECTOR_SWAP_POOL_ROWS:
        # The greedy packers leave rows short in the scarcest budget: exchanges between rows, budgets kept.
        swapped = _vector_swap_passes(lengths, capacity, constraints, row_of, num_rows, bound)
        if swapped[1] < num_rows:
            row_of, num_rows, name = swapped[0], swapped[1], name + "+swap"
    small = num_rows <= BUDGET_FIRST_MAX_ROWS and len(lengths) <= BUDGET_FIRST_MAX_SAMPLES
    if num_rows > bound and small and VECTOR_SWAP_POOL_ROWS:
        other = _budget_first_swapped(lengths, capacity, constraints, bound)
        if other is not None and other[1] < num_rows:
            row_of, num_rows, name = other[0], other[1], BUDGET_FIRST + "+swap"
    if num_rows > bound and _few_vector_classes(lengths, capacity, constraints):
        # Still above the vector bound on a small plan (or few item vectors): the vector pattern LP, rounded.
        guided = constrained_lp_pack(lengths, capacity, constraints, (row_of, num_rows), lower_bound=bound)
        if guided is not None:
            row_of, num_rows, name = guided[0], guided[1], "lp-patterns+constraints"
    goal = deep_goal(bound)
    affordable = goal < num_rows <= DEEP_MAX_ROWS
    affordable = affordable and _deep_passes_affordable(lengths, capacity, constraints, num_rows)
    if affordable and VECTOR_SWAP_POOL_ROWS:
        deep = _deep_swap_passes(lengths, capacity, constraints, row_of, num_rows, goal)
        if deep[1] < num_rows:
            row_of, num_rows, name = deep[0], deep[1], name + "+deep"
    return _split_if_fewer(lengths, capacity, constraints, start, (row_of, num_rows, name), bound)


def _few_vector_classes(lengths: np.ndarray, capacity: int, constraints: PackConstraints) -> bool:
    """Whether the vector pattern LP runs: at most CONSTRAINED_LP_MAX_SAMPLES samples, or at most
    CONSTRAINED_LP_MAX_CLASSES distinct item vectors (its LP rows; text of a few lengths under a cap)."""
    if len(lengths) <= CONSTRAINED_LP_MAX_SAMPLES:
        return True
    dims, _ = _constrained_dims(lengths, capacity, constraints)
    return len(np.unique(dims, axis=0)) <= CONSTRAINED_LP_MAX_CLASSES


def _split_if_fewer(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    start: tuple[int, str],
    plan: tuple[np.ndarray, int, str],
    bound: int,
) -> tuple[np.ndarray, int, str]:
    """``plan``, or, where it is above ``deep_goal`` and its start (rows, name) one ``_split_pays`` takes, the
    plan packed in stratified groups (``_split_and_merged``) if that has fewer rows."""
    if plan[1] <= deep_goal(bound) or not _split_pays(lengths, capacity, constraints, start[0], bound):
        return plan
    row_of, num_rows = _split_and_merged(lengths, capacity, constraints, start[0], bound)
    return (row_of, num_rows, start[1] + "+split") if num_rows < plan[1] else plan


def _split_pays(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, num_rows: int, bound: int
) -> bool:
    """Whether a plan is packed in stratified groups (``_split_and_merged``): under a sample cap alone, with
    exchanges by bisection (the swap search on), more rows than the swap search takes whole, and a start
    (``num_rows``) more than SPLIT_MIN_GAP over the bound."""
    if not (SPLIT_ROWS and VECTOR_SWAP_POOL_ROWS) or constraints.resources:
        return False
    if num_rows <= max(VECTOR_SWAP_POOL_ROWS, SPLIT_ROWS):
        return False
    if num_rows <= bound * (1 + SPLIT_MIN_GAP):
        return False
    return _bisected_plan(*_constrained_dims(lengths, capacity, constraints), num_rows)


def _split_and_merged(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, num_rows: int, bound: int
) -> tuple[np.ndarray, int]:
    """The plan packed in ceil(``num_rows`` / SPLIT_ROWS) groups of samples dealt in turn by length (each
    group a small copy of the whole set), each group by every step, the groups' rows side by side; then up
    to SPLIT_MERGE_PASSES swap passes over the least filled rows, which hold each group's last ones."""
    groups = _dealt_by_length(lengths, -(-num_rows // SPLIT_ROWS))
    row_of = np.empty(len(lengths), dtype=np.int32)
    total = 0
    for index in groups:
        sub = _take_constraints(constraints, index)
        part, part_rows, _ = _assign_constrained(lengths[index], capacity, sub, improve=True)
        row_of[index] = part + total
        total += part_rows
    dims, caps = _constrained_dims(lengths, capacity, constraints)
    return _large_pool_passes(dims, caps, row_of, total, bound, SPLIT_MERGE_PASSES, stop_rows=0)


def _dealt_by_length(lengths: np.ndarray, count: int) -> list[np.ndarray]:
    """``count`` groups of sample indices (ascending), the samples dealt in turn from the longest (ties by
    index): every group holds the set's lengths in the same proportions."""
    order = np.lexsort((np.arange(len(lengths)), -lengths))
    return [np.sort(order[group::count]) for group in range(count)]


def _deep_passes_affordable(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, num_rows: int
) -> bool:
    """Plans of up to DEEP_MAX_SAMPLES samples; larger ones under a sample cap alone, whose exchanges the
    search finds by bisection (``vector_swap.bisected_exchanges``: a pass costs what it does on media)."""
    if len(lengths) <= DEEP_MAX_SAMPLES:
        return True
    if constraints.resources:
        return False
    return _bisected_plan(*_constrained_dims(lengths, capacity, constraints), num_rows)


def _bisected_plan(dims: np.ndarray, caps: np.ndarray, num_rows: int) -> bool:
    """Whether the search finds this plan's exchanges by bisection (``vector_swap.bisected_exchanges``) and
    its rows hold at least BISECTED_MIN_SAMPLES_PER_ROW samples on average."""
    return len(dims) >= BISECTED_MIN_SAMPLES_PER_ROW * num_rows and bisected_exchanges(dims, caps)


def deep_goal(bound: int) -> int:
    """The rows the deep passes stop at: the vector bound and DEEP_TOLERANCE_PER_MILLE per mille of it, at
    least one row more (integers: no rounding at the edge)."""
    return bound + max(1, bound * DEEP_TOLERANCE_PER_MILLE // 1000)


def _deep_swap_passes(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    row_of: np.ndarray,
    num_rows: int,
    goal: int,
) -> tuple[np.ndarray, int]:
    """Up to DEEP_PASSES swap searches over pools of DEEP_POOL_ROWS rows, DEEP_WORK times the usual work
    each, the pools' spread shifted every pass; stops once the plan has at most ``goal`` rows, or after a
    pass over the whole plan (at most DEEP_POOL_ROWS rows) that cut nothing."""
    dims, caps = _constrained_dims(lengths, capacity, constraints)
    work = DEEP_WORK * VECTOR_SWAP_MAX_WORK
    for pass_ in range(DEEP_PASSES):
        shift = pass_ * SPREAD_STEP % 1.0
        new_row_of, new_rows = pooled_vector_swap(
            dims, caps, row_of, num_rows, goal, DEEP_POOL_ROWS, shift, work
        )
        if new_rows < num_rows:
            row_of, num_rows = new_row_of, new_rows
        elif num_rows <= DEEP_POOL_ROWS:
            break  # the whole plan was searched and nothing changed: the next pass would be the same search
        if num_rows <= goal:
            break
    return row_of, num_rows


def _budget_first_swapped(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, bound: int
) -> tuple[np.ndarray, int] | None:
    """The swap search from the start by the scarcest budget alone (``budget_first.budget_first_pack``); None
    where no budget is scarcer than the tokens."""
    name = scarcest_budget(lengths, capacity, constraints)
    if name is None:
        return None
    dims, caps = _constrained_dims(lengths, capacity, constraints)
    budget = 1 + list(constraints.resources).index(name)  # dims: tokens, then the budgets in their order
    row_of, num_rows = budget_first_pack(dims, caps, budget, _pack_one_budget)
    return _vector_swap_passes(lengths, capacity, constraints, row_of, num_rows, bound)


def _pack_one_budget(amounts: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """The 1-D packer on one budget's amounts: BFD and its improvement steps, without the pattern LP's (they
    take seconds on patch counts, and this plan is only a start)."""
    row_of, num_rows, _ = _assign(amounts, budget, "bfd", None, improve=True, lp=False)
    return row_of, num_rows


def _vector_swap_passes(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    row_of: np.ndarray,
    num_rows: int,
    bound: int,
) -> tuple[np.ndarray, int]:
    """The swap search (``vector_swap.pooled_vector_swap``): once on a plan of at most VECTOR_SWAP_POOL_ROWS
    rows (the whole plan), on a larger plan one pool after another while a pass cuts rows, at most
    VECTOR_SWAP_PASSES (VECTOR_SWAP_PASSES_BISECTED under a sample cap alone), then pools of each
    VECTOR_SWAP_SMALL_POOL_ROWS size in turn, their spread shifted every pass and their work limit doubled
    after a pass that cut nothing, within VECTOR_SWAP_SMALL_BUDGET each (see the constants). Each pool
    takes the rows least filled after the last pass. The passes stop at the bound, and once the plan has at
    most VECTOR_SWAP_POOL_ROWS rows."""
    dims, caps = _constrained_dims(lengths, capacity, constraints)
    passes = VECTOR_SWAP_PASSES_BISECTED if _bisected_plan(dims, caps, num_rows) else VECTOR_SWAP_PASSES
    row_of, num_rows = _large_pool_passes(dims, caps, row_of, num_rows, bound, passes, VECTOR_SWAP_POOL_ROWS)
    if num_rows <= VECTOR_SWAP_POOL_ROWS:  # searched whole or by the large pools: small ones are for more
        return row_of, num_rows
    for pool_rows in VECTOR_SWAP_SMALL_POOL_ROWS:
        row_of, num_rows = _small_pool_passes(dims, caps, row_of, num_rows, bound, pool_rows)
    return row_of, num_rows


def _large_pool_passes(
    dims: np.ndarray,
    caps: np.ndarray,
    row_of: np.ndarray,
    num_rows: int,
    bound: int,
    passes: int,
    stop_rows: int,
) -> tuple[np.ndarray, int]:
    """Up to ``passes`` swap searches over pools of VECTOR_SWAP_POOL_ROWS rows (the least filled), while the
    plan is above the bound and each pass cuts rows; they also stop once it has at most ``stop_rows`` rows."""
    for _ in range(passes if num_rows > bound else 0):
        new_row_of, new_rows = pooled_vector_swap(dims, caps, row_of, num_rows, bound, VECTOR_SWAP_POOL_ROWS)
        if new_rows >= num_rows:
            break
        row_of, num_rows = new_row_of, new_rows
        if num_rows <= max(bound, stop_rows):
            break
    return row_of, num_rows


def _small_pool_passes(
    dims: np.ndarray, caps: np.ndarray, row_of: np.ndarray, num_rows: int, bound: int, pool_rows: int
) -> tuple[np.ndarray, int]:
    """Passes over pools of ``pool_rows`` rows while the plan is above the bound and larger than a large pool.
    Work limits: a pool's size share of the search's first; doubled (up to the whole) after a pass that cut
    nothing, the sum of the limits given out at most VECTOR_SWAP_SMALL_BUDGET searches' worth."""
    work = VECTOR_SWAP_MAX_WORK * pool_rows // max(VECTOR_SWAP_POOL_ROWS, 1)
    budget = VECTOR_SWAP_SMALL_BUDGET * VECTOR_SWAP_MAX_WORK
    idle = pass_ = 0
    while (
        num_rows > max(bound, VECTOR_SWAP_POOL_ROWS) and idle < VECTOR_SWAP_SMALL_IDLE and 0 < work <= budget
    ):
        budget -= work
        new_row_of, new_rows = pooled_vector_swap(
            dims, caps, row_of, num_rows, bound, pool_rows, pass_ * SPREAD_STEP % 1.0, work
        )
        pass_ += 1
        if new_rows < num_rows:
            row_of, num_rows, idle = new_row_of, new_rows, 0
        else:
            idle += work >= VECTOR_SWAP_MAX_WORK
            work = min(2 * work, VECTOR_SWAP_MAX_WORK)
    return row_of, num_rows


def _large_plan_start(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints
) -> tuple[np.ndarray, int, str]:
    """The one greedy start of a plan above SECOND_ORDER_MAX samples (each start is a full pass: ~10 s at 1M
    samples): the scarcest budget's where it has fewer rows than the token space's on an evenly strided
    subsample of START_SAMPLE samples (~1 s for both), else the token space's. A subsample's rows are a few
    per mille off the whole set's: where the two starts are that close, either may be chosen. The balanced
    fill replaces it where the amounts take few vectors and it has fewer rows."""
    start = _scarcest_or_plain_start(lengths, capacity, constraints)
    if fits_balanced_fill(constraints, len(lengths)):
        # The row-by-row fill (~1 s at 250k samples): where the budgets (or a sample cap alone) bind together
        # with the tokens, a best fit by any one of them ends 20-33% over the bound.
        filled = balanced_fill(lengths, capacity, constraints)
        if filled is not None and filled[1] < start[1]:
            return filled[0], filled[1], "balanced-fill+constraints"
    return start


def _scarcest_or_plain_start(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints
) -> tuple[np.ndarray, int, str]:
    """``_large_plan_start``'s greedy start: by the scarcest budget or by the tokens."""
    name = scarcest_budget(lengths, capacity, constraints)
    if name is not None:
        every = slice(None, None, max(1, len(lengths) // START_SAMPLE))
        sample = (lengths[every], capacity, _take_constraints(constraints, every))
        scarce = scarcest_first_pack(*sample, budget_name=name)
        if scarce is not None and scarce[1] < constrained_pack(*sample)[1]:
            full = scarcest_first_pack(lengths, capacity, constraints, budget_name=name)
            if full is not None:
                return full[0], full[1], SCARCEST_FIRST
    return *constrained_pack(lengths, capacity, constraints), "bfd+constraints"


def _scarcest_first_if_fewer(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints, plan: tuple[np.ndarray, int, str]
) -> tuple[np.ndarray, int, str]:
    """``plan``, or the greedy start by the scarcest budget where it has fewer rows. Neither start wins
    everywhere: on the benchmark's media mixes (tokens at 87% of the patches' demand) this one has 0.1-0.2%
    fewer rows, on mixes where the tokens bind nearly as hard (91%) a few more."""
    scarce = scarcest_first_pack(lengths, capacity, constraints)
    if scarce is not None and scarce[1] < plan[1]:
        return scarce[0], scarce[1], SCARCEST_FIRST
    return plan


def _other_constrained_packers(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    plan: tuple[np.ndarray, int, str],
    bound: int,
) -> tuple[np.ndarray, int, str]:
    """The plan with the fewest rows of ``plan`` and the other constrained packers: the other item order, the
    best fit by the scarcest budget, the balanced fill where the amounts take few vectors, the other fills
    on a plan far over the bound (``_more_fills_if_fewer``), the exact BFD on small plans (each only while
    the best so far is above ``bound``)."""
    row_of, num_rows, name = plan
    # Neither item order wins everywhere (weighted shares: omni mixes; plain sums: image-text).
    plain_row_of, plain_rows = constrained_pack(lengths, capacity, constraints, weigh_by_demand=False)
    if plain_rows < num_rows:
        row_of, num_rows = plain_row_of, plain_rows
    if num_rows > bound:
        row_of, num_rows, name = _scarcest_first_if_fewer(
            lengths, capacity, constraints, (row_of, num_rows, name)
        )
    row_of, num_rows, name = _filled_if_fewer(lengths, capacity, constraints, (row_of, num_rows, name), bound)
    plan = (row_of, num_rows, name)
    tried = (LEVEL_BUDGETS, LEVEL_CAP)  # by ``_filled_if_fewer``, where the amounts take few vectors
    row_of, num_rows, name = _more_fills_if_fewer(lengths, capacity, constraints, plan, bound, tried)
    if num_rows > bound and len(lengths) <= EXACT_CONSTRAINED_MAX:
        # The fast packer only looks at the front row of each space bucket and can open needless rows
        # on small, oddly shaped inputs; there the exact item-by-item BFD is cheap: keep the better.
        exact_row_of, exact_rows = constrained_bfd(lengths, capacity, constraints)
        if exact_rows < num_rows:
            row_of, num_rows, name = exact_row_of, exact_rows, "bfd+constraints(exact)"
    return row_of, num_rows, name


def _filled_if_fewer(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    plan: tuple[np.ndarray, int, str],
    bound: int,
) -> tuple[np.ndarray, int, str]:
    """``plan``, or the balanced fill's where its amounts take few vectors and it has fewer rows (each fill
    only while the best so far is above ``bound``)."""
    row_of, num_rows, name = plan
    if num_rows <= bound or not fits_balanced_fill(constraints, len(lengths)):
        return plan
    # Budgets that bind together: a row-by-row fill that keeps every dimension level; a sample cap beside
    # resource budgets levelled too (mostly text with a few images under a cap: it binds, they do not).
    both = constraints.resources and constraints.max_samples_per_row
    for level in (LEVEL_BUDGETS, LEVEL_CAP) if both else (LEVEL_BUDGETS,):
        filled = balanced_fill(lengths, capacity, constraints, level) if num_rows > bound else None
        if filled is not None and filled[1] < num_rows:
            row_of, num_rows, name = filled[0], filled[1], "balanced-fill+constraints"
    return row_of, num_rows, name


def _more_fills_if_fewer(
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints,
    plan: tuple[np.ndarray, int, str],
    bound: int,
    tried: tuple[str, ...],
) -> tuple[np.ndarray, int, str]:
    """``plan``, or the one with the fewest rows of the fills not yet tried (each level of
    ``vector_fill.fill_levels``, the amounts bucketed where they take many vectors; where they take few, the
    levels in ``tried`` were) where it has fewer rows; only on a plan more than MORE_FILLS_MIN_GAP and more
    than one row over ``bound``. A bucketed fill costs ~30-45 s at 250,000 samples (in Python, per sample
    and group), so a large plan far over its bound takes up to ~2.5 min more."""
    row_of, num_rows, name = plan
    if not MORE_FILLS_MIN_GAP or num_rows <= max(bound + 1, bound * (1 + MORE_FILLS_MIN_GAP)):
        return plan
    exact = fits_balanced_fill(constraints, len(lengths))
    for level in fill_levels(lengths, capacity, constraints):
        if exact and level in tried:
            continue
        filled = balanced_fill(lengths, capacity, constraints, level, bucketed=True)
        if filled is not None and filled[1] < num_rows:
            row_of, num_rows, name = filled[0], filled[1], f"balanced-fill({level})+constraints"
    return row_of, num_rows, name


def _constrained_dims(
    lengths: np.ndarray, capacity: int, constraints: PackConstraints
) -> tuple[np.ndarray, np.ndarray]:
    """Every item's sizes (tokens, each budget's amount, 1 for the sample cap) and the row's caps."""
    n = len(lengths)
    amounts, budgets = constraints.amounts_matrix(n)
    cap = constraints.max_samples_per_row or n
    dims = np.column_stack([np.asarray(lengths, dtype=np.int64), amounts, np.ones(n, dtype=np.int64)])
    return dims, np.concatenate([[int(capacity)], budgets, [int(cap)]]).astype(np.int64)


def _constrained_bound(lengths: np.ndarray, capacity: int, constraints: PackConstraints) -> int:
    amounts, budgets = constraints.amounts_matrix(len(lengths))
    return constrained_lower_bounds(lengths, capacity, amounts, budgets, constraints.max_samples_per_row)[
        "best"
    ]


def _refill_whole_set(
    slot_rows: np.ndarray, num_rows: int, used: str, values: np.ndarray, counts: np.ndarray, capacity: int
) -> tuple[np.ndarray, int, str]:
    """``_improve``'s step 3: the best of the plan so far, its mixed re-pack, the whole set refilled and that
    plan's mixed re-pack (ties keep the earlier)."""
    candidates = [
        (_mix_and_repack(slot_rows, num_rows, values, counts, capacity), used.split("(")[0] + "+mix")
    ]
    whole = refill_classes(values, counts, capacity, max_work=REFILL_MAX_WORK)
    if whole is not None:
        candidates += [(whole, "refill"), (_mix_and_repack(*whole, values, counts, capacity), "refill+mix")]
    for (new_slots, new_rows), name in candidates:
        if new_rows < num_rows:
            slot_rows, num_rows, used = new_slots, new_rows, name
    return slot_rows, num_rows, used


def _lp_proves_optimal(
    slot_rows: np.ndarray,
    num_rows: int,
    n: int,
    values: np.ndarray,
    counts: np.ndarray,
    capacity: int,
    bound: int,
) -> bool:
    """Whether the pattern LP's bound on ``EARLY_LP_LIMITS`` reaches the plan's rows (plans of at most
    ``EARLY_LP_MAX_SAMPLES`` samples above ``bound``)."""
    if num_rows <= bound or n > EARLY_LP_MAX_SAMPLES:
        return False
    return lp_rows_bound(values, counts, capacity, (slot_rows, num_rows), bound, EARLY_LP_LIMITS) >= num_rows


def _improve(
    slot_rows: np.ndarray,
    num_rows: int,
    lengths: np.ndarray,
    values: np.ndarray,
    counts: np.ndarray,
    capacity: int,
    lp: bool = True,
) -> tuple[np.ndarray, int, str]:
    """Improve a BFD packing that misses the lower bound; every step works on length classes.

    1. FFD's row count is computed at class level (milliseconds) and its plan kept only if it has fewer
       rows, so the result never has more rows than FFD.
    2. The rows that are not exactly full are re-packed with the subset-sum refill. Still above the bound
       (up to EARLY_LP_MAX_SAMPLES samples), the pattern LP's bound on a small budget: a plan it proves
       optimal is returned as it is (the later steps keep a plan only with fewer rows).
    3. If still more than REFILL_TARGET over the bound (and up to FULL_REFILL_MAX samples): the whole
       set is refilled (one subset-sum per distinct row pattern), and both that plan and the plan so far
       get the mixed re-pack (``_mix_and_repack``: slack rows plus spread full rows, FFD and refill).
    4. Still above the bound: the swap search on a pool of rows (``_swap_pool``).
    5. Still more than REFILL_TARGET over it (up to PAIR_SCAN_MAX samples): the large-item pairing scan
       (``_pair_large_then_refill``), for mixes of rows of 2-4 items.
    6. Still above the bound (up to LP_MAX_SAMPLES samples, LP_MAX_CLASSES lengths; above LP_MANY_CLASSES
       lengths only more than LP_MANY_CLASSES_GAP over it): the pattern LP,
       rounded (``patterns.lp_pattern_pack``, with ``highspy``); it stops early on proving the plan optimal.
    Each refill gives up past REFILL_MAX_WORK (about a second; a work count, so still deterministic).
    The plan with the fewest rows wins; ties keep the earlier one. ``lp=False`` leaves out the LP steps (2
    and 6).
    """
    bounds = lower_bounds(lengths, capacity)
    bound = best_bound(bounds)
    used = "bfd"
    if num_rows <= bound:
        return slot_rows, num_rows, used
    ffd_slots, ffd_rows = ffd_classes(values, counts, capacity)
    if ffd_rows < num_rows:
        slot_rows, num_rows, used = ffd_slots, ffd_rows, "ffd(best of bfd,ffd)"
    if num_rows > bound:
        refilled, refilled_rows = _refill_slack_rows(slot_rows, num_rows, values, counts, capacity)
        if refilled_rows < num_rows:
            slot_rows, num_rows, used = refilled, refilled_rows, used.split("(")[0] + "+refill"
    if lp and _lp_proves_optimal(slot_rows, num_rows, len(lengths), values, counts, capacity, bound):
        return slot_rows, num_rows, used  # no later step can find fewer rows
    if num_rows > bound * (1 + REFILL_TARGET) and len(lengths) <= FULL_REFILL_MAX:
        slot_rows, num_rows, used = _refill_whole_set(slot_rows, num_rows, used, values, counts, capacity)
    if num_rows > bound * (1 + REFILL_TARGET) or num_rows > bound and num_rows < SWAP_MAX_ROWS:
        new_slots, new_rows = _swap_pool(slot_rows, num_rows, values, counts, capacity)
        if new_rows < num_rows:
            slot_rows, num_rows, used = new_slots, new_rows, used.split("(")[0] + "+swap"
    if num_rows > bound * (1 + REFILL_TARGET) and len(lengths) <= PAIR_SCAN_MAX:
        paired = _pair_large_then_refill(values, counts, capacity, bound)
        if paired is not None and paired[1] < num_rows:
            slot_rows, num_rows, used = paired[0], paired[1], "pairs+refill"
    guided = _lp_guided(slot_rows, num_rows, values, counts, capacity, bound) if lp else None
    return (slot_rows, num_rows, used) if guided is None else (*guided, "lp-patterns")


def _lp_guided(
    slot_rows: np.ndarray, num_rows: int, values: np.ndarray, counts: np.ndarray, capacity: int, bound: int
) -> tuple[np.ndarray, int] | None:
    """The pattern LP's plan (``patterns.lp_pattern_pack``) if it has fewer rows; its leftovers go to the
    refill or FFD, whichever needs fewer rows. None above the bound's limits or at the bound."""
    if num_rows <= bound or len(slot_rows) > LP_MAX_SAMPLES or len(values) > LP_MAX_CLASSES:
        return None
    if len(values) > LP_MANY_CLASSES and num_rows <= bound * (1 + LP_MANY_CLASSES_GAP):
        return None
    return lp_pattern_pack(
        values,
        counts,
        capacity,
        (slot_rows, num_rows),
        [
            lambda v, c: refill_classes(v, c, capacity, max_work=REFILL_MAX_WORK),
            lambda v, c: ffd_classes(v, c, capacity),
        ],
        lower_bound=bound,
    )


def pack(
    lengths: np.ndarray,
    capacity: int,
    *,
    algorithm: str = "bfd",
    constraints: PackConstraints | None = None,
    window: int | None = None,
    balance: bool = False,
    shuffle: bool = True,
    seed: int = 0,
) -> PackPlan:
    """Pack samples (lengths already padded to the alignment) into rows of width ``capacity``.

    ``algorithm`` is "bfd" (best-fit decreasing; if it misses the lower bound, ``_improve`` tries FFD and the
    subset-sum refill and keeps the plan with the fewest rows, never more than FFD's) or "ffd" (classic
    first-fit decreasing), both over the whole dataset. ``window=N`` packs each block of N consecutive samples
    separately, by the fast steps only (bounded memory; rows never span blocks). ``constraints`` (sample cap,
    per-row resource budgets, always respected exactly) switch to a constrained best-fit over items sorted by
    total normalised size, whatever ``algorithm`` says (above SECOND_ORDER_MAX samples, where a budget
    out-demands the tokens, the best fit by that budget's room if a subsample packs into fewer rows so). Above
    the vector bound: up to SECOND_ORDER_MAX samples the other item order, the best fit by the scarcest
    budget, the row-by-row ``balanced_fill`` when the amounts take few values or a cap binds (at any size;
    more far over the bound: ``_more_fills_if_fewer``), the exact BFD on small plans; at any size the swap
    search (``vector_swap``; a plan of more than VECTOR_SWAP_POOL_ROWS rows in pools of that many, then
    smaller; one under a cap alone left over ``deep_goal``: again in groups, ``_split_if_fewer``); up to
    BUDGET_FIRST_MAX_ROWS rows the search again from the scarcest budget's 1-D plan (``budget_first``); up to
    CONSTRAINED_LP_MAX_SAMPLES samples or CONSTRAINED_LP_MAX_CLASSES item vectors the vector pattern LP
    (``vector_patterns``, with ``highspy``); up to DEEP_MAX_ROWS rows, while more than 0.1% and a row over
    the bound (``deep_goal``), deeper swap passes. The plan with fewer rows wins. ``balance`` evens out
    per-row attention cost (sum of squared lengths) with at most +0.1% rows. Rows are shuffled with ``seed``
    unless ``shuffle=False``; deterministic."""
    capacity = operator.index(capacity)  # an np.int64 would overflow the refill's Python-int bitsets
    lengths = validate_lengths(lengths, capacity)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    constraints = _usable_constraints(constraints, len(lengths))
    n = len(lengths)
    if n == 0:
        return build_plan(np.zeros(0, np.int32), 0, lengths, capacity, algorithm, False, seed)
    if window is None or window >= n:
        row_of, num_rows, used = _assign(lengths, capacity, algorithm, constraints, improve=True)
        if balance:
            row_of, num_rows = _balance(row_of, num_rows, lengths, capacity, constraints)
    else:
        row_of = np.empty(n, dtype=np.int32)
        num_rows = 0
        for start in range(0, n, window):
            stop = min(start + window, n)
            sub = None if constraints is None else _slice_constraints(constraints, start, stop)
            part, part_rows, _ = _assign(lengths[start:stop], capacity, algorithm, sub, improve=False)
            if balance:  # balance inside the window so rows still never span windows
                part, part_rows = _balance(part, part_rows, lengths[start:stop], capacity, sub)
            row_of[start:stop] = part + num_rows
            num_rows += part_rows
        used = f"{algorithm}+window{window}" if constraints is None else f"bfd+constraints+window{window}"
    if balance:
        used += "+balance"
    return build_plan(row_of, num_rows, lengths, capacity, used, shuffle, seed)


def _usable_constraints(constraints: PackConstraints | None, num_samples: int) -> PackConstraints | None:
    """``constraints`` checked against ``num_samples`` samples, less the budgets nothing uses; None when
    nothing is left to respect."""
    if constraints is None:
        return None
    constraints.validate(num_samples)
    constraints = constraints.without_unused_budgets()
    return None if constraints.is_empty else constraints


def _balance(
    row_of: np.ndarray,
    num_rows: int,
    lengths: np.ndarray,
    capacity: int,
    constraints: PackConstraints | None,
) -> tuple[np.ndarray, int]:
    """Even out per-row attention cost (sum of squared lengths); at most +0.1% rows over the packing it
    starts from (with constraints, the same rows)."""
    squared = lengths.astype(np.float64) ** 2
    extra = 0 if constraints is not None else num_rows // 1000
    return balance_costs(
        lengths, squared, capacity, row_of, num_rows, constraints=constraints, max_rows=num_rows + extra
    )


def _slice_constraints(constraints: PackConstraints, start: int, stop: int) -> PackConstraints:
    return _take_constraints(constraints, slice(start, stop))


def _take_constraints(constraints: PackConstraints, index: slice | np.ndarray) -> PackConstraints:
    """The constraints of the samples ``index`` picks (a slice or indices), in that order."""
    resources = {name: (np.asarray(a)[index], b) for name, (a, b) in constraints.resources.items()}
    return PackConstraints(constraints.max_samples_per_row, resources)
