"""Packing benchmark: omnipack vs re-implemented peer packers on seeded synthetic length sets.

    python benchmarks/bench_packing.py           # full run (a few minutes on 2 cores)
    python benchmarks/bench_packing.py --quick   # ~1 minute (constrained speed sets at 200k, 1M speed set)

Lengths are padded to ALIGN before packing (as the writer does); real efficiency counts real tokens.
Rows are compared with each lower bound (L1, Martello-Toth L2, Fekete-Schepers DFF; constrained sets: the
vector bound of ``bounds.constrained_lower_bounds``). The speed table times the plan against the C++
lightbinpack ``obfd`` in the same run (skipped, with a note, when lightbinpack is not installed).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Run from a checkout: prefer this tree's omnipack over any installed copy.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from peers import LIGHTBINPACK_OBFD, PEERS  # noqa: E402

from omnipack.packing import PackConstraints, lower_bounds, pack  # noqa: E402
from omnipack.packing.balance import attention_cost, coefficient_of_variation  # noqa: E402
from omnipack.packing.bounds import constrained_lower_bounds  # noqa: E402
from omnipack.packing.constraints import constrained_bfd, constrained_pack  # noqa: E402

ALIGN = 8


def text_sft(rng: np.random.Generator, n: int, width: int) -> dict:
    real = np.clip(np.round(rng.lognormal(np.log(400), 1.0, n)), 1, width).astype(np.int64)
    return {"real": real}


def image_text(rng: np.random.Generator, n: int, width: int) -> dict:
    """Qwen2.5-VL-like: text median 150, 0-4 images of 64-1280 tokens each (4 patches per token)."""
    text = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    num_images = rng.integers(0, 5, n)
    image_tokens = np.zeros(n, dtype=np.int64)
    for k in range(1, 5):
        has = num_images >= k
        image_tokens[has] += rng.integers(64, 1281, int(has.sum()))
    real = np.minimum(text + image_tokens, width)
    return {"real": real, "media": num_images, "patches": image_tokens * 4}


def bimodal_image_text(rng: np.random.Generator, n: int, width: int) -> dict:
    """Half the samples carry one high-resolution image of 0.2-0.55 W tokens, half one small image of
    512-1536 tokens; each plus lognormal text (median 150). Greedy fits strand mid-sized items here."""
    text = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    large = rng.random(n) < 0.5
    image = np.where(
        large, rng.integers(int(0.2 * width), int(0.55 * width) + 1, n), rng.integers(512, 1537, n)
    )
    return {
        "real": np.minimum(text + image, width),
        "media": np.ones(n, dtype=np.int64),
        "patches": image * 4,
    }


def omni_mix(rng: np.random.Generator, n: int, width: int) -> dict:
    """60% image-text, 25% video (1k-6k tokens), 15% audio (25 tok/s x 2-30 s), plus text."""
    base = image_text(rng, n, width)
    kind = rng.choice(3, n, p=[0.6, 0.25, 0.15])
    text = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    video = rng.integers(1000, 6001, n)
    audio_frames = rng.integers(2 * 25, 30 * 25 + 1, n)
    real = np.where(kind == 0, base["real"], np.where(kind == 1, text + video, text + audio_frames))
    media = np.where(kind == 0, base["media"], 1)
    patches = np.where(kind == 0, base["patches"], np.where(kind == 1, video * 4, 0))
    audio = np.where(kind == 2, audio_frames, 0)
    return {"real": np.minimum(real, width), "media": media, "patches": patches, "audio": audio}


def adversarial(rng: np.random.Generator, n: int, width: int) -> dict:
    """30k items in (W/3, W/2], 10k in (W/2, 0.73W], 5k small (scaled to n): FFD/BFD miss l1 here."""
    mid = rng.integers(width // 3 + 1, width // 2 + 1, n * 30 // 45)
    big = rng.integers(width // 2 + 1, int(0.73 * width) + 1, n * 10 // 45)
    small = rng.integers(1, width // 10, n - len(mid) - len(big))
    return {"real": rng.permutation(np.concatenate([mid, big, small]))}


def padded(real: np.ndarray, width: int) -> np.ndarray:
    return np.minimum(-(-real // ALIGN) * ALIGN, width)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(name, algo, row_of, num_rows, seconds, real, lengths, width, cv_base=None, bound=None):
    """One table row; ``bound`` (constrained sets) replaces the token bounds in the `rows/bound` column."""
    print(f"#   {algo}: {num_rows} rows, {seconds:.2f} s", file=sys.stderr, flush=True)
    bounds = lower_bounds(lengths, width)
    slots = num_rows * width
    cost_cv = coefficient_of_variation(attention_cost(row_of, num_rows, lengths))
    cv = f"{cost_cv:.3f}" if cv_base is None else f"{cv_base:.3f}->{cost_cv:.3f}"
    return {
        "set": name,
        "algorithm": algo,
        "rows": num_rows,
        "rows/l1": num_rows / bounds["l1"],
        "rows/l2": num_rows / bounds["l2"],
        "rows/dff": num_rows / bounds["dff"],
        "rows/bound": num_rows / (bound or max(bounds.values())),
        "real eff": real.sum() / slots,
        "padded eff": lengths.sum() / slots,
        "time s": seconds,
        "cost CV": cv,
    }


def bench_one_set(name, data, width, *, peers=True, window=None, constraints=None, reference=False, balance=True):
    real = data["real"]
    lengths = padded(real, width)
    results = []
    base_cv = None
    print(f"# {name}: n={len(real)}", file=sys.stderr, flush=True)
    for algo, kwargs in (("omnipack bfd", {}), ("classic ffd (omnipack ffd)", {"algorithm": "ffd"})):
        plan, sec = timed(lambda kw=kwargs: pack(lengths, width, **kw))
        label = f"{algo} [{plan.algorithm}]" if algo == "omnipack bfd" else algo
        results.append(measure(name, label, plan.row_of, plan.num_rows, sec, real, lengths, width))
        if base_cv is None:
            base_cv = coefficient_of_variation(attention_cost(plan.row_of, plan.num_rows, lengths))
    if window:
        plan, sec = timed(lambda: pack(lengths, width, window=window))
        results.append(
            measure(name, f"omnipack window={window}", plan.row_of, plan.num_rows, sec, real, lengths, width)
        )
    if balance:
        plan, sec = timed(lambda: pack(lengths, width, balance=True))
        results.append(
            measure(
                name, "omnipack bfd balance", plan.row_of, plan.num_rows, sec, real, lengths, width, base_cv
            )
        )
    if constraints is not None:
        amounts, budgets = constraints.amounts_matrix(len(lengths))
        cbounds = constrained_lower_bounds(lengths, width, amounts, budgets, constraints.max_samples_per_row)
        bound = cbounds["best"]
        plan, sec = timed(lambda: pack(lengths, width, constraints=constraints))
        label = f"omnipack constrained (vector bound {bound})"
        results.append(
            measure(name, label, plan.row_of, plan.num_rows, sec, real, lengths, width, bound=bound)
        )
        if reference:
            # The previous default: exact item-by-item constrained BFD (superlinear; small sets only).
            (row_of, num_rows), sec = timed(lambda: constrained_bfd(lengths, width, constraints))
            label = "exact constrained bfd, old"
            results.append(measure(name, label, row_of, num_rows, sec, real, lengths, width, bound=bound))
    if peers:
        for algo, fn in PEERS.items():
            row_of, sec = timed(lambda fn=fn: fn(lengths, width))
            results.append(measure(name, algo, row_of, int(row_of.max()) + 1, sec, real, lengths, width))
    return results


def speed_vs_lightbinpack(lengths: np.ndarray, width: int, repeats: int = 3) -> list[dict]:
    """omnipack ``pack`` (to a shuffled CSR plan) vs lightbinpack ``obfd`` (to its list of row lists),
    interleaved, best of ``repeats`` each; lightbinpack gets its input as the Python list it takes."""
    import lightbinpack

    as_list = lengths.tolist()
    ours, theirs = [], []
    for _ in range(repeats):
        plan, sec = timed(lambda: pack(lengths, width))
        ours.append(sec)
        bins, sec = timed(lambda: lightbinpack.obfd(as_list, width))
        theirs.append(sec)
    return [
        {
            "plan": "omnipack pack",
            "rows": plan.num_rows,
            "best s": min(ours),
            "vs lightbinpack": min(ours) / min(theirs),
        },
        {"plan": "lightbinpack obfd", "rows": len(bins), "best s": min(theirs), "vs lightbinpack": 1.0},
    ]


def media_constraints(data: dict, width: int) -> PackConstraints:
    """At most 16 media items, 3*width vision patches and 2000 audio frames per row."""
    resources = {"media": (data["media"], 16), "patches": (data["patches"], 3 * width)}
    if "audio" in data:
        resources["audio"] = (data["audio"], 2000)
    return PackConstraints(max_samples_per_row=64, resources=resources)


COLUMN_FORMATS = {
    "rows/l1": "{:.4f}",
    "rows/l2": "{:.4f}",
    "rows/dff": "{:.4f}",
    "rows/bound": "{:.4f}",
    "best s": "{:.3f}",
    "vs lightbinpack": "{:.2f}x",
    "real eff": "{:.2%}",
    "padded eff": "{:.2%}",
    "time s": "{:.2f}",
    "max s": "{:.2f}",
    "worst": "{:.4f}",
    "median": "{:.4f}",
    "baseline worst": "{:.4f}",
    "baseline median": "{:.4f}",
}


def print_table(rows: list[dict], cell: Callable[[str, Any], str] | None = None) -> None:
    """``rows`` (dicts with the same keys) as a markdown table, each value as ``cell(column, value)`` writes
    it (default: its column's format in ``COLUMN_FORMATS``, else ``str``)."""
    cols = list(rows[0])
    cell = cell or (lambda column, value: COLUMN_FORMATS.get(column, "{}").format(value))
    cells = [[cell(c, r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |", flush=True)


def two_budget_constraints(data: dict, width: int) -> PackConstraints:
    """Tokens plus a media count that binds as hard: 10 media items per row (image-text: ~2 per sample)."""
    return PackConstraints(resources={"media": (data["media"], 10)})


def seed_sweep(seeds: range, sizes: tuple[int, ...]) -> list[dict]:
    """Worst and median rows/bound over seeds x sizes per mix, for omnipack and for classic FFD (constrained
    set: omnipack against the previous default, the best-fit ``constrained_pack``, both vs the vector bound)."""
    out = []
    for mix, widths in (("text", (4096, 8192, 16384)), ("bimodal img-text", (4096, 8192, 16384))):
        make = text_sft if mix == "text" else bimodal_image_text
        for width in widths:
            ours, ffd, secs = [], [], []
            for seed in seeds:
                for n in sizes:
                    lengths = padded(make(np.random.default_rng(1000 + seed), n, width)["real"], width)
                    bound = max(lower_bounds(lengths, width).values())
                    plan, sec = timed(lambda lengths=lengths, width=width: pack(lengths, width))
                    ours.append(plan.num_rows / bound)
                    ffd.append(pack(lengths, width, algorithm="ffd").num_rows / bound)
                    secs.append(sec)
            out.append(_sweep_row(f"{mix} W={width}", "omnipack bfd", "classic ffd", ours, ffd, secs))
    ours, base, secs = [], [], []
    for seed in seeds:
        for n in sizes:
            data = image_text(np.random.default_rng(2000 + seed), n, 8192)
            lengths = padded(data["real"], 8192)
            constraints = two_budget_constraints(data, 8192)
            amounts, budgets = constraints.amounts_matrix(n)
            bound = constrained_lower_bounds(lengths, 8192, amounts, budgets)["best"]
            plan, sec = timed(lambda lengths=lengths, c=constraints: pack(lengths, 8192, constraints=c))
            ours.append(plan.num_rows / bound)
            base.append(constrained_pack(lengths, 8192, constraints)[1] / bound)
            secs.append(sec)
    out.append(
        _sweep_row(
            "image-text tokens+media W=8192",
            "omnipack constrained",
            "best-fit constrained_pack",
            ours,
            base,
            secs,
        )
    )
    return out


def _sweep_row(name: str, ours_name: str, base_name: str, ours: list, base: list, secs: list) -> dict:
    print(f"# sweep {name}: worst {max(ours):.4f} vs {max(base):.4f}", file=sys.stderr, flush=True)
    return {
        "set": name,
        "instances": len(ours),
        "plan": ours_name,
        "worst": max(ours),
        "median": float(np.median(ours)),
        "baseline": base_name,
        "baseline worst": max(base),
        "baseline median": float(np.median(base)),
        "max s": max(secs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sets, no 10M run, 1M speed set")
    parser.add_argument(
        "--only", metavar="TEXT", help="only the sets whose name contains TEXT (every set is still drawn, so the "
        "chosen ones are the full run's); no sweeps, no speed table"
    )  # fmt: skip
    args = parser.parse_args()

    def bench_set(name: str, *rest, **kwargs) -> list:
        return bench_one_set(name, *rest, **kwargs) if not args.only or args.only in name else []
    n = 20_000 if args.quick else 50_000
    window = n // 5
    rng = np.random.default_rng(20240601)
    results = []
    for width in (4096, 8192, 16384):
        results += bench_set(f"text W={width}", text_sft(rng, n, width), width, window=window)
    for width in (4096, 8192, 16384):
        results += bench_set(
            f"bimodal img-text W={width}", bimodal_image_text(rng, n, width), width, window=window
        )
    img = image_text(rng, n, 8192)
    img_c = media_constraints(img, 8192)
    results += bench_set("image-text W=8192", img, 8192, window=window, constraints=img_c, reference=True)
    results += bench_set(
        "image-text tokens+media W=8192",
        img,
        8192,
        peers=False,
        balance=False,
        constraints=two_budget_constraints(img, 8192),
    )
    omni = omni_mix(rng, n, 16384)
    omni_c = media_constraints(omni, 16384)
    results += bench_set("omni W=16384", omni, 16384, window=window, constraints=omni_c, reference=True)
    results += bench_set("adversarial W=8192", adversarial(rng, 45_000, 8192), 8192, window=window)
    big = 1_000_000
    results += bench_set(
        "text 1M W=4096", text_sft(rng, big, 4096), 4096, peers=not args.quick, window=100_000
    )
    # Constrained speed sets with binding budgets (peers skipped: they have no resource budgets).
    media_n = 200_000 if args.quick else big
    tag = "200k" if args.quick else "1M"
    img = image_text(rng, media_n, 8192)
    results += bench_set(
        f"image-text {tag} W=8192", img, 8192, peers=False, constraints=media_constraints(img, 8192)
    )
    omni = omni_mix(rng, media_n, 16384)
    results += bench_set(
        f"omni {tag} W=16384", omni, 16384, peers=False, constraints=media_constraints(omni, 16384)
    )
    if not args.quick:
        # Peers are skipped at 10M: pure-Python per-item loops take minutes there.
        results += bench_set(
            "text 10M W=4096", text_sft(rng, 10 * big, 4096), 4096, peers=False, window=1_000_000
        )
    print_table(results)
    if args.only:
        return
    seeds = range(3) if args.quick else range(6)
    sizes = (20_000,) if args.quick else (20_000, 50_000)
    print(
        f"\nRows / best lower bound over {len(seeds)} seeds x sizes {sizes} (seeds differ from the table above):\n"
    )
    print_table(seed_sweep(seeds, sizes))
    print_speed(big if args.quick else 4 * big)


def print_speed(n: int) -> None:
    """The plan speed table: ``n`` padded text samples at W=4096, omnipack against lightbinpack's OBFD."""
    print(f"\nPlan speed, text {n // 1_000_000}M W=4096 (same run, best of 3):\n")
    if LIGHTBINPACK_OBFD is None:
        print("lightbinpack is not installed (pip install lightbinpack): speed comparison skipped.")
    else:
        lengths = padded(text_sft(np.random.default_rng(7), n, 4096)["real"], 4096)
        print_table(speed_vs_lightbinpack(lengths, 4096))


if __name__ == "__main__":
    main()
