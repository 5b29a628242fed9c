"""Balance benchmark: straggler overhead of data-parallel steps under omnipack's cost model.

    python benchmarks/bench_balance.py           # 50k-sample mixes + the 1M-sample timing (a few minutes)
    python benchmarks/bench_balance.py --quick   # 20k-sample mixes, 200k timing

Each mix draws seeded synthetic samples with real media plans (grids, audio frames) of a profile, costs
them with that profile's default cost model (LM attention + encoders, ``profiles.cost``) and packs them
with omnipack balanced, omnipack unbalanced and the peers of ``peers.py`` (Energon knapsack buffer of 20,
TRL-style BFD per 1000-sample chunk). Rows go to ranks in a seeded random order (a DP sampler's view),
one row per rank per step; straggler overhead = mean over steps of (max rank cost / mean rank cost) - 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# Run from a checkout: prefer this tree's omnipack over any installed copy.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from peers import PEERS  # noqa: E402

from omnipack.packing import pack  # noqa: E402
from omnipack.packing.balance import balance_costs  # noqa: E402
from omnipack.packing.cost import row_costs, straggler_overhead  # noqa: E402
from omnipack.profiles import get_profile  # noqa: E402
from omnipack.profiles.base import MediaPlan  # noqa: E402
from omnipack.profiles.qwen3_omni import audio_output_length  # noqa: E402

ALIGN = 8
DP_SIZES = (8, 64)
PEER_NAMES = ("Energon knapsack buffer 20", "TRL bfd /1000")


class Mix:
    """Per-sample token lengths and encoder FLOPs drawn with a profile's media plans."""

    def __init__(self, profile_name: str, width: int) -> None:
        self.profile = get_profile(profile_name)
        self.model = self.profile.cost_model()
        self.shapes = {"lm": self.model.lm, **self.model.encoders}
        self.width = width
        self.memo: dict[tuple, float] = {}

    def media(self, kind: str, grid: tuple[int, int, int] | None = None, mel: int = 0) -> tuple[int, float]:
        key = (kind, grid, mel)
        if key not in self.memo:
            if kind == "audio":
                plan = MediaPlan(kind="audio", num_tokens=audio_output_length(mel), audio_frames=mel)
            else:
                t, gh, gw = grid
                plan = MediaPlan(
                    kind=kind, num_tokens=t * gh * gw // 4, grid_thw=grid, vision_patches=t * gh * gw
                )
            self.memo[key] = (plan.num_tokens, self.profile.media_cost(plan, self.shapes))
        return self.memo[key]


def _even(rng: np.random.Generator, low: int, high: int, n: int) -> np.ndarray:
    return rng.integers(low // 2, high // 2 + 1, n) * 2


def image_text(rng: np.random.Generator, n: int) -> tuple[Mix, np.ndarray, np.ndarray]:
    """Qwen2.5-VL, W=8192: text lognormal median 150, 0-4 images of 8..72 x 8..72 patches (16-1296 tokens)."""
    mix = Mix("qwen2_5_vl", 8192)
    tokens = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    flops = np.zeros(n)
    num_images = rng.integers(0, 5, n)
    for k in range(1, 5):
        has = np.flatnonzero(num_images >= k)
        gh, gw = _even(rng, 8, 72, len(has)), _even(rng, 8, 72, len(has))
        for i, h, w in zip(has.tolist(), gh.tolist(), gw.tolist(), strict=True):
            t, f = mix.media("image", (1, h, w))
            tokens[i] += t
            flops[i] += f
    return mix, tokens, flops


def omni(rng: np.random.Generator, n: int) -> tuple[Mix, np.ndarray, np.ndarray]:
    """Qwen3-Omni, W=16384: 60% image-text (as above), 25% video (2-16 frame groups of 16..40 x 16..40
    patches), 15% audio (2-30 s), each with lognormal text."""
    mix = Mix("qwen3_omni", 16384)
    _, img_tokens, _ = image_text(np.random.default_rng(rng.integers(1 << 31)), 0)
    tokens = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    flops = np.zeros(n)
    kind = rng.choice(3, n, p=[0.6, 0.25, 0.15])
    num_images = np.where(kind == 0, rng.integers(0, 5, n), 0)
    for i in range(n):
        if kind[i] == 0:
            for _ in range(num_images[i]):
                t, f = mix.media("image", (1, int(_even(rng, 8, 72, 1)[0]), int(_even(rng, 8, 72, 1)[0])))
                tokens[i] += t
                flops[i] += f
        elif kind[i] == 1:
            grid = (int(rng.integers(2, 17)), int(_even(rng, 16, 40, 1)[0]), int(_even(rng, 16, 40, 1)[0]))
            t, f = mix.media("video", grid)
            tokens[i] += t
            flops[i] += f
        else:
            t, f = mix.media("audio", mel=int(rng.integers(200, 3001)))
            tokens[i] += t
            flops[i] += f
    del img_tokens
    return mix, tokens, flops


def video_heavy(rng: np.random.Generator, n: int) -> tuple[Mix, np.ndarray, np.ndarray]:
    """Qwen3-VL, W=32768: 70% video (2-24 frame groups of 16..48 x 16..48 patches, up to ~14k tokens),
    30% text-only (lognormal median 400)."""
    mix = Mix("qwen3_vl", 32768)
    tokens = np.round(rng.lognormal(np.log(150), 0.8, n)).astype(np.int64) + 1
    flops = np.zeros(n)
    is_video = rng.random(n) < 0.7
    text_only = np.round(rng.lognormal(np.log(400), 1.0, n)).astype(np.int64) + 1
    tokens = np.where(is_video, tokens, text_only)
    for i in np.flatnonzero(is_video).tolist():
        grid = (int(rng.integers(2, 25)), int(_even(rng, 16, 48, 1)[0]), int(_even(rng, 16, 48, 1)[0]))
        t, f = mix.media("video", grid)
        tokens[i] += t
        flops[i] += f
    return mix, tokens, flops


MIXES = {"image-text": image_text, "omni": omni, "video-heavy": video_heavy}


def padded(tokens: np.ndarray, width: int) -> np.ndarray:
    return np.minimum(-(-tokens // ALIGN) * ALIGN, width)


def evaluate(name, method, row_of, num_rows, seconds, sample_cost, constant, order_rng_seed):
    costs = row_costs(np.asarray(row_of), num_rows, sample_cost, constant)
    order = np.random.default_rng(order_rng_seed).permutation(num_rows)
    ranked = costs[order]
    mean = costs.mean()
    cells = [straggler_overhead(ranked, dp) for dp in DP_SIZES]
    return {
        "set": name,
        "method": method,
        "rows": int(num_rows),
        "cv": float(costs.std() / mean),
        "max": float(costs.max() / mean),
        "overhead": cells,
        "seconds": seconds,
    }


def run_mix(name: str, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    mix, tokens, flops = MIXES[name](rng, n)
    width = mix.width
    keep = tokens <= width
    lengths = padded(tokens[keep], width)
    sample_cost = mix.model.sample_costs(lengths, flops[keep])
    constant = mix.model.row_constant(width)
    print(
        f"# {name}: {int(keep.sum())} samples ({int((~keep).sum())} over W dropped), W={width}",
        file=sys.stderr,
    )
    out = []
    start = time.process_time()
    plan = pack(lengths, width, shuffle=False)
    t_plain = time.process_time() - start
    out.append(
        evaluate(
            name,
            "omnipack unbalanced (bfd)",
            plan.row_of,
            plan.num_rows,
            t_plain,
            sample_cost,
            constant,
            seed,
        )
    )
    start = time.process_time()
    row_of, rows = balance_costs(
        lengths,
        sample_cost,
        width,
        plan.row_of,
        plan.num_rows,
        max_rows=plan.num_rows + plan.num_rows // 500,
        row_constant=constant,
    )
    t_bal = time.process_time() - start + t_plain
    out.append(evaluate(name, "omnipack balanced", row_of, rows, t_bal, sample_cost, constant, seed))
    for peer in PEER_NAMES:
        start = time.process_time()
        peer_rows = PEERS[peer](lengths, width)
        out.append(
            evaluate(
                name,
                peer,
                peer_rows,
                int(peer_rows.max()) + 1,
                time.process_time() - start,
                sample_cost,
                constant,
                seed,
            )
        )
    return out


def time_mix(name: str, n: int, seed: int) -> tuple[dict, dict]:
    """Wall time of the whole balanced plan (sample costs + dense pack + balancing) at scale."""
    rng = np.random.default_rng(seed)
    mix, tokens, flops = MIXES[name](rng, n)
    keep = tokens <= mix.width
    lengths = padded(tokens[keep], mix.width)
    constant = mix.model.row_constant(mix.width)
    print(f"# timing {name}: {int(keep.sum())} samples", file=sys.stderr, flush=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    sample_cost = mix.model.sample_costs(lengths, flops[keep])
    plan = pack(lengths, mix.width, shuffle=False)
    t_plain = time.process_time() - cpu_start
    row_of, rows = balance_costs(
        lengths,
        sample_cost,
        mix.width,
        plan.row_of,
        plan.num_rows,
        max_rows=plan.num_rows + plan.num_rows // 500,
        row_constant=constant,
    )
    seconds, wall = time.process_time() - cpu_start, time.perf_counter() - start
    label = f"{name} {n // 1000}k"
    plain = evaluate(
        label, "omnipack unbalanced (bfd)", plan.row_of, plan.num_rows, t_plain, sample_cost, constant, seed
    )
    balanced = evaluate(label, "omnipack balanced", row_of, rows, seconds, sample_cost, constant, seed)
    balanced["wall"] = wall
    return plain, balanced


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--timing-samples", type=int, default=None)
    ap.add_argument("--mixes", nargs="+", default=list(MIXES))
    args = ap.parse_args()
    n = args.samples or (20_000 if args.quick else 50_000)
    rows = []
    for name in args.mixes:
        rows += run_mix(name, n, seed=1)
    timing = (
        args.timing_samples if args.timing_samples is not None else (200_000 if args.quick else 1_000_000)
    )
    if timing:
        for name in ("image-text", "omni"):
            plain, balanced = time_mix(name, timing, seed=2)
            rows += [plain, balanced]
    header = (
        "| set | method | rows | rows vs unbalanced | row cost CV | max row / mean | "
        + " | ".join(f"overhead DP={dp}" for dp in DP_SIZES)
        + " | CPU s |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    base_rows = {r["set"]: r["rows"] for r in rows if r["method"].startswith("omnipack unbalanced")}
    for r in rows:
        print(
            f"| {r['set']} | {r['method']} | {r['rows']} | {r['rows'] / base_rows[r['set']] - 1:+.2%} | "
            f"{r['cv']:.4f} | {r['max']:.3f} | "
            + " | ".join(f"{o:.2%}" for o in r["overhead"])
            + f" | {r['seconds']:.2f}"
            + (f" ({r['wall']:.1f} wall)" if "wall" in r else "")
            + " |"
        )


if __name__ == "__main__":
    main()
