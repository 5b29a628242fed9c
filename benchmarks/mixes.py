"""Random length mixtures for the property-based packing benchmark (and the tests that replay its losses).

A mixture has 2-4 modes, each with a weight from a Dirichlet draw:

- ``lognormal``: median 0.3%-30% of W, sigma 0.3-1.3 (text, captions, transcripts);
- ``uniform``: an interval inside (0, W] (crops, chunked documents);
- ``spikes``: 1-4 fixed lengths of 1%-60% of W (single images at a fixed resolution), half of the
  time plus a short lognormal prompt (median 10-150 tokens);
- ``tail``: small items with a power-law tail (many small images, few large ones).

Lengths are padded to ``align`` (as the writer does) and clipped to W.

``random_constraints`` draws per-row limits for a mixture (a sample cap, media budgets, or both) for the
constrained sweep (``bench_constrained_mixes.py``).
"""

from __future__ import annotations

import numpy as np

MODE_KINDS = ("lognormal", "uniform", "spikes", "tail")
WIDTHS = (4096, 8192, 16384, 32768)


def random_mixture(rng: np.random.Generator, width: int) -> list[dict]:
    """2-4 mode descriptions (kind, weight, parameters) for rows of width ``width``."""
    num_modes = int(rng.integers(2, 5))
    weights = rng.dirichlet(np.ones(num_modes))
    modes = []
    for weight in weights.tolist():
        kind = MODE_KINDS[int(rng.integers(len(MODE_KINDS)))]
        mode: dict = {"kind": kind, "weight": weight}
        if kind == "lognormal":
            mode["median"] = float(width * np.exp(rng.uniform(np.log(0.003), np.log(0.3))))
            mode["sigma"] = float(rng.uniform(0.3, 1.3))
        elif kind == "uniform":
            lo = float(rng.uniform(0, 0.5) * width)
            mode["low"], mode["high"] = lo, float(min(width, lo + rng.uniform(0.05, 0.6) * width))
        elif kind == "spikes":
            count = int(rng.integers(1, 5))
            mode["values"] = np.round(width * np.exp(rng.uniform(np.log(0.01), np.log(0.6), count))).tolist()
            mode["prompt"] = float(np.exp(rng.uniform(np.log(10), np.log(150)))) if rng.random() < 0.5 else 0.0
        else:
            mode["low"] = float(rng.uniform(0.002, 0.03) * width)
            mode["alpha"] = float(rng.uniform(1.1, 2.5))
        modes.append(mode)
    return modes


def sample_mixture(rng: np.random.Generator, modes: list[dict], n: int, width: int, align: int = 8) -> np.ndarray:
    """``n`` padded lengths drawn from ``modes`` (int64, in [align, W], multiples of ``align`` below W)."""
    weights = np.array([m["weight"] for m in modes])
    which = rng.choice(len(modes), n, p=weights / weights.sum())
    real = np.empty(n, dtype=np.float64)
    for k, mode in enumerate(modes):
        idx = np.flatnonzero(which == k)
        m = len(idx)
        if mode["kind"] == "lognormal":
            real[idx] = rng.lognormal(np.log(mode["median"]), mode["sigma"], m)
        elif mode["kind"] == "uniform":
            real[idx] = rng.uniform(mode["low"], mode["high"], m)
        elif mode["kind"] == "spikes":
            real[idx] = rng.choice(mode["values"], m)
            if mode["prompt"]:
                real[idx] += rng.lognormal(np.log(mode["prompt"]), 0.6, m)
        else:
            real[idx] = mode["low"] * (1 + rng.pareto(mode["alpha"], m))
    real = np.clip(np.round(real), 1, width).astype(np.int64)
    return np.minimum(-(-real // align) * align, width)


def describe(modes: list[dict]) -> str:
    parts = []
    for m in modes:
        w = f"{m['weight']:.2f}"
        if m["kind"] == "lognormal":
            parts.append(f"{w} logn({m['median']:.0f},{m['sigma']:.2f})")
        elif m["kind"] == "uniform":
            parts.append(f"{w} unif({m['low']:.0f},{m['high']:.0f})")
        elif m["kind"] == "spikes":
            vals = ",".join(f"{v:.0f}" for v in m["values"])
            prompt = f"+p{m['prompt']:.0f}" if m["prompt"] else ""
            parts.append(f"{w} spikes({vals}{prompt})")
        else:
            parts.append(f"{w} tail({m['low']:.0f},a={m['alpha']:.2f})")
    return " + ".join(parts)


CONSTRAINT_KINDS = ("cap", "media", "cap+media")


def random_constraints(rng: np.random.Generator, lengths: np.ndarray, width: int) -> dict:
    """Per-row limits for ``lengths``, drawn to bind about as hard as the tokens do (so no dimension is
    trivially slack), as a dict of plain values:

    - ``cap`` (``max_samples_per_row``): W over the mean length times 0.7-1.4, in [2, 64];
    - media: a share (0.2-0.9) of the samples carry 1-4 media items whose vision patches are 4 per token of
      50-95% of the sample's length (so patches follow the tokens, as placeholder expansion makes them);
      budgets of 4-32 media items and 4 W x 0.3-1.0 patches a row, a sample's patches clipped to that
      budget (a processor's pixel limit);
    - ``cap+media``: both.
    """
    n = len(lengths)
    kind = CONSTRAINT_KINDS[int(rng.integers(len(CONSTRAINT_KINDS)))]
    out: dict = {"kind": kind, "cap": None, "media": None, "patches": None}
    out |= {"media_budget": 0, "patch_budget": 0}
    if "cap" in kind:
        out["cap"] = int(np.clip(round(width / lengths.mean() * rng.uniform(0.7, 1.4)), 2, 64))
    if "media" in kind:
        has = rng.random(n) < rng.uniform(0.2, 0.9)
        out["media_budget"] = int(rng.choice([4, 8, 16, 32]))
        out["patch_budget"] = int(4 * width * rng.uniform(0.3, 1.0))
        share = rng.uniform(0.5, 0.95, n)
        patches = np.where(has, 4 * np.floor(lengths * share).astype(np.int64), 0)
        out["patches"] = np.minimum(patches, out["patch_budget"])
        out["media"] = np.where(has, rng.integers(1, 5, n), 0)
    return out


def describe_constraints(limits: dict) -> str:
    parts = []
    if limits["cap"] is not None:
        parts.append(f"cap {limits['cap']}")
    if limits["media"] is not None:
        parts.append(f"media {limits['media_budget']}, patches {limits['patch_budget']}")
    return "; ".join(parts)
