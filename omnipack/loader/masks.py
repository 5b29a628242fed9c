"""Explicit per-layer attention masks for a packed THD stream, for trainers that run a Hugging Face model with
eager or SDPA attention (4-D masks) rather than a varlen kernel given ``cu_seqlens``.

The rule is the one a model whose image tokens attend bidirectionally (``token_type_ids`` 1, as Gemma 3's)
applies to one unpacked sample: causal, every contiguous run of type-1 tokens one block that sees itself
whole, and a sliding window ``kv > q - sliding_window`` on top in the sliding layers. Here it holds within
each sequence of the stream and never across two. Torch only (no transformers), like the rest of the loader.
"""

from __future__ import annotations

import torch


def packed_layer_masks(
    cu_seqlens_padded: torch.Tensor,
    token_type_ids: torch.Tensor,
    sliding_window: int,
    *,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """``{"full_attention": m, "sliding_attention": m}``, each ``[1, 1, W, W]``, keyed by Hugging Face's
    ``config.layer_types`` names (a model such as Gemma 3 takes the dict as ``attention_mask``).

    ``cu_seqlens_padded``: the stream's physical sequence offsets ``[n+1]`` (the batch's
    ``cu_seqlens_q_padded``; 0 first, W last), so a sequence's padding is attended as its own tail and
    never by its real tokens. ``token_type_ids``: ``[W]`` or ``[1, W]``, 1 on the tokens that attend
    bidirectionally within their run. Boolean masks (True = attend, what SDPA takes) unless ``dtype`` is
    given: then additive masks of that dtype (0 or its minimum, what eager attention adds to the scores).
    """
    types = token_type_ids.reshape(-1)
    w = types.numel()
    if token_type_ids.dim() > 2 or (token_type_ids.dim() == 2 and token_type_ids.shape[0] != 1):
        raise ValueError(
            f"token_type_ids must be [W] or [1, W] (one THD stream), got {tuple(token_type_ids.shape)}"
        )
    cup = cu_seqlens_padded.reshape(-1).to(device=types.device, dtype=torch.int64)
    if cup.numel() < 2 or int(cup[0]) != 0 or int(cup[-1]) != w or bool((cup.diff() < 0).any()):
        raise ValueError(f"cu_seqlens_padded must rise from 0 to W={w}, got {cup.tolist()[:8]}")
    if sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    idx = torch.arange(w, device=types.device)
    seq = torch.searchsorted(cup, idx, right=True) - 1
    # A block starts at a type-1 token whose predecessor is not type 1 or lies in another sequence.
    is_block = types == 1
    starts = is_block.clone()
    starts[1:] &= ~is_block[:-1] | (seq[1:] != seq[:-1])
    block = torch.where(is_block, torch.cumsum(starts, 0) - 1, -1)
    q, kv = idx[:, None], idx[None, :]
    same_block = (block[:, None] == block[None, :]) & (block[:, None] >= 0)
    full = (seq[:, None] == seq[None, :]) & ((kv <= q) | same_block)
    sliding = full & (kv > q - sliding_window)
    masks = {"full_attention": full[None, None], "sliding_attention": sliding[None, None]}
    if dtype is None:
        return masks
    low = torch.finfo(dtype).min
    return {k: torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, low) for k, m in masks.items()}
