"""Property-based benchmark of constrained packing: rows against the vector bound over random mixtures
under random per-row limits (a sample cap, media budgets, or both).

    python benchmarks/bench_constrained_mixes.py                      # 200 mixtures, 10k-100k samples
    python benchmarks/bench_constrained_mixes.py --shard 0/2 --out a.jsonl &   # the same, on two cores
    python benchmarks/bench_constrained_mixes.py --shard 1/2 --out b.jsonl; wait
    python benchmarks/bench_constrained_mixes.py --summarize a.jsonl b.jsonl
    python benchmarks/bench_constrained_mixes.py --small 1000 --mip-seconds 30 --lp-solves 3000  # LP, MIP

Each mixture (seeded by its index) draws W from 4096/8192/16384/32768, lengths from ``mixes.random_mixture``
(2-4 modes: lognormal, uniform, spikes, power-law tail) and limits from ``mixes.random_constraints`` (a cap
near W over the mean length, media items and vision patches in step with the tokens, or both), so that the
limits bind about as hard as the tokens. It is packed twice:

- the fast constrained best fit (``constraints.constrained_pack``: the greedy baseline; ``pack`` must never
  keep more rows);
- ``pack``, every step.

Both against the vector bound (``bounds.constrained_lower_bounds``). The summary gives, per kind of limit,
the worst and the 99th percentile of rows / bound and the plans more than 0.1% and more than one row over
the bound ("over tol."). ``--lp-bound`` adds, for those, the vector pattern LP's bound
(``vector_lp_rows_bound``; minutes at these sizes, and within its work limit it may prove nothing above the
vector bound).

``--small N`` packs every mixture at N samples instead (the issue's "small instances"). Wherever ``pack``
is above the vector bound there, the LP bound is computed, and wherever it is above the LP bound, an
assignment MIP (``optimum.vector_packing_feasible``) says whether the LP bound's row count is reachable (the
packer's loss), proven unreachable (the LP bound not tight) or undecided within ``--mip-seconds``. The
limits of a mixture at N samples are not those of the same index at full size (their draws follow the
lengths'): a sweep of its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from bench_packing_mixes import over_tolerance, print_table  # noqa: E402
from mixes import (  # noqa: E402
    CONSTRAINT_KINDS,
    WIDTHS,
    describe,
    describe_constraints,
    random_constraints,
    random_mixture,
    sample_mixture,
)
from optimum import vector_packing_feasible  # noqa: E402

from omnipack.packing import PackConstraints, engine, pack  # noqa: E402
from omnipack.packing.constraints import constrained_pack  # noqa: E402
from omnipack.packing.patterns import LpLimits  # noqa: E402
from omnipack.packing.vector_patterns import vector_lp_rows_bound  # noqa: E402

# The vector pattern LP is over distinct item vectors: a sample cap alone gives one class per length, media
# amounts nearly one per sample, whose LP is out of reach at these sizes (``relaxed`` coarsens those).
LP_MAX_CLASSES = 2000


def draw(index: int, n: int | None, low: int, high: int) -> tuple[np.ndarray, int, dict, list[dict]]:
    """Mixture ``index``: its lengths (``n`` of them, or log-uniform in [low, high]), W, limits and modes."""
    rng = np.random.default_rng([2026, index])
    width = WIDTHS[int(rng.integers(len(WIDTHS)))]
    modes = random_mixture(rng, width)
    drawn = int(np.exp(rng.uniform(np.log(low), np.log(high))))  # drawn either way: the same limits after it
    size = drawn if n is None else n
    lengths = sample_mixture(rng, modes, size, width)
    return lengths, width, random_constraints(rng, lengths, width), modes


def as_constraints(limits: dict) -> PackConstraints:
    resources = {}
    if limits["media"] is not None:
        resources = {
            "media": (limits["media"], limits["media_budget"]),
            "patches": (limits["patches"], limits["patch_budget"]),
        }
    return PackConstraints(max_samples_per_row=limits["cap"], resources=resources)


def mip_verdict(
    lengths: np.ndarray, width: int, constraints: PackConstraints, rows: int, seconds: float
) -> str:
    """Whether an assignment MIP packs the items into ``rows`` rows (the bound's count)."""
    dims, caps = engine._constrained_dims(lengths, width, constraints)  # the packer's own item vectors
    fits = vector_packing_feasible(dims, caps, rows, seconds=seconds)
    return {True: "packer's loss", False: "bound not tight", None: "undecided"}[fits]


def run_one(index: int, n: int | None, low: int, high: int) -> dict:
    """Mixture ``index`` (``n`` samples, or log-uniform in [low, high]) packed by the fast best fit and by
    ``pack``."""
    lengths, width, limits, modes = draw(index, n, low, high)
    constraints = as_constraints(limits)
    bound = engine._constrained_bound(lengths, width, constraints)
    start = time.perf_counter()
    fast_rows = constrained_pack(lengths, width, constraints)[1]
    fast_s = time.perf_counter() - start
    start = time.perf_counter()
    rows = pack(lengths, width, constraints=constraints).num_rows
    return {
        "index": index, "W": width, "n": len(lengths), "kind": limits["kind"],
        "limits": describe_constraints(limits), "mixture": describe(modes), "vector bound": bound,
        "rows fast fit": fast_rows, "rows pack": rows, "s fast fit": fast_s,
        "s pack": time.perf_counter() - start,
    }  # fmt: skip


def with_mip_verdict(result: dict, low: int, high: int, seconds: float) -> dict:
    """A small instance's ``result`` with "MIP": where ``pack`` is above its LP bound, whether an assignment
    MIP packs the samples into that many rows (the packer's loss) or proves it cannot (the bound not
    tight); "at LP bound" otherwise."""
    verdict = "at LP bound"
    if result["rows pack"] > result["LP bound"]:
        lengths, width, limits, _ = draw(result["index"], result["n"], low, high)
        verdict = mip_verdict(lengths, width, as_constraints(limits), result["LP bound"], seconds)
    return result | {"MIP": verdict}


def relaxed(lengths: np.ndarray, limits: dict, width: int, most: int) -> tuple[np.ndarray, dict, int]:
    """The instance with its lengths and patches rounded down to a grid of steps (a relaxation: any plan of
    the instance packs it, so its LP bound holds for the instance), the grid as fine as leaves at most
    ``most`` distinct item vectors (or the coarsest tried, which may leave more); and how many there are."""
    for steps in (None, 4096, 2048, 1024, 512, 256, 128, 64, 32):
        lengths_down, limits_down = lengths, limits
        if steps is not None:
            lengths_down = np.maximum(lengths // -(-width // steps) * -(-width // steps), 1)
            if limits["media"] is not None:
                grain = -(-limits["patch_budget"] // steps)
                limits_down = limits | {"patches": limits["patches"] // grain * grain}
        columns = [lengths_down]
        if limits["media"] is not None:
            columns += [limits["media"], limits_down["patches"]]
        classes = len(np.unique(np.stack(columns, axis=1), axis=0))
        if classes <= most:
            break
    return lengths_down, limits_down, classes


def with_lp_bound(
    result: dict,
    low: int,
    high: int,
    limits: LpLimits,
    every: bool = False,
    kinds: tuple[str, ...] = CONSTRAINT_KINDS,
) -> dict:
    """``result`` with "LP bound" where ``pack`` is over tolerance (``every``: above the vector bound at all):
    the vector pattern LP's bound (``vector_lp_rows_bound``, from the fast fit's plan; on the ``relaxed``
    instance where the items form more than LP_MAX_CLASSES classes), else the vector bound again. "LP
    classes": the classes it ran on. ``result`` as it is where its kind of limit is not in ``kinds``."""
    if result["kind"] not in kinds:
        return result
    bound, classes = result["vector bound"], 0
    rows = result["rows pack"]
    if rows > bound if every else over_tolerance(rows, bound):
        lengths, width, row_limits, _ = draw(result["index"], result["n"], low, high)
        lengths, row_limits, classes = relaxed(lengths, row_limits, width, LP_MAX_CLASSES)
        constraints = as_constraints(row_limits)
        start = constrained_pack(lengths, width, constraints)
        bound = vector_lp_rows_bound(lengths, width, constraints, start, bound, limits)
    return result | {"LP bound": bound, "LP classes": classes}


def lp_limits(solves: int) -> LpLimits:
    return LpLimits(max_columns=10**5, max_knapsack_work=10**13, max_lp_solves=solves, max_rounds=solves)


def summarize(results: list[dict]) -> list[dict]:
    """Per kind of limit (and all): rows / bound (worst, p99, median), plans over tolerance, plans with more
    rows than the fast best fit, the slowest plan."""
    out = []
    for kind in [*dict.fromkeys(r["kind"] for r in results), "all"]:
        sel = [r for r in results if kind in ("all", r["kind"])]
        ratio = np.array([r["rows pack"] / r["vector bound"] for r in sel])
        fast = np.array([r["rows fast fit"] / r["vector bound"] for r in sel])
        row = {
            "limits": kind, "mixtures": len(sel), "at bound": int((ratio == 1).sum()),
            "over tol.": sum(over_tolerance(r["rows pack"], r["vector bound"]) for r in sel),
            "worst": ratio.max(), "p99": float(np.quantile(ratio, 0.99)), "median": float(np.median(ratio)),
            "fast fit worst": fast.max(),
            "more than fast fit": sum(r["rows pack"] > r["rows fast fit"] for r in sel),
            "max s": max(r["s pack"] for r in sel),
        }  # fmt: skip
        if all("LP bound" in r for r in sel):
            row["over tol. of LP bound"] = sum(over_tolerance(r["rows pack"], r["LP bound"]) for r in sel)
            row["worst of LP bound"] = max(r["rows pack"] / r["LP bound"] for r in sel)
        if all("MIP" in r for r in sel):
            row["above LP bound"] = sum(r["MIP"] != "at LP bound" for r in sel)
            row["packer's loss"] = sum(r["MIP"] == "packer's loss" for r in sel)
            row["LP bound not tight"] = sum(r["MIP"] == "bound not tight" for r in sel)
        out.append(row)
    return out


def report(results: list[dict], worst: int) -> None:
    print("\nrows / vector bound of pack, per kind of limit\n")
    print_table(summarize(results))
    ranked = sorted(results, key=lambda r: r["rows pack"] / r["vector bound"], reverse=True)[:worst]
    print(f"\nthe {len(ranked)} plans furthest over their bound\n")
    print_table([
        {k: r.get(k, "") for k in ("index", "W", "n", "limits", "vector bound", "LP bound", "rows fast fit")}
        | {k: r[k] for k in ("rows pack", "s pack")}
        | {"rows/bound": r["rows pack"] / r["vector bound"], "mixture": r["mixture"]}
        for r in ranked
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixtures", type=int, default=200)
    parser.add_argument("--first", type=int, default=0, help="index of the first mixture")
    parser.add_argument("--low", type=int, default=10_000, help="fewest samples of a mixture")
    parser.add_argument("--high", type=int, default=100_000, help="most samples of a mixture")
    parser.add_argument(
        "--shard", default="0/1", metavar="I/N", help="only the mixtures whose index is I mod N"
    )
    parser.add_argument(
        "--small", type=int, default=0, metavar="N",
        help="every mixture at N samples instead, with the LP bound wherever pack is above the vector bound"
        " and a MIP verdict wherever it is above the LP bound",
    )  # fmt: skip
    parser.add_argument("--mip-seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, help="append each result to this JSON-lines file")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSONL", help="only report these files")
    parser.add_argument(
        "--lp-bound", action="store_true",
        help=f"plans over tolerance: the vector pattern LP's bound too (at most {LP_MAX_CLASSES} classes)",
    )  # fmt: skip
    parser.add_argument(
        "--lp-solves", type=int, default=2000, help="LP solves of each LP bound (its work limit)"
    )
    parser.add_argument(
        "--lp-kinds", default=",".join(CONSTRAINT_KINDS),
        help="only these kinds of limit get the LP bound (comma-separated; under a sample cap alone its"
        " pricing is exact, so within its solves it can rise above the vector bound at full size)",
    )  # fmt: skip
    parser.add_argument(
        "--worst", type=int, default=10, help="list this many plans furthest over their bound"
    )
    args = parser.parse_args()
    if args.summarize:
        results = [json.loads(line) for path in args.summarize for line in path.read_text().splitlines()]
        if args.lp_bound:
            limits = lp_limits(args.lp_solves)
            results = sorted(results, key=lambda r: r["index"])
            kinds = tuple(args.lp_kinds.split(","))
            results = [with_lp_bound(r, args.low, args.high, limits, kinds=kinds) for r in results]
        return report(results, args.worst)
    shard, shards = (int(part) for part in args.shard.split("/"))
    results = []
    for index in range(args.first, args.first + args.mixtures):
        if index % shards != shard:
            continue
        results.append(run_one(index, args.small or None, args.low, args.high))
        if args.lp_bound or args.small:
            limits = lp_limits(args.lp_solves)
            results[-1] = with_lp_bound(results[-1], args.low, args.high, limits, every=bool(args.small))
        if args.small and args.mip_seconds > 0:
            results[-1] = with_mip_verdict(results[-1], args.low, args.high, args.mip_seconds)
        print(f"# {results[-1]}", file=sys.stderr, flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(results[-1]) + "\n")
    report(results, args.worst)


if __name__ == "__main__":
    main()
