"""The Energon task encoder: omnipack rows -> Megatron-ready THD batches.

Rows are already packed, so the loader runs with ``packing_buffer_size=None``; a micro-batch of MBS rows
becomes one ``[1, MBS*W]`` THD stream, optionally sliced for a context-parallel rank.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.energon import Batch, Cooker, DefaultTaskEncoder, edataclass, stateless

from .batch import concat_rows, packed_seq_params
from .context_parallel import slice_batch_for_cp
from .sample import PackedRowSample, cook_packed_row


@edataclass
class PackedBatch(Batch):
    """A micro-batch with Megatron-Bridge ``get_batch`` key names (see ``as_dict``)."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    padding_mask: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor
    cu_seqlens_kv_padded: torch.Tensor
    max_seqlen_q: torch.Tensor
    max_seqlen_kv: torch.Tensor
    total_tokens: int
    sample_ids: list[list[str]]
    row_meta: list[dict[str, Any]]
    mrope_position_ids: torch.Tensor | None = None
    media: list[dict[str, bytes]] | None = None

    def as_dict(self) -> dict[str, Any]:
        keys = [
            "tokens",
            "labels",
            "loss_mask",
            "position_ids",
            "padding_mask",
            "cu_seqlens_q",
            "cu_seqlens_kv",
            "cu_seqlens_q_padded",
            "cu_seqlens_kv_padded",
            "max_seqlen_q",
            "max_seqlen_kv",
            "total_tokens",
        ]
        out = {k: getattr(self, k) for k in keys}
        if self.mrope_position_ids is not None:
            out["mrope_position_ids"] = self.mrope_position_ids
        return out

    def packed_seq_params(self) -> Any:
        """megatron-core's ``PackedSeqParams`` (qkv_format "thd"), or a dict of its fields without it."""
        return packed_seq_params(self.as_dict())


class OmnipackTaskEncoder(DefaultTaskEncoder[PackedRowSample, PackedRowSample, PackedBatch, PackedBatch]):
    """Cooks omnipack rows and batches them into THD micro-batches (CP-sliced when ``cp_size > 1``)."""

    decoder = None  # parts arrive as raw bytes; the cooker decodes .npy without pickle
    cookers = [Cooker(cook_packed_row)]

    def __init__(
        self, *, cp_size: int = 1, cp_rank: int = 0, tp_size: int = 1, sequence_parallel: bool = False
    ) -> None:
        super().__init__(raw_batch_type=PackedBatch, batch_type=PackedBatch)
        if not 0 <= cp_rank < cp_size:
            raise ValueError(f"cp_rank {cp_rank} outside [0, {cp_size})")
        self.cp_size, self.cp_rank = cp_size, cp_rank
        self.tp_size, self.sequence_parallel = tp_size, sequence_parallel

    @stateless
    def encode_sample(self, sample: PackedRowSample) -> PackedRowSample:
        return sample

    @stateless
    def batch(self, samples: list[PackedRowSample]) -> PackedBatch:
        fields = concat_rows([s.arrays() for s in samples])
        if self.cp_size > 1:
            fields = slice_batch_for_cp(
                fields,
                self.cp_size,
                self.cp_rank,
                tp_size=self.tp_size,
                sequence_parallel=self.sequence_parallel,
            )
        return PackedBatch.from_samples(
            samples,
            **fields,
            sample_ids=[s.sample_ids for s in samples],
            row_meta=[s.meta for s in samples],
            media=[s.media or {} for s in samples],
        )

    @stateless
    def encode_batch(self, batch: PackedBatch) -> PackedBatch:
        return batch
