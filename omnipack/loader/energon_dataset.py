"""The Energon dataset factory and sample type that an omnipack dataset's ``.nv-meta/dataset.yaml`` names.

Stock ``energon info``, ``lint`` and ``preview`` read ``dataset.yaml`` unless told otherwise, and need a
typed sample: ``info`` prints the ``sample_type`` class, ``lint`` batches samples with Energon's default
task encoder (which has no cookers), ``preview`` prints every dataclass field of the sample. So
``dataset.yaml`` names ``OmnipackWebdataset``, which decodes each row with omnipack's own codec (``.npy``
without pickle; Energon's autodecoder is not used) into an ``OmnipackRow``: the row the omnipack task
encoder loads (the same tensors the cooker builds from a crude sample; ``dataset_crude.yaml`` keeps that
path) whose fields print as what they hold: a summary (token counts, sequences, media kinds and shapes)
first, media payloads as part sizes and mRoPE ids as their shape and ranges.

No ``from __future__ import annotations`` here: Energon's config parser reads the constructor's annotations
as live types (``sample_type`` must parse as a class, not be instantiated).
"""

from typing import Any

import numpy as np
import torch
from megatron.energon import Sample, edataclass
from megatron.energon.errors import FatalSampleError
from megatron.energon.flavors.webdataset.default_generic_webdataset import DefaultGenericWebdatasetFactory

from ..dataset.contract import MediaItem
from ..dataset.payload_header import HeaderError, payload_header
from .sample import RowReading, cook_packed_row


class MediaParts(dict):
    """A row's media payloads (part name -> raw bytes); printed as sizes, never as the bytes."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: <{len(v):,} bytes>" for k, v in self.items()) + "}"


class MRopePositionIds:
    """A row's mRoPE position ids (int [3, W]: temporal, height, width) in ``.tensor``; printed as shape and
    per-axis range (Energon's preview would draw a [3, W] tensor as a picture thousands of columns wide)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __repr__(self) -> str:
        t = self.tensor
        axes = ", ".join(
            f"{name} {int(row.min())}..{int(row.max())}"
            for name, row in zip(("t", "h", "w"), t, strict=False)
        )
        return f"mRoPE ids {str(t.dtype).removeprefix('torch.')} {list(t.shape)}: {axes}"


class RowSummary:
    """What a row holds, in words: token counts, its sequences and its media with their stored shapes.

    Written on first ``repr`` (only a viewer such as ``energon preview`` asks), from the row's own tensors,
    meta and payloads (references, no copies): the training loader never pays for it.
    """

    __slots__ = ("_arrays", "_key", "_media", "_meta", "_text")

    def __init__(
        self, key: str, arrays: dict[str, torch.Tensor], meta: dict[str, Any], media: dict[str, bytes]
    ) -> None:
        self._key, self._arrays, self._meta, self._media = key, arrays, meta, media
        self._text: str | None = None

    def __repr__(self) -> str:
        if self._text is None:
            self._text = self._describe()
        return self._text

    def _describe(self) -> str:
        arrays, meta, media = self._arrays, self._meta, self._media
        width = int(arrays["tokens"].numel())
        padding = int(arrays["padding_mask"].sum())
        supervised = int(arrays["loss_mask"].sum())
        lengths = np.diff(arrays["cu_seqlens"].numpy().astype(np.int64))
        padded = np.diff(arrays["cu_seqlens_padded"].numpy().astype(np.int64))
        ids = list(meta.get("sample_ids", []))
        items = [MediaItem.from_json(m) for m in meta.get("media", [])]
        lines = [
            f"row {self._key!r}: {width} tokens = {width - padding} in {len(lengths)} sequences + {padding} "
            f"padding; {supervised} supervised (loss_mask)"
        ]
        for i, (n, p) in enumerate(zip(lengths.tolist(), padded.tolist(), strict=False)):
            kinds = [m.kind for m in items if m.sample_index == i]
            held = f", {len(kinds)} media ({', '.join(kinds)})" if kinds else ""
            sid = ids[i] if i < len(ids) else "?"
            lines.append(f"  sequence {i} {sid!r}: {n} tokens (padded to {p}){held}")
        for j, m in enumerate(items):
            lines.append(
                f"  media {j}: {m.kind} {m.part!r} {_stored_shape(m, media.get(m.part))}, "
                f"{m.num_tokens} placeholder tokens"
            )
        if "mrope_position_ids" in arrays:
            lines.append(f"  {MRopePositionIds(arrays['mrope_position_ids'])!r}")
        return "\n".join(lines)


def _stored_shape(item: MediaItem, data: bytes | None) -> str:
    """``uint8 [224, 308, 3]`` (or one such per array of an ``.npz``) from the payload's header alone; for a
    format without a header reader here (e.g. an encoded video), its size and the planned grid."""
    if data is None:
        return "(payload missing)"
    try:
        header = payload_header(item.part, data)
    except HeaderError as e:
        return f"({len(data):,} bytes, unreadable header: {e})"
    if header is None:
        grid = f", grid_thw {list(item.grid_thw)}" if item.grid_thw is not None else ""
        return f"({len(data):,} bytes{grid})"
    return ", ".join(
        f"{name + ' ' if name else ''}{np.dtype(dtype).name} {list(shape)}"
        for name, (shape, dtype) in header.items()
    )


@edataclass
class OmnipackRow(RowReading, Sample):
    """One packed THD row as the omnipack task encoder loads it, with fields that print as what they hold.

    Same interface as ``sample.PackedRowSample`` (``arrays()``, ``sample_ids``, ``media_items``,
    ``mrope_position_ids``, ``media``, ``media_inputs``); mRoPE ids are kept wrapped in ``mrope``.
    """

    summary: RowSummary
    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    padding_mask: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    meta: dict
    mrope: MRopePositionIds | None = None
    media: MediaParts | None = None
    # Per-item encoder inputs, set by the task encoder's encode_sample (see PackedRowSample).
    media_inputs: list | None = None

    @property
    def mrope_position_ids(self) -> torch.Tensor | None:
        return None if self.mrope is None else self.mrope.tensor


class RowDecodeError(FatalSampleError, ValueError):
    """A row whose parts do not decode. Fatal for Energon (its default handler would log and skip the row,
    and ``energon lint`` would then pass): nothing is dropped silently."""


def load_row_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A webdataset sample (raw part bytes) -> the fields of an ``OmnipackRow`` (decoded as the cooker does)."""
    try:
        row = cook_packed_row(raw)
    except Exception as e:
        raise RowDecodeError(
            f"row {raw.get('__key__')!r} of {raw.get('__shard__')!r} does not decode: {type(e).__name__}: {e}"
        ) from e
    arrays = row.arrays()
    media = MediaParts(row.media or {})
    return {
        "summary": RowSummary(raw["__key__"], arrays, row.meta, media),
        **{k: v for k, v in arrays.items() if k != "mrope_position_ids"},
        "meta": row.meta,
        "mrope": None if row.mrope_position_ids is None else MRopePositionIds(row.mrope_position_ids),
        "media": media,
    }


def _every_part(part: str) -> bool:
    return True


class OmnipackWebdataset(DefaultGenericWebdatasetFactory[OmnipackRow]):
    """Energon factory of an omnipack dataset: every part as raw bytes, decoded by ``load_row_fields``.

    ``decoder`` (Energon passes its task encoder's) is ignored: rows carry their own codec, and the
    webdataset autodecoder would turn ``.npy`` and image parts into other types than the payload checks
    expect. ``sample_type`` is written into ``dataset.yaml`` for ``energon info``; it must be
    ``OmnipackRow`` (or a subclass).
    """

    __sample_type__ = OmnipackRow

    def __init__(
        self, path: Any, *, sample_type: type[OmnipackRow] = OmnipackRow, decoder: Any = None, **kwargs: Any
    ) -> None:
        if not (isinstance(sample_type, type) and issubclass(sample_type, OmnipackRow)):
            raise ValueError(
                f"OmnipackWebdataset yields OmnipackRow samples, dataset.yaml says {sample_type!r}"
            )
        self.__sample_type__ = sample_type
        kwargs.pop("field_map", None)
        super().__init__(path, sample_loader=load_row_fields, part_filter=_every_part, **kwargs)
