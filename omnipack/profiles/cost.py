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

The measure stage, which has the profile, writes each sample's cost (``sample_cost``) and its encoders'
FLOPs (``encoder_flops``) into its tables and records ``CostModel.describe()`` with them; the pack stage
balances and reports rows from those numbers alone (``omnipack.packing.cost``).
"""

from __future__ import annotations

from collections.abc import Iterable
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

    def sample_cost(self, length: int, encoder_flops: float) -> float:
        """``sample_costs`` of one sample (the same arithmetic, so the same float as a column of them)."""
        return float(self.sample_costs(np.asarray([length]), np.asarray([encoder_flops]))[0])

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


def media_encoder_flops(profile: Any, shapes: dict[str, TransformerShape], plans: Iterable[Any]) -> float:
    """Forward encoder FLOPs of one sample: the profile's ``media_cost`` summed over its media plans."""
    total = 0.0
    for plan in plans:
        total += float(profile.media_cost(plan, shapes))
    return total


def windowed_pairs(grid_h: int, grid_w: int, merge: int, window_merged: int) -> float:
    """Pairs of Qwen2.5-VL window attention on one frame: windows of ``window_merged`` x ``window_merged``
    merged tokens (``merge``² patches each) tile the merged grid; edge windows are partial."""
    rows = tiled_sizes(grid_h // merge, window_merged)
    cols = tiled_sizes(grid_w // merge, window_merged)
    per_token = merge * merge
    # sum over windows of (patches in window)^2 factorises over rows and columns
    return float(sum(r * r for r in rows) * sum(c * c for c in cols) * per_token * per_token)
