"""Context-parallel slicing of THD batches, matching TransformerEngine's per-sequence zigzag.

TE (``thd_get_partitioned_indices``) splits every *padded* sequence of length ``Lp`` into ``2*cp`` equal
chunks; rank ``r`` keeps chunks ``r`` and ``2*cp-1-r`` (balancing causal-attention work), and the local
tokens are the concatenation of those pieces in sequence order. Attention kernels are still given the
global ``cu_seqlens``, so boundaries and ``max_seqlen`` are not rewritten here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from omnipack.loader.batch import MROPE_KEY, TOKEN_KEYS

ArrayLike = np.ndarray | torch.Tensor


def _validate_cp(cp_size: int, cp_rank: int) -> None:
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be in [0, {cp_size}), got {cp_rank}")


def _show(t: torch.Tensor, limit: int = 8) -> str:
    """Short form of a boundary tensor for error messages (real ones hold thousands of entries)."""
    vals = t.tolist()
    return str(vals) if len(vals) <= limit else f"{vals[:limit]}... ({len(vals)} entries)"


def cp_partition_indices(cu_seqlens_padded: ArrayLike, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Indices (int64, ascending) into the ``[.., T]`` token axis that CP rank ``cp_rank`` keeps.

    ``T = cu_seqlens_padded[-1]``. Raises ``ValueError`` naming the first padded sequence whose length is
    not a multiple of ``2*cp_size``.
    """
    _validate_cp(cp_size, cp_rank)
    if isinstance(cu_seqlens_padded, torch.Tensor):
        cup = cu_seqlens_padded.to(device="cpu", dtype=torch.int64)
    else:
        cup = torch.from_numpy(np.asarray(cu_seqlens_padded, dtype=np.int64).copy())
    if cup.ndim != 1 or cup.numel() < 1 or int(cup[0]) != 0:
        raise ValueError(f"cu_seqlens_padded must be 1-D starting at 0, got {_show(cup)}")
    plens = cup.diff()
    if bool((plens < 0).any()):
        raise ValueError(f"cu_seqlens_padded must be non-decreasing, got {_show(cup)}")
    total = int(cup[-1])
    if cp_size == 1:
        return torch.arange(total, dtype=torch.int64)
    chunks = 2 * cp_size
    bad = torch.nonzero(plens % chunks).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"padded sequence {i} (tokens [{int(cup[i])}, {int(cup[i + 1])}), length {int(plens[i])}) is not "
            f"divisible by 2*cp={chunks}; {bad.numel()} of {plens.numel()} sequences are misaligned. "
            f"Re-prepare the dataset with an alignment that is a multiple of {chunks}."
        )
    if total % chunks:  # implied by the per-sequence check; kept because TE asserts it separately
        raise ValueError(f"total padded tokens {total} not divisible by 2*cp={chunks}")
    c = plens // chunks  # chunk length per sequence
    local_len = 2 * c  # tokens each rank keeps per sequence
    seq = torch.repeat_interleave(torch.arange(plens.numel()), local_len)
    local_start = torch.cumsum(local_len, 0) - local_len
    j = torch.arange(total // cp_size, dtype=torch.int64) - local_start[seq]  # offset within local piece
    cs = c[seq]
    first = j < cs
    # First half: chunk r; second half: chunk 2cp-1-r (the mirror, so every rank gets equal causal work).
    within = torch.where(first, cp_rank * cs + j, (chunks - 1 - cp_rank) * cs + (j - cs))
    return cup[:-1][seq] + within


def slice_batch_for_cp(
    batch: Mapping[str, Any],
    cp_size: int,
    cp_rank: int,
    *,
    tp_size: int = 1,
    sequence_parallel: bool = False,
    extra_token_keys: Iterable[str] = (),
) -> dict[str, Any]:
    """This CP rank's share of a THD batch (from ``row_to_batch``/``concat_rows``).

    Every token-aligned tensor (``[1, T]`` parts, ``[3, 1, T]`` mRoPE ids, plus ``extra_token_keys``) is
    index-selected along its last dim; everything else (global boundaries, ``max_seqlen_*``,
    ``total_tokens``) is passed through unchanged, as TE expects global ``cu_seqlens``. Under sequence
    parallelism the local length must divide by ``tp_size``.
    """
    _validate_cp(cp_size, cp_rank)
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    cup = batch.get("cu_seqlens_q_padded")
    if cup is None:  # Bridge falls back to the logical boundaries when nothing was padded
        cup = batch["cu_seqlens_q"]
    total = int(cup[-1])
    keys = [k for k in (*TOKEN_KEYS, MROPE_KEY, *extra_token_keys) if batch.get(k) is not None]
    for k in keys:
        t = batch[k]
        if t.shape[-1] != total:
            raise ValueError(f"{k!r} has {t.shape[-1]} tokens but cu_seqlens_padded ends at {total}")
        if t.ndim >= 2 and t.shape[-2] != 1:
            raise ValueError(
                f"{k!r} has batch dim {t.shape[-2]}; THD batches are [.., 1, T] (use concat_rows)"
            )
    local = total // cp_size
    if sequence_parallel and tp_size > 1 and local % tp_size:
        raise ValueError(
            f"sequence parallelism needs the per-CP-rank token count divisible by tp={tp_size}, but "
            f"{total} tokens / cp={cp_size} = {local}; re-prepare with sequence parallelism enabled "
            f"(alignment multiple of cp*tp={cp_size * tp_size})"
        )
    out = dict(batch)
    if cp_size == 1:
        return out
    idx = cp_partition_indices(cup, cp_size, cp_rank)
    for k in keys:
        t = batch[k]
        out[k] = t.index_select(t.ndim - 1, idx.to(t.device))
    return out
