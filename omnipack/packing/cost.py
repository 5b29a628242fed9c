"""Modeled training cost of packed rows: LM linear + LM attention + media encoders, in FLOPs.

A THD row runs every token through the LM's dense layers (the row is padded to its width W, so this
part is the same for every row), attention only within each sequence (causal, so about len²/2 query-key
pairs per sequence), and each media item through its encoder. Encoder attention also stays inside
blocks (a frame, a window, an audio chunk), which the profile knows. So a row's cost is a per-row
constant plus the sum of its samples' costs; only the per-sample part differs between rows.

Coefficients come from the model shape (``TransformerShape``): a profile gives documented defaults
for its LM and encoders (``ModelProfile.cost_shapes``) and the cost of one media item from its plan
(``ModelProfile.media_cost``); a config's ``cost`` mapping overrides any field. Costs are forward FLOPs
times ``train_factor`` (3: backward is about twice the forward).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

TRAIN_FACTOR = 3.0


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a transformer stack, enough to count its matmul FLOPs.

    ``ffn`` is the (active) intermediate size: for a mixture of experts, experts per token times the
    expert width (plus shared experts). ``attention_layers`` defaults to ``layers``; hybrid models with
    other mixers (Mamba) set it lower and put the mixer's per-token FLOPs in ``extra_token_flops``.
    """

    hidden: int
    layers: int
    heads: int
    ffn: int
    kv_heads: int | None = None
    head_dim: int | None = None
    gated_ffn: bool = True
    attention_layers: int | None = None
    extra_token_flops: float = 0.0

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def num_attention_layers(self) -> int:
        return self.layers if self.attention_layers is None else self.attention_layers

    def token_flops(self) -> float:
        """Forward matmul FLOPs per token (2 per multiply-add) of every layer's projections and MLP."""
        q = self.heads * self.dim_head
        kv = (self.kv_heads or self.heads) * self.dim_head
        attn_proj = self.hidden * (2 * q + 2 * kv)
        mlp = (3 if self.gated_ffn else 2) * self.hidden * self.ffn
        return 2.0 * (self.num_attention_layers * attn_proj + self.layers * mlp) + self.extra_token_flops

    def pair_flops(self) -> float:
        """Forward FLOPs per attended query-key pair over all attention layers (QK^T and AV)."""
        return 4.0 * self.heads * self.dim_head * self.num_attention_layers


def blocks_pairs(sizes: Iterable[int]) -> float:
    """Query-key pairs of full (bidirectional) attention within blocks of the given sizes."""
    return float(sum(s * s for s in sizes))


def tiled_sizes(extent: int, tile: int) -> list[int]:
    """Sizes of the tiles that cover ``extent`` with tiles of ``tile`` (the last one may be partial)."""
    full, rest = divmod(extent, tile)
    return [tile] * full + ([rest] if rest else [])


def encoder_flops(shape: TransformerShape, tokens: float, pairs: float) -> float:
    """Forward FLOPs of an encoder stack over ``tokens`` tokens attending over ``pairs`` pairs."""
    return tokens * shape.token_flops() + pairs * shape.pair_flops()


@dataclass(frozen=True)
class CostModel:
    """Per-sample and per-row training cost for one model (see the module docstring)."""

    lm: TransformerShape
    encoders: dict[str, TransformerShape]
    train_factor: float = TRAIN_FACTOR
    row_padding_computed: bool = True  # rows are padded to W and the padding goes through the LM

    @property
    def shapes(self) -> dict[str, TransformerShape]:
        """Every stack by name (``"lm"`` and the encoders), as ``ModelProfile.media_cost`` takes them."""
        return {"lm": self.lm, **self.encoders}

    @property
    def lm_token(self) -> float:
        return self.train_factor * self.lm.token_flops()

    @property
    def lm_pair(self) -> float:
        return self.train_factor * self.lm.pair_flops()

    def row_constant(self, width: int) -> float:
        """The cost every row pays whatever it holds (the LM's dense layers over W tokens)."""
        return self.lm_token * width if self.row_padding_computed else 0.0

    def sample_costs(self, lengths: np.ndarray, encoder_flops: np.ndarray | None = None) -> np.ndarray:
        """Per-sample part of the row cost: causal attention over (len²+len)/2 pairs, encoders, and the
        dense layers unless every row pays them anyway (``row_padding_computed``)."""
        n = np.asarray(lengths, dtype=np.float64)
        cost = self.lm_pair * (n * (n + 1) / 2)
        if not self.row_padding_computed:
            cost += self.lm_token * n
        if encoder_flops is not None:
            cost += self.train_factor * np.asarray(encoder_flops, dtype=np.float64)
        return cost

    def describe(self) -> dict[str, Any]:
        """JSON-able coefficients recorded next to the row costs."""
        return {
            "unit": "FLOPs (forward x train_factor)",
            "train_factor": self.train_factor,
            "row_padding_computed": self.row_padding_computed,
            "lm_flops_per_token": self.lm_token,
            "lm_flops_per_attention_pair": self.lm_pair,
            "shapes": {k: asdict(v) for k, v in self.shapes.items()},
        }


def build_cost_model(
    defaults: dict[str, TransformerShape], overrides: dict[str, Any] | None = None
) -> CostModel:
    """A cost model from a profile's default shapes and a config's ``cost`` mapping.

    ``overrides`` holds ``train_factor``, ``row_padding_computed`` and, per stack (``lm``, ``vision``,
    ``audio``), a mapping of ``TransformerShape`` fields, e.g. ``{"lm": {"hidden": 5120, "layers": 64}}``.
    """
    overrides = dict(overrides or {})
    shapes = dict(defaults)
    known = {f.name for f in fields(TransformerShape)}
    for key in list(overrides):
        if key in ("train_factor", "row_padding_computed"):
            continue
        if key not in shapes:
            raise ValueError(f"cost: unknown stack {key!r}; this profile has {sorted(shapes)}")
        change = overrides.pop(key)
        if not isinstance(change, dict) or set(change) - known:
            raise ValueError(f"cost.{key}: expected a mapping of {sorted(known)}, got {change!r}")
        shapes[key] = replace(shapes[key], **change)
    if "lm" not in shapes:
        raise ValueError("cost: no LM shape")
    lm = shapes.pop("lm")
    return CostModel(
        lm=lm,
        encoders=shapes,
        train_factor=float(overrides.get("train_factor", TRAIN_FACTOR)),
        row_padding_computed=bool(overrides.get("row_padding_computed", True)),
    )


def media_encoder_flops(profile: Any, model: CostModel, media_json: Sequence[str | None]) -> np.ndarray:
    """Forward encoder FLOPs per sample: the profile's ``media_cost`` summed over the sample's items.

    Items with the same kind, grid, token and audio-frame counts cost the same, so each is costed once
    (a profile's ``media_cost`` must depend on nothing else).
    """
    from ..profiles.base import MediaPlan

    out = np.zeros(len(media_json), dtype=np.float64)
    shapes = model.shapes
    memo: dict[tuple, float] = {}
    for i, text in enumerate(media_json):
        if not text or text == "[]":
            continue
        total = 0.0
        for item in json.loads(text):
            plan = item.get("plan", item)
            grid = plan.get("grid_thw")
            # the fields encoder costs depend on; full plans are rebuilt only for new combinations
            key = (
                plan["kind"],
                tuple(grid) if grid else None,
                plan.get("num_tokens"),
                plan.get("audio_num_tokens"),
                plan.get("audio_frames"),
            )
            if key not in memo:
                memo[key] = float(profile.media_cost(MediaPlan.from_json(plan), shapes))
            total += memo[key]
        out[i] = total
    return out


def row_costs(
    row_of: np.ndarray, num_rows: int, sample_cost: np.ndarray, constant: float = 0.0
) -> np.ndarray:
    """Per-row cost: the row constant plus the costs of its samples."""
    return constant + np.bincount(row_of, weights=sample_cost, minlength=num_rows)


def straggler_overhead(costs_in_order: np.ndarray, dp: int) -> float | None:
    """Mean over steps of (max rank cost / mean rank cost) - 1, one row per rank per step, rows taken in
    order (a shuffled plan's order is a random assignment); a last incomplete step is left out. None when
    there are fewer rows than ranks (not one full step)."""
    costs = np.asarray(costs_in_order, dtype=np.float64)
    if dp < 1:
        raise ValueError(f"data-parallel size must be >= 1, got {dp}")
    steps = len(costs) // dp
    if steps == 0:
        return None
    per_step = costs[: steps * dp].reshape(steps, dp)
    mean = per_step.mean(axis=1)
    ok = mean > 0
    return float(np.mean(per_step.max(axis=1)[ok] / mean[ok]) - 1) if ok.any() else 0.0


def cost_stats(costs_in_order: np.ndarray, model: CostModel, dp_sizes: Sequence[int]) -> dict[str, Any]:
    """``row_cost`` stats for omnipack.json: every row's cost (plan order), spread and straggler overhead."""
    costs = np.asarray(costs_in_order, dtype=np.float64)
    mean = float(costs.mean()) if len(costs) else 0.0
    return {
        "model": model.describe(),
        "mean": mean,
        "min": float(costs.min()) if len(costs) else 0.0,
        "max": float(costs.max()) if len(costs) else 0.0,
        "cv": float(costs.std() / mean) if mean > 0 else 0.0,
        "max_over_mean": float(costs.max() / mean) if mean > 0 else 0.0,
        "straggler_overhead": {str(dp): straggler_overhead(costs, dp) for dp in dp_sizes},
        # 6 significant digits keep the file small and are far finer than the model's accuracy.
        "per_row": [float(f"{c:.6g}") for c in costs.tolist()],
    }


def windowed_pairs(grid_h: int, grid_w: int, merge: int, window_merged: int) -> float:
    """Pairs of Qwen2.5-VL window attention on one frame: windows of ``window_merged`` x ``window_merged``
    merged tokens (``merge``² patches each) tile the merged grid; edge windows are partial."""
    rows = tiled_sizes(grid_h // merge, window_merged)
    cols = tiled_sizes(grid_w // merge, window_merged)
    per_token = merge * merge
    # sum over windows of (patches in window)^2 factorises over rows and columns
    return float(sum(r * r for r in rows) * sum(c * c for c in cols) * per_token * per_token)


def describe_row_cost(row_cost: dict[str, Any]) -> str:
    """One line for terminal summaries from a ``row_cost`` stats entry."""
    overhead = "  ".join(
        f"DP={dp} " + (f"{v:.2%}" if v is not None else "n/a (fewer rows than ranks)")
        for dp, v in row_cost.get("straggler_overhead", {}).items()
    )
    return (
        f"mean {row_cost['mean']:.3g} FLOPs  CV {row_cost['cv']:.2%}  max/mean {row_cost['max_over_mean']:.3f}"
        f"  straggler overhead {overhead}"
    )
