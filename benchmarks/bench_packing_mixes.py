"""Property-based packing benchmark: rows against the bound and the optimum over random length mixtures.

    python benchmarks/bench_packing_mixes.py          # 200 mixtures, 10k-100k samples, optima at 1000 items
    python benchmarks/bench_packing_mixes.py --full   # 200 mixtures, 10k-1M samples, optima at 2000 items

Each mixture (``mixes.random_mixture``: 2-4 modes of lognormal, uniform, spike and power-law-tail lengths,
W in 4096/8192/16384/32768, seeded by its index) is packed twice:

- **large**: n log-uniform in the size range; rows against the best lower bound max(L1, L2, DFF) and
  against classic first-fit decreasing (never more rows allowed);
- **small** (same mixture, 1000 or 2000 items): where ``pack`` is above that bound, the Gilmore-Gomory LP
  bound and an integer packing of its patterns (``optimum.bin_packing_optimum``, HiGHS) split the excess
  into "bound not tight" (the LP bound is above the simple one) and "packer's loss" (``pack`` above the LP
  bound; loss against the optimum when the MIP proves it).

``--early-lp-ab`` packs each mixture at 200-4,096 samples with and without the early LP bound
(``engine.EARLY_LP_MAX_SAMPLES``; the two in turn, one process): the plans must be identical, and the table
gives the time either way, where the bound proved a plan optimal and what it cost where it did not.

``--prove-lp INDEX ...`` takes only those large instances, against the pattern LP solved to the end by the
packer's own column generation with no work limit (minutes each): for the ones where the clock-capped LP of
``--large-lp-seconds`` leaves only Farley's bound.

``--speed`` adds the plan-speed comparison with lightbinpack (bench_packing's, on 4M text samples).
``--constrained`` packs image-text and omni sets under their media budgets (bench_packing's), text
(bench_packing's ``text_sft``) under a cap of 12 samples a row alone, and shorter text (``short_text``)
under caps of 12 (W=4096) and 24 (W=8192), where the tokens bind a little harder (``--constrained-sets``
picks), without ("before") and with ("after") the steps for constrained plans above the vector bound (the
swap search, ``engine.VECTOR_SWAP_POOL_ROWS``; the vector pattern LP, ``engine.CONSTRAINED_LP_MAX_SAMPLES``
and ``CONSTRAINED_LP_MAX_CLASSES``)
and, where
``pack`` is still above the vector bound, asks an assignment MIP (``optimum.vector_packing_feasible``) whether
the bound's row count is reachable: "bound tight" (the packer's loss) or "bound not tight". With
``--budget-first-ab``, "before" turns off only the search from the start by the scarcest budget
(``engine.BUDGET_FIRST_MAX_ROWS``), so the two columns are ``pack`` with and without that step; with
``--deep-ab`` only the deep passes (``engine.DEEP_PASSES``); with ``--split-ab`` only the split of large
plans into stratified groups (``engine.SPLIT_ROWS``). With ``--constrained-window N`` both pack in
windows of N samples: "before" is the fast best fit in each window (``constraints.constrained_pack``, the
window path before the balanced fill joined it), "after" ``pack(window=N)``; no MIP. The summary counts the
plans more than 0.1% and more than a row over their bound ("over tol.", the deep passes' trigger).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
import bench_packing  # noqa: E402
from mixes import WIDTHS, describe, random_mixture, sample_mixture  # noqa: E402
from optimum import bin_packing_optimum, lp_lower_bound, plan_patterns, vector_packing_feasible  # noqa: E402

from omnipack.packing import PackConstraints, engine, lower_bounds, pack  # noqa: E402
from omnipack.packing.bounds import constrained_lower_bounds  # noqa: E402
from omnipack.packing.constraints import constrained_pack  # noqa: E402


def mixture(index: int) -> tuple[int, list[dict], np.random.Generator]:
    rng = np.random.default_rng(10_000 + index)
    width = WIDTHS[int(rng.integers(len(WIDTHS)))]
    return width, random_mixture(rng, width), rng


def draw_large(index: int, low: int, high: int) -> tuple[int, list[dict], np.ndarray]:
    """Mixture ``index``'s large instance: its width, modes and lengths (n log-uniform in [low, high])."""
    width, modes, rng = mixture(index)
    n = int(np.exp(rng.uniform(np.log(low), np.log(high))))
    return width, modes, sample_mixture(rng, modes, n, width)


def run_large(index: int, low: int, high: int, lp_seconds: float = 0.0) -> dict:
    width, modes, lengths = draw_large(index, low, high)
    n = len(lengths)
    bound = max(lower_bounds(lengths, width).values())
    start = time.perf_counter()
    plan = pack(lengths, width, shuffle=False)
    seconds = time.perf_counter() - start
    ffd = pack(lengths, width, algorithm="ffd", shuffle=False).num_rows
    # above the simple bound: the Gilmore-Gomory LP's bound (over length classes, so at any n), started
    # from the plan's own rows; Farley's bound when cut by the clock, still a valid lower bound
    lp, converged = bound, True
    if lp_seconds > 0 and plan.num_rows > bound * 1.001:  # the instances the 0.1% target is about
        start_patterns = plan_patterns(lengths, plan.row_of)
        lp, converged = lp_lower_bound(lengths, width, start_patterns, plan.num_rows, lp_seconds)
        lp = max(lp, bound)
    return {
        "lp": lp,
        "lp_converged": converged,
        "index": index,
        "W": width,
        "n": n,
        "rows": plan.num_rows,
        "bound": bound,
        "ffd": ffd,
        "seconds": seconds,
        "algorithm": plan.algorithm,
        "mix": describe(modes),
    }


def prove_large(index: int, low: int, high: int) -> dict:
    """Mixture ``index``'s large instance against the pattern LP solved to the end: the packer's own column
    generation (``patterns.lp_rows_bound``: exchange columns, dual smoothing on 1,024+ lengths, pricing by
    the exact knapsack at any size) with no work limit, started from the plan's rows. For the instances
    where the benchmark's clock-capped LP (``--large-lp-seconds``) is cut short: minutes each."""
    from omnipack.packing.patterns import LpLimits, lp_rows_bound

    width, _, lengths = draw_large(index, low, high)
    bound = max(lower_bounds(lengths, width).values())
    plan = pack(lengths, width, shuffle=False)
    # the packer's length classes (longest first) and each class's items' rows, in the packer's slot order
    values, counts = engine._classes(lengths, width)
    slot_rows = np.asarray(plan.row_of)[engine._descending_order(lengths, width)]
    unlimited = LpLimits(
        max_columns=10**9, max_knapsack_work=10**18, max_pricing_cells=10**15, max_lp_solves=10**9
    )
    start = time.perf_counter()
    lp = lp_rows_bound(values, counts, width, (slot_rows, plan.num_rows), bound, unlimited)
    return {
        "index": index, "W": width, "n": len(lengths), "classes": len(values), "rows": plan.num_rows,
        # the simple bound when HiGHS (highspy) is missing or failed: no LP at all
        "bound": bound, "LP bound": lp if lp > bound else f"{lp} (no LP above the bound)",
        "rows/LP": f"{plan.num_rows / lp:.5f}",
        "within LP + 0.1%": "yes" if plan.num_rows <= lp * 1.001 else "NO",
        "LP s": f"{time.perf_counter() - start:.0f}",
    }  # fmt: skip


def run_small(index: int, n: int, lp_seconds: float) -> dict:
    width, modes, rng = mixture(index)
    rng = np.random.default_rng(20_000 + index)
    lengths = sample_mixture(rng, modes, n, width)
    bound = max(lower_bounds(lengths, width).values())
    rows = pack(lengths, width, shuffle=False).num_rows
    ffd = pack(lengths, width, algorithm="ffd", shuffle=False).num_rows
    out = {
        "index": index,
        "W": width,
        "rows": rows,
        "bound": bound,
        "ffd": ffd,
        "lp": bound,
        "optimum": bound,
    }
    out["converged"] = True
    if rows > bound:
        opt = bin_packing_optimum(lengths, width, upper=rows, lp_seconds=lp_seconds)
        out["lp"] = opt.lp_bound
        out["optimum"] = opt.lp_bound if opt.best_known == opt.lp_bound else None
        out["best_known"] = opt.best_known
        out["converged"] = opt.converged
    return out


def summarize_large(results: list[dict]) -> list[dict]:
    rows = []
    for width in (*WIDTHS, None):
        sel = [r for r in results if width is None or r["W"] == width]
        if not sel:
            continue
        ratio = np.array([r["rows"] / r["bound"] for r in sel])
        vs_lp = np.array([r["rows"] / r["lp"] for r in sel])
        vs_ffd = np.array([r["rows"] / r["ffd"] for r in sel])
        rows.append(
            {
                "W": "all" if width is None else width,
                "mixtures": len(sel),
                "worst rows/bound": ratio.max(),
                "p99": np.quantile(ratio, 0.99),
                "median": np.median(ratio),
                "> bound+0.1%": int((ratio > 1.001).sum()),
                "worst rows/LP": vs_lp.max(),
                "> LP+0.1%": int((vs_lp > 1.001).sum()),
                "LP cut by clock": sum(not r["lp_converged"] for r in sel),
                "worst rows/ffd": vs_ffd.max(),
                "mean rows/ffd": vs_ffd.mean(),
                "ffd worst/bound": max(r["ffd"] / r["bound"] for r in sel),
                "max s": max(r["seconds"] for r in sel),
            }
        )
    return rows


def summarize_small(results: list[dict]) -> dict:
    over = [r for r in results if r["rows"] > r["bound"]]
    proven = [r for r in results if r["optimum"] is not None]
    at_opt = [r for r in proven if r["rows"] == r["optimum"]]
    loss = [r for r in results if r["rows"] > r["lp"] and r["converged"]]
    return {
        "instances": len(results),
        "at simple bound": len(results) - len(over),
        "bound not tight (LP > bound)": sum(r["lp"] > r["bound"] for r in results),
        "optimum proven": len(proven),
        "pack at optimum": len(at_opt),
        "packer's loss (rows > ceil LP)": len(loss),
        "LP not solved in time": sum(not r["converged"] for r in results),
        "worst rows/ceil LP": max((r["rows"] / r["lp"] for r in results if r["converged"]), default=1.0),
        "worst rows/optimum": max((r["rows"] / r["optimum"] for r in proven), default=1.0),
        "p99 rows/optimum": float(np.quantile([r["rows"] / r["optimum"] for r in proven], 0.99))
        if proven
        else 1.0,
        "worst rows/bound": max(r["rows"] / r["bound"] for r in results),
        "p99 rows/bound": float(np.quantile([r["rows"] / r["bound"] for r in results], 0.99)),
        "worst rows/ffd": max(r["rows"] / r["ffd"] for r in results),
    }


def _cell(column: str, value: object) -> str:
    """Ratios with four decimals, larger numbers with two."""
    if isinstance(value, float | np.floating):
        return f"{value:.2f}" if abs(value) >= 10 else f"{value:.4f}"
    return str(value)


def print_table(rows: list[dict]) -> None:
    bench_packing.print_table(rows, _cell)


# What "before" turns off: the steps that run on constrained plans above the vector bound (the swap search,
# whose pools the budget-first search needs too, and the vector pattern LP), or with --budget-first-ab only
# the search from the start by the scarcest budget (``packing.budget_first``).
STEPS_OFF = ("CONSTRAINED_LP_MAX_SAMPLES", "CONSTRAINED_LP_MAX_CLASSES", "VECTOR_SWAP_POOL_ROWS")
BUDGET_FIRST_OFF = ("BUDGET_FIRST_MAX_ROWS",)
DEEP_OFF = ("DEEP_PASSES",)
SPLIT_OFF = ("SPLIT_ROWS",)
# The one-step A/B flags: what "before" turns off, and how the summary names it.
ONE_STEP_AB = {
    "budget_first_ab": (BUDGET_FIRST_OFF, "the budget-first search"),
    "deep_ab": (DEEP_OFF, "the deep swap passes"),
    "split_ab": (SPLIT_OFF, "the split into stratified groups"),
}


def over_tolerance(rows: int, bound: int) -> bool:
    """More than 0.1% and more than one row above the bound: above the deep passes' goal."""
    return rows > engine.deep_goal(bound)


def _timed_rows(lengths: np.ndarray, width: int, constraints, off: tuple[str, ...] = ()) -> tuple[int, float]:
    """Rows and plan seconds of ``pack``, with the engine's limits named in ``off`` set to 0 (those steps off)."""
    saved = {name: getattr(engine, name) for name in off}
    for name in off:
        setattr(engine, name, 0)
    try:
        start = time.perf_counter()
        rows = pack(lengths, width, constraints=constraints).num_rows
        return rows, time.perf_counter() - start
    finally:
        for name, value in saved.items():
            setattr(engine, name, value)


def short_text(rng: np.random.Generator, n: int, width: int) -> dict:
    """Short text with a long tail (lognormal, median 150, sigma 1.4, clipped to W): under a cap of 12 a row
    at W=4096 or 24 at W=8192 the tokens bind a little harder than the cap (~11 or ~21 samples a row)."""
    return {"real": np.clip(np.round(rng.lognormal(np.log(150), 1.4, n)), 1, width).astype(np.int64)}


def _windowed_rows(
    lengths: np.ndarray, width: int, constraints: PackConstraints, window: int
) -> tuple[tuple[int, float], tuple[int, float]]:
    """Rows and seconds of the fast best fit in each window of ``window`` samples (the window path before the
    balanced fill joined it), then of ``pack(window=window)``."""
    start = time.perf_counter()
    before = 0
    for first in range(0, len(lengths), window):
        stop = min(first + window, len(lengths))
        sub = engine._slice_constraints(constraints, first, stop)  # as pack's window path cuts them
        before += constrained_pack(lengths[first:stop], width, sub)[1]
    before_s = time.perf_counter() - start
    start = time.perf_counter()
    rows = pack(lengths, width, constraints=constraints, window=window).num_rows
    return (before, before_s), (rows, time.perf_counter() - start)


def _mip_verdict(
    lengths: np.ndarray, width: int, constraints: PackConstraints, bound: int, seconds: float
) -> str:
    """Whether an assignment MIP packs the items into ``bound`` rows: the bound tight (so the packer's loss),
    not tight, or undecided within ``seconds``."""
    n = len(lengths)
    amounts, budgets = constraints.amounts_matrix(n)
    dims = np.column_stack([lengths, amounts, np.ones(n, dtype=np.int64)])
    caps = np.concatenate([[width], budgets, [constraints.max_samples_per_row]])
    binding = 1 + int(np.argmax(amounts.sum(axis=0) / budgets))  # the patch budget here
    fits = vector_packing_feasible(dims, caps, bound, seconds=seconds, order_by=binding)
    return {True: "bound tight: packer's loss", False: "bound not tight", None: "undecided"}[fits]


def _chosen_sets(sets: tuple, only: str | None) -> list:
    """The entries of ``sets`` named in ``only`` (comma-separated; None: all); an unknown name is an error."""
    names = [entry[0] for entry in sets]
    chosen = names if only is None else only.split(",")
    unknown = set(chosen) - set(names)
    if unknown:
        raise SystemExit(f"--constrained-sets: unknown {sorted(unknown)}; the sets are {names}")
    return [entry for entry in sets if entry[0] in chosen]


def constrained_small(
    n: int,
    seeds: int,
    seconds: float,
    before_off: tuple[str, ...] = STEPS_OFF,
    only: str | None = None,
    window: int | None = None,
) -> list[dict]:
    """Media sets under bench_packing's budgets, and text under a sample cap (``only``: these set names, comma-
    separated): pack without ("before": the steps of ``before_off`` off) and with ("after") those steps,
    against the vector bound, and the MIP's verdict where "after" is above it (media sets only). With
    ``window``, ``_windowed_rows`` instead, and no MIP."""
    from bench_packing import image_text, media_constraints, omni_mix, padded, text_sft

    sets = (
        ("image-text", image_text, 8192, media_constraints),
        ("omni", omni_mix, 16384, media_constraints),
        ("text-cap12", text_sft, 8192, lambda data, width: PackConstraints(max_samples_per_row=12)),
        ("short-text-cap12", short_text, 4096, lambda data, width: PackConstraints(max_samples_per_row=12)),
        ("short-text-cap24", short_text, 8192, lambda data, width: PackConstraints(max_samples_per_row=24)),
    )
    out = []
    for name, make, width, constraints_of in _chosen_sets(sets, only):
        for seed in range(seeds):
            data = make(np.random.default_rng(seed), n, width)
            lengths = padded(data["real"], width)
            constraints = constraints_of(data, width)
            amounts, budgets = constraints.amounts_matrix(n)
            cap = constraints.max_samples_per_row
            bound = constrained_lower_bounds(lengths, width, amounts, budgets, cap)["best"]
            if window is None:
                before, before_s = _timed_rows(lengths, width, constraints, before_off)
                rows, after_s = _timed_rows(lengths, width, constraints)
            else:
                (before, before_s), (rows, after_s) = _windowed_rows(lengths, width, constraints, window)
            verdict = "pack at bound"
            if rows > bound:
                mip = seconds > 0 and bool(constraints.resources) and window is None
                verdict = "above bound (no MIP)"
                if mip:
                    verdict = _mip_verdict(lengths, width, constraints, bound, seconds)
            out.append(
                {
                    "set": name,
                    "n": n,
                    "seed": seed,
                    "vector bound": bound,
                    "rows before": before,
                    "rows after": rows,
                    "s before": before_s,
                    "s after": after_s,
                    "MIP": verdict,
                }
            )
            print(f"# {out[-1]}", file=sys.stderr, flush=True)
    return out


def summarize_constrained(results: list[dict]) -> list[dict]:
    """Per set: rows/bound before and after the step (worst, p99), instances at the bound, max plan seconds."""
    rows = []
    for name in dict.fromkeys(r["set"] for r in results):
        sel = [r for r in results if r["set"] == name]
        before = np.array([r["rows before"] / r["vector bound"] for r in sel])
        after = np.array([r["rows after"] / r["vector bound"] for r in sel])
        rows.append(
            {
                "set": name,
                "instances": len(sel),
                "at bound before": int((before == 1).sum()),
                "at bound after": int((after == 1).sum()),
                "over tol. before": sum(over_tolerance(r["rows before"], r["vector bound"]) for r in sel),
                "over tol. after": sum(over_tolerance(r["rows after"], r["vector bound"]) for r in sel),
                "worst before": before.max(),
                "worst after": after.max(),
                "p99 before": float(np.quantile(before, 0.99)),
                "p99 after": float(np.quantile(after, 0.99)),
                "max s before": max(r["s before"] for r in sel),
                "max s after": max(r["s after"] for r in sel),
            }
        )
    return rows


def early_lp_ab(mixtures: int) -> None:
    """``pack`` with and without the early LP bound on each mixture at 200-4,096 samples (see the module)."""
    early_max = engine.EARLY_LP_MAX_SAMPLES
    totals = {"without": 0.0, "with": 0.0}
    identical, ran, proved, wasted = 0, 0, 0, 0.0
    bound_of = engine.lp_rows_bound
    calls: list[tuple[int, int, float]] = []  # (plan rows, early bound, seconds) of this mixture's early bound

    def timed_bound(
        values: np.ndarray, counts: np.ndarray, capacity: int, start: tuple, lower_bound: int, limits: object
    ) -> int:
        t = time.perf_counter()
        out = bound_of(values, counts, capacity, start, lower_bound, limits)
        calls.append((start[1], out, time.perf_counter() - t))
        return out

    engine.lp_rows_bound = timed_bound
    try:
        for index in range(mixtures):
            width, modes, rng = mixture(index)
            n = int(np.exp(rng.uniform(np.log(200), np.log(4096))))
            lengths = sample_mixture(rng, modes, n, width)
            plans, seconds = {}, {}
            for way in ("without", "with") if index % 2 == 0 else ("with", "without"):
                engine.EARLY_LP_MAX_SAMPLES = early_max if way == "with" else 0
                calls.clear()
                t = time.perf_counter()
                plans[way] = pack(lengths, width, shuffle=False)
                seconds[way] = time.perf_counter() - t
                totals[way] += seconds[way]
                if way == "with" and calls:
                    ran += 1
                    rows, bound, spent = calls[0]
                    proved += bound >= rows
                    wasted += spent if bound < rows else 0.0
            a, b = plans["without"], plans["with"]
            identical += (a.num_rows, a.algorithm) == (b.num_rows, b.algorithm) and np.array_equal(a.row_of, b.row_of)
            if seconds["without"] - seconds["with"] > 0.01 or seconds["with"] - seconds["without"] > 0.05:
                print(
                    f"# {index} W={width} n={n}: {b.num_rows} rows, {seconds['without']:.3f} s without, "
                    f"{seconds['with']:.3f} s with",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        engine.EARLY_LP_MAX_SAMPLES = early_max
        engine.lp_rows_bound = bound_of
    print_table([{
        "mixtures": mixtures, "identical plans": identical, "early bound ran": ran, "proved optimal": proved,
        "s spent where not proved": round(wasted, 3), "s without": round(totals["without"], 2),
        "s with": round(totals["with"], 2),
    }])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="10k-1M samples, optima at 2000 items")
    parser.add_argument("--mixtures", type=int, default=200)
    parser.add_argument(
        "--lp-seconds", type=float, default=None, help="LP time cap (default 10 s, --full 60 s)"
    )
    parser.add_argument(
        "--large-lp-seconds",
        type=float,
        default=0.0,
        help="large instances above the simple bound: the Gilmore-Gomory LP bound, capped at this (0: off)",
    )
    parser.add_argument("--large-only", action="store_true", help="only the large instances (with --large-lp-seconds)")
    parser.add_argument("--speed", action="store_true", help="plan speed vs lightbinpack (4M text samples)")
    parser.add_argument("--constrained", action="store_true", help="only the small constrained sets vs a MIP")
    parser.add_argument("--constrained-n", type=int, default=200)
    parser.add_argument("--constrained-seeds", type=int, default=4)
    parser.add_argument(
        "--constrained-sets", default=None, help='only these constrained sets, e.g. text-cap12 (comma-separated)'
    )
    parser.add_argument(
        "--constrained-window", type=int, default=None, metavar="N",
        help="with --constrained: pack in windows of N samples; before is the fast best fit in each window",
    )  # fmt: skip
    parser.add_argument("--mip-seconds", type=float, default=60.0, help="0: no MIP verdict")
    parser.add_argument("--early-lp-ab", action="store_true", help="only pack with and without the early LP bound")
    parser.add_argument(
        "--budget-first-ab", action="store_true",
        help="with --constrained: before is pack without the budget-first search only (not every step)",
    )  # fmt: skip
    parser.add_argument(
        "--deep-ab", action="store_true",
        help="with --constrained: before is pack without the deep swap passes only (not every step)",
    )  # fmt: skip
    parser.add_argument(
        "--split-ab", action="store_true",
        help="with --constrained: before is pack without the split into stratified groups only",
    )  # fmt: skip
    parser.add_argument(
        "--prove-lp", type=int, nargs="+", metavar="INDEX",
        help="only these large instances, against the LP solved to the end (no limit: minutes each)",
    )  # fmt: skip
    args = parser.parse_args()
    one_step = [flag for flag in ONE_STEP_AB if getattr(args, flag)]
    if (one_step or args.constrained_window) and not args.constrained:
        parser.error(
            "--budget-first-ab, --deep-ab, --split-ab and --constrained-window compare constrained plans: use"
            " them with --constrained"
        )
    if args.constrained_window is not None and one_step:
        parser.error("--constrained-window compares the window path alone: not with another A/B")
    if len(one_step) > 1:
        parser.error("--budget-first-ab, --deep-ab and --split-ab each turn one step off: use one")
    high = 1_000_000 if args.full else 100_000
    if args.prove_lp:
        return print_table([prove_large(index, 10_000, high) for index in args.prove_lp])
    if args.early_lp_ab:
        return early_lp_ab(args.mixtures)
    if args.constrained:
        print(
            f"\nConstrained sets at {args.constrained_n} samples vs the vector bound (MIP {args.mip_seconds:.0f} s)\n"
        )
        off, steps = ONE_STEP_AB[one_step[0]] if one_step else (STEPS_OFF, None)
        results = constrained_small(
            args.constrained_n, args.constrained_seeds, args.mip_seconds, off, args.constrained_sets,
            args.constrained_window,
        )  # fmt: skip
        print_table(results)
        if steps is None:
            steps = (
                f"the balanced fill in windows of {args.constrained_window}"
                if args.constrained_window
                else "the swap search, the vector pattern LP and the deep passes"
            )
        print(f"\nrows / vector bound without (before) and with (after) {steps}\n")
        print_table(summarize_constrained(results))
        return
    small_n = 2000 if args.full else 1000
    lp_seconds = args.lp_seconds or (60.0 if args.full else 10.0)
    large, small = [], []
    for index in range(args.mixtures):
        r = run_large(index, 10_000, high, args.large_lp_seconds)
        large.append(r)
        if args.large_only:
            print(
                f"# {index} W={r['W']} n={r['n']}: {r['rows']} rows, bound {r['bound']}, LP {r['lp']} "
                f"({'solved' if r['lp_converged'] else 'Farley, cut by the clock'}), {r['seconds']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
            continue
        s = run_small(index, small_n, lp_seconds)
        small.append(s)
        print(
            f"# {index} W={r['W']} n={r['n']}: {r['rows']} rows, bound {r['bound']}, ffd {r['ffd']}, "
            f"{r['seconds']:.2f} s [{r['algorithm']}]; small: {s['rows']} rows, bound {s['bound']}, "
            f"LP {s['lp']}, optimum {s['optimum']}",
            file=sys.stderr,
            flush=True,
        )
    if not large:  # --mixtures 0: the speed table alone
        if args.speed:
            bench_packing.print_speed(4_000_000)
        return
    print(f"\nLarge instances: {args.mixtures} mixtures, n log-uniform in [10k, {high // 1000}k]\n")
    print_table(summarize_large(large))
    if args.large_only:
        above = sorted((r for r in large if r["rows"] > r["lp"] * 1.001), key=lambda r: -r["rows"] / r["lp"])
        print("\nLarge instances above the LP bound + 0.1%:\n")
        print_table([{k: r[k] for k in ("index", "W", "n", "rows", "bound", "lp", "ffd", "algorithm")} for r in above])
        return
    print(
        f"\nSmall instances: the same mixtures at {small_n} items, against the LP bound / optimum (HiGHS)\n"
    )
    print_table([summarize_small(small)])
    print("\nWorst 10 large instances (rows / bound):\n")
    worst = sorted(large, key=lambda r: -r["rows"] / r["bound"])[:10]
    print_table(
        [
            {
                "mixture": r["index"],
                "W": r["W"],
                "n": r["n"],
                "rows": r["rows"],
                "bound": r["bound"],
                "ffd": r["ffd"],
                "small: rows/LP": next(
                    f"{s['rows'] / s['lp']:.4f}{'' if s['converged'] else ' (LP unsolved)'}"
                    for s in small
                    if s["index"] == r["index"]
                ),
                "plan": r["algorithm"],
                "modes": r["mix"],
            }
            for r in worst
        ]
    )
    losses = [s for s in small if s["rows"] > s["lp"]]
    if losses:
        print("\nSmall instances where pack is above the LP bound (or the LP was not solved in time):\n")
        print_table(
            [
                {
                    "mixture": s["index"],
                    "W": s["W"],
                    "rows": s["rows"],
                    "LP bound": s["lp"] if s["converged"] else f"{s['lp']} (Farley, LP unsolved)",
                    "best MIP": s.get("best_known", s["rows"]),
                    "ffd": s["ffd"],
                    "modes": describe(mixture(s["index"])[1]),
                }
                for s in losses
            ]
        )
    if args.speed:
        bench_packing.print_speed(4_000_000)


if __name__ == "__main__":
    main()
