"""Stored packed rows -> Megatron-Bridge ``get_batch``-shaped THD batches.

Pure functions (torch + numpy only) so an Energon task encoder can call them per batch. Rows follow
``omnipack.dataset.contract``: per-token arrays of length W, logical ``cu_seqlens`` (cumulative real lengths) and
physical ``cu_seqlens_padded`` (offsets in the row, last == W).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

ArrayLike = np.ndarray | torch.Tensor
Batch = dict[str, Any]

# Token-id-like parts become int64: that is what Bridge's collators emit and what embedding lookups,
# cross-entropy targets and rotary gathers are written against. Boundaries stay int32 (TE checks it).
_LONG_PARTS = ("tokens", "labels", "position_ids")
TOKEN_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")
MROPE_KEY = "mrope_position_ids"
BOUNDARY_KEYS = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _as_tensor(x: ArrayLike, dtype: torch.dtype) -> torch.Tensor:
    """Tensor of ``dtype``; never aliases a read-only numpy buffer (torch warns and could write it)."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    arr = np.asarray(x)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr).to(dtype)


def _row_width(row: Mapping[str, ArrayLike]) -> int:
    missing = [k for k in (*TOKEN_KEYS, "cu_seqlens", "cu_seqlens_padded") if k not in row]
    if missing:
        raise KeyError(f"packed row lacks parts {missing}")
    return int(row["tokens"].shape[-1])


def _check_row(row: Mapping[str, ArrayLike], cu: torch.Tensor, cup: torch.Tensor) -> int:
    """Cheap structural checks (full invariants are ``omnipack verify``'s job); returns W."""
    w = _row_width(row)
    for k in TOKEN_KEYS:
        if tuple(row[k].shape) != (w,):
            raise ValueError(f"row part {k!r} has shape {tuple(row[k].shape)}, expected ({w},)")
    if MROPE_KEY in row and tuple(row[MROPE_KEY].shape) != (3, w):
        raise ValueError(f"row part {MROPE_KEY!r} has shape {tuple(row[MROPE_KEY].shape)}, expected (3, {w})")
    if cu.ndim != 1 or cu.shape != cup.shape or cu.numel() < 2:
        raise ValueError(
            f"cu_seqlens {tuple(cu.shape)} and cu_seqlens_padded {tuple(cup.shape)} must be 1-D [n+1]"
        )
    if int(cu[0]) != 0 or int(cup[0]) != 0:
        raise ValueError("cu_seqlens and cu_seqlens_padded must start at 0")
    if int(cup[-1]) != w:
        # TE assigns tokens past the last boundary to the wrong sequence, so the tail must be absorbed.
        raise ValueError(f"cu_seqlens_padded ends at {int(cup[-1])}, expected the row width W={w}")
    lens, plens = cu.diff(), cup.diff()
    if bool((plens < 0).any()) or bool((lens < 0).any()) or bool((lens > plens).any()):
        raise ValueError("boundaries must be non-decreasing with logical lengths <= padded lengths")
    return w


def row_to_batch(row: Mapping[str, ArrayLike]) -> dict[str, torch.Tensor | int]:
    """One stored row -> a Bridge ``get_batch`` dict (``[1, W]`` token tensors, ``[3, 1, W]`` mRoPE ids).

    ``max_seqlen_*`` are 0-dim int32 tensors of the max *padded* length (as Bridge emits them);
    ``total_tokens`` is the Python int W.
    """
    cu = _as_tensor(row["cu_seqlens"], torch.int32)
    cup = _as_tensor(row["cu_seqlens_padded"], torch.int32)
    w = _check_row(row, cu, cup)
    out: dict[str, torch.Tensor | int] = {}
    for k in TOKEN_KEYS:
        dtype = torch.int64 if k in _LONG_PARTS else torch.float32 if k == "loss_mask" else torch.bool
        out[k] = _as_tensor(row[k], dtype).reshape(1, w)
    if MROPE_KEY in row:
        out[MROPE_KEY] = _as_tensor(row[MROPE_KEY], torch.int64).reshape(3, 1, w)
    max_seqlen = torch.tensor(int(cup.diff().max()), dtype=torch.int32)
    # q and kv share values but not storage, so an in-place edit of one cannot corrupt the other.
    out["cu_seqlens_q"], out["cu_seqlens_kv"] = cu, cu.clone()
    out["cu_seqlens_q_padded"], out["cu_seqlens_kv_padded"] = cup, cup.clone()
    out["max_seqlen_q"], out["max_seqlen_kv"] = max_seqlen, max_seqlen.clone()
    out["total_tokens"] = w
    return out


def concat_rows(rows: Sequence[Mapping[str, ArrayLike]]) -> dict[str, torch.Tensor | int]:
    """Micro-batch > 1: rows joined into one THD stream ``[1, sum(W)]`` (``MBS*W`` for equal widths).

    Physical boundaries of row k are offset by the widths of rows before it; logical boundaries (cumulative
    real lengths) by the real tokens before it. The shared join of consecutive rows appears once.
    With one row this equals ``row_to_batch``.
    """
    if not rows:
        raise ValueError("concat_rows needs at least one row")
    batches = [row_to_batch(r) for r in rows]
    if len(batches) == 1:
        return batches[0]
    has_mrope = [MROPE_KEY in b for b in batches]
    if any(has_mrope) and not all(has_mrope):
        raise ValueError(
            f"rows disagree on {MROPE_KEY!r}: present in rows {np.flatnonzero(has_mrope).tolist()}"
        )
    out: dict[str, torch.Tensor | int] = {k: torch.cat([b[k] for b in batches], dim=-1) for k in TOKEN_KEYS}
    if has_mrope[0]:
        out[MROPE_KEY] = torch.cat([b[MROPE_KEY] for b in batches], dim=-1)
    cu_parts, cup_parts = [torch.zeros(1, dtype=torch.int32)], [torch.zeros(1, dtype=torch.int32)]
    real_off = phys_off = 0
    for b in batches:
        cu, cup = b["cu_seqlens_q"], b["cu_seqlens_q_padded"]
        # Drop each row's leading 0: it equals the previous row's end after offsetting.
        cu_parts.append(cu[1:] + real_off)
        cup_parts.append(cup[1:] + phys_off)
        real_off += int(cu[-1])
        phys_off += int(b["total_tokens"])
    cu_all, cup_all = torch.cat(cu_parts), torch.cat(cup_parts)
    max_seqlen = torch.stack([b["max_seqlen_q"] for b in batches]).max()
    out["cu_seqlens_q"], out["cu_seqlens_kv"] = cu_all, cu_all.clone()
    out["cu_seqlens_q_padded"], out["cu_seqlens_kv_padded"] = cup_all, cup_all.clone()
    out["max_seqlen_q"], out["max_seqlen_kv"] = max_seqlen, max_seqlen.clone()
    out["total_tokens"] = phys_off
    return out


@functools.lru_cache(maxsize=1)
def _megatron_packed_seq_params() -> tuple[type | None, frozenset[str]]:
    """megatron-core's PackedSeqParams and its field names, or (None, {}) when not installed.

    Imported lazily: megatron.core pulls in a large stack (seconds of import time) that trainers already
    have and data tools do not need.
    """
    try:
        from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError:
        return None, frozenset()
    return PackedSeqParams, frozenset(f.name for f in dataclasses.fields(PackedSeqParams))


def _as_int(x: torch.Tensor | int) -> int:
    return int(x.item()) if isinstance(x, torch.Tensor) else int(x)


def packed_seq_fields(batch: Mapping[str, Any]) -> dict[str, Any]:
    """THD attention parameters for a batch from ``row_to_batch``/``concat_rows``/``slice_batch_for_cp``
    as a plain dict: every field of megatron-core's ``PackedSeqParams(qkv_format="thd", ...)`` plus
    ``total_tokens`` (the physical row width, which newer versions take). ``max_seqlen_*`` become Python
    ints, as Bridge does. For trainers that build their own attention arguments."""
    cu_q, cu_kv = batch["cu_seqlens_q"], batch["cu_seqlens_kv"]
    cup_q = batch.get("cu_seqlens_q_padded")
    cup_kv = batch.get("cu_seqlens_kv_padded")
    # TE takes its no-padding (FlashAttention-capable) path only when the padded tensors are the *same
    # objects* as the logical ones, so hand it the logical object whenever the values agree.
    if cup_q is None or torch.equal(cup_q, cu_q):
        cup_q = cu_q
    if cup_kv is None or torch.equal(cup_kv, cu_kv):
        cup_kv = cu_kv
    fields: dict[str, Any] = {
        "qkv_format": "thd",
        "cu_seqlens_q": cu_q,
        "cu_seqlens_kv": cu_kv,
        "cu_seqlens_q_padded": cup_q,
        "cu_seqlens_kv_padded": cup_kv,
        "max_seqlen_q": _as_int(batch["max_seqlen_q"]),
        "max_seqlen_kv": _as_int(batch["max_seqlen_kv"]),
    }
    if batch.get("total_tokens") is not None:
        fields["total_tokens"] = _as_int(batch["total_tokens"])
    return fields


def packed_seq_params(batch: Mapping[str, Any]) -> Any:
    """``megatron.core.packed_seq_params.PackedSeqParams`` of a batch (see ``packed_seq_fields``), passing
    the fields the installed megatron-core defines (``total_tokens`` where it has it).

    Raises ImportError naming the extra when megatron-core is not installed: a dict in its place would
    fail later, inside the model, far from the cause."""
    cls, names = _megatron_packed_seq_params()
    if cls is None:
        raise ImportError(
            "packed_seq_params() builds megatron-core's PackedSeqParams, and megatron-core is not installed: "
            "install omnipack's megatron extra (pip install '.[megatron]' in the omnipack repository, or the wheel "
            "built from it with [megatron]) or megatron-core itself; or use packed_seq_fields() for a plain dict"
        )
    return cls(**{k: v for k, v in packed_seq_fields(batch).items() if k in names})
