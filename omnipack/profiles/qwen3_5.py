"""Qwen3.5: natively multimodal Qwen (``transformers.models.qwen3_5``), images and video.

transformers 5.24 gives Qwen3.5 no processor of its own: ``AutoProcessor`` resolves a Qwen3.5 checkpoint to
``Qwen3VLProcessor`` with ``Qwen2VLImageProcessor`` (PIL or torchvision backend) and
``Qwen3VLVideoProcessor``, and ``Qwen3_5Model.get_rope_index`` is Qwen3-VL's (one ``t = 1`` run per frame
group, next text at ``p + max(h', w')``). So the vision rules are Qwen3-VL's, taken from the shared Qwen-VL
rules (``qwen_vl``) with the same settings as ``qwen3_vl`` (not from that module: loading a dataset imports
only its own family's module). What differs from Qwen3-VL:

- the released video budget: Qwen3.5 checkpoints ship a ``video_preprocessor_config.json`` with
  ``size = {shortest_edge: 4096, longest_edge: 25165824}`` (pixels over all sampled frames), which
  ``AutoProcessor`` loads over ``Qwen3VLVideoProcessor``'s class defaults (128·32·32 .. 768·32·32). The
  profile defaults to the released values; ``video_min_pixels`` / ``video_max_pixels`` (or
  ``video_preprocessor_config``, a checkpoint's file) set others, e.g. the class defaults;
- the model: no deepstack mergers, and a hybrid language model (three Gated DeltaNet linear-attention layers
  to one gated full-attention layer), which only the cost model sees. In a packed row the trainer resets the
  linear-attention state at each sample boundary (``cu_seqlens``, which FLA's kernels take), as it keeps
  attention within each sample.
"""

from __future__ import annotations

from typing import ClassVar

from .base import MediaPlan
from .cost import TransformerShape
from .qwen_vl import HALF, VISION_BATCH_KEYS, QwenVLInputs, QwenVLProfile, VideoSettings, VisionSettings

# Qwen3.5's released video_preprocessor_config.json: size.shortest_edge / longest_edge (pixels, all frames).
RELEASED_VIDEO_MIN_PIXELS = 4096
RELEASED_VIDEO_MAX_PIXELS = 25165824


class Qwen35Inputs(QwenVLInputs):
    """Trainer half: pixel patches and grids; no time input (time is timestamp text, as for Qwen3-VL)."""

    name = "qwen3_5"
    second_per_grid_key = None
    batch_keys = VISION_BATCH_KEYS


class Qwen35Profile(QwenVLProfile):
    name = "qwen3_5"
    inputs_class = Qwen35Inputs
    model_types = ("qwen3_5", "qwen3_5_moe")
    # Images: Qwen3.5's released preprocessor_config: patch 16 (factor 32), 65536..16777216 pixels.
    default_image = VisionSettings(16, 2, 2, 65536, 16777216)
    default_mean = HALF
    default_std = HALF
    # Video: Qwen3VLVideoProcessor's sampling (2 fps, 4..768 frames, no per-frame cap), the released budget.
    default_video = VideoSettings(
        2.0, 4, 768, RELEASED_VIDEO_MIN_PIXELS, RELEASED_VIDEO_MAX_PIXELS, False, 768
    )
    video_sampler = "qwen3"
    per_frame_timestamps = True  # a `<{t:.1f} seconds>` block per frame group

    def video_time_interval(self, plan: MediaPlan) -> float:
        return 1.0  # every frame group is its own t=1 block

    # ---- training cost model (profiles.cost) ----

    vision_mergers: ClassVar[int] = 1  # the final merger only (no deepstack)
    # One full-attention layer in every ``full_attention_interval`` layers; the others are Gated DeltaNet.
    full_attention_interval: ClassVar[int] = 4

    def cost_shapes(self) -> dict[str, TransformerShape]:
        """``Qwen3_5Config()``'s defaults: LM hidden 4096, 32 layers (8 gated attention, 16/4 heads of 256,
        query projection doubled for the output gate; 24 Gated DeltaNet, 16 key / 32 value heads of 128),
        SwiGLU 12288; ViT 27 x 1152, 16 heads, GELU MLP 4304."""
        hidden, layers, heads, kv_heads, head_dim = 4096, 32, 16, 4, 256
        attention_layers = layers // self.full_attention_interval
        linear_layers = layers - attention_layers
        k_heads, v_heads, dk, dv = 16, 32, 128, 128
        key_dim, value_dim = k_heads * dk, v_heads * dv
        # Gated DeltaNet per token: projections (qkv, z, a, b, out) and the recurrence (decay, k^T S, the
        # rank-1 update, q^T S: about 3 multiply-adds per state element of each value head).
        delta_proj = hidden * (2 * key_dim + 2 * value_dim + 2 * v_heads) + value_dim * hidden
        delta_state = 3 * v_heads * dk * dv
        gate = hidden * heads * head_dim  # the gated attention's extra query half
        extra = 2.0 * (linear_layers * (delta_proj + delta_state) + attention_layers * gate)
        return {
            "lm": TransformerShape(
                hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, ffn=12288,
                attention_layers=attention_layers, extra_token_flops=extra,
            ),  # fmt: skip
            "vision": TransformerShape(hidden=1152, layers=27, heads=16, ffn=4304, gated_ffn=False),
        }


PROFILE = Qwen35Profile
