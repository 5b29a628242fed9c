"""The Energon sample type of an omnipack row and the cooker that builds it from a crude sample."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from megatron.energon import Sample, basic_sample_keys, edataclass, stateless

from ..dataset.codec import decode_row
from ..dataset.contract import MediaItem


class RowReading:
    """What the task encoder reads from a row, shared by the row types (``PackedRowSample`` from the
    cooker, ``energon_dataset.OmnipackRow`` from ``dataset.yaml``): they need ``meta``, the token tensors
    and ``mrope_position_ids``."""

    @property
    def sample_ids(self) -> list[str]:
        return list(self.meta["sample_ids"])

    @property
    def media_items(self) -> list[MediaItem]:
        return [MediaItem.from_json(m) for m in self.meta.get("media", [])]

    def arrays(self) -> dict[str, torch.Tensor]:
        """The row's token and boundary tensors by contract name (what ``loader.batch`` consumes)."""
        names = (
            "tokens",
            "labels",
            "loss_mask",
            "position_ids",
            "padding_mask",
            "cu_seqlens",
            "cu_seqlens_padded",
        )
        out = {n: getattr(self, n) for n in names}
        if self.mrope_position_ids is not None:
            out["mrope_position_ids"] = self.mrope_position_ids
        return out


@edataclass
class PackedRowSample(RowReading, Sample):
    """One packed THD row as tensors. ``meta`` is the row's meta.json; ``media`` its media payloads."""

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    padding_mask: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    meta: dict[str, Any]
    mrope_position_ids: torch.Tensor | None = None
    media: dict[str, bytes] | None = None
    # Per-item encoder inputs in placeholder order, set by the task encoder's encode_sample: numpy arrays,
    # pixel patches as ``profiles.model_inputs.PendingRows`` that ``profile.collate_media`` builds into the batch.
    media_inputs: list[dict[str, Any]] | None = None



def _tensor(a: Any) -> torch.Tensor:
    if isinstance(a, np.ndarray):
        # A read-only view of the part's bytes is copied (torch would alias memory it must not write).
        return torch.from_numpy(a if a.flags.writeable else np.array(a))
    return torch.as_tensor(a)


@stateless
def cook_packed_row(crude: dict[str, Any]) -> PackedRowSample:
    """Crude sample (raw part bytes, decoder=None) -> PackedRowSample. No pickle is ever loaded."""
    parts = {k: v for k, v in crude.items() if not k.startswith("__")}
    row, meta = decode_row(parts)
    media = {m.part: parts[m.part] for m in row.media}
    return PackedRowSample(
        **basic_sample_keys(crude),
        tokens=_tensor(row.tokens),
        labels=_tensor(row.labels),
        loss_mask=_tensor(row.loss_mask),
        position_ids=_tensor(row.position_ids),
        padding_mask=_tensor(row.padding_mask),
        cu_seqlens=_tensor(row.cu_seqlens),
        cu_seqlens_padded=_tensor(row.cu_seqlens_padded),
        meta=meta,
        mrope_position_ids=None if row.mrope_position_ids is None else _tensor(row.mrope_position_ids),
        media=media,
    )
