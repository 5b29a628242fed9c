"""The trainer half of a model family: stored media payloads -> the model's encoder inputs.

``EncoderInputs`` is built from the settings the planner recorded in ``omnipack.json`` (plain JSON; no
preprocessor_config or tokenizer is needed at train time) and answers, per stored item, how many features
it produces (checked against the row's placeholders), which encoder inputs it gives (numpy arrays named as
the model's forward arguments) and how a micro-batch's items are collated into tensors. Its module imports
only numpy (torch inside functions): a trainer install without transformers, PIL, PyAV or decord loads
every family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..media.audio_storage import INT16_SCALE, STORED_AUDIO_DTYPES

# The OpenAI CLIP pixel statistics, the default normalisation of several vision towers.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# A decoded media part: an array (image [H,W,3], video [T,H,W,3], audio [n]) or named arrays (npz).
Payload = np.ndarray | Mapping[str, np.ndarray]


class EncoderInputs:
    """Base class of a family's trainer half (see the module docstring).

    A subclass sets ``name`` (the family's profile name), ``placeholder_tokens``, ``batch_keys`` (every
    encoder input a batch of this family can carry, named as the model's forward arguments) and
    ``pixel_keys`` (those that hold pixels, raw uint8 with ``pixel_dtype="uint8"``), reads what it needs
    in ``__init__(settings)`` and implements ``feature_count`` and ``media_inputs``; ``collate_media`` has
    a concatenating default.
    """

    name: ClassVar[str]
    # Placeholder tokens of a block of each kind (every token that stands for one encoder feature).
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Encoder inputs a batch of this family can carry (``PackedBatch.encoder_inputs`` keys).
    batch_keys: ClassVar[tuple[str, ...]] = ()
    # The batch keys that hold pixels (uint8 on request, normalized on the device).
    pixel_keys: ClassVar[tuple[str, ...]] = ()
    # Whether ``media_inputs`` takes ``deferred=True`` (pixel patches as ``PendingRows``).
    supports_deferred_inputs: ClassVar[bool] = False

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> EncoderInputs:
        """The trainer half for a dataset's recorded profile settings; a ValueError names a missing one."""
        try:
            return cls(settings)
        except KeyError as e:
            raise ValueError(
                f"profile {cls.name!r}: the dataset's recorded settings lack {e.args[0]!r}, which the loader "
                "needs; re-prepare the dataset with this omnipack version"
            ) from None

    def feature_count(self, item: Any, payload: Payload) -> int:
        """Encoder features (= placeholder tokens) the stored ``payload`` of ``item`` produces.

        ``item`` is a row's media entry (``contract.MediaItem`` or its JSON dict); ``payload`` the decoded
        part (see ``omnipack.loader.media.decode_payload``). Computed from the stored data, not from the
        recorded plan, so a mismatch between what was written and what was planned shows up.
        """
        raise NotImplementedError(f"profile {self.name} has no feature count for {item_kind(item)} media")

    def media_inputs(
        self, item: Any, payload: Payload, *, pixel_dtype: str = "float32"
    ) -> dict[str, np.ndarray]:
        """One item's encoder inputs (numpy), keyed by the model forward argument names (``batch_keys``).

        ``pixel_dtype="uint8"`` asks for un-normalized pixel patches (same layout) for trainers that
        normalize on the GPU with :meth:`pixel_normalization`; families without it raise ValueError.
        """
        raise NotImplementedError(
            f"profile {self.name} cannot build encoder inputs for {item_kind(item)} media yet; "
            "load with decode_media=False"
        )

    def pixel_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """Per-channel (mean, std) of pixel inputs, ``x = (u8 / 255 - mean) / std``; None if not applicable."""
        return None

    def token_inputs(self, tokens: Any, placeholder_ids: Mapping[str, Sequence[int]]) -> dict[str, Any]:
        """Per-token model inputs derived from the token ids (``tokens``: a ``[1, T]`` tensor, possibly a
        CP rank's slice), e.g. Gemma 3's ``token_type_ids``; each must be an element-wise function of the
        tokens, so that it is right on a CP slice. ``placeholder_ids``: the dataset's placeholder token
        ids per media kind. Default: none."""
        return {}

    def pixel_repeats(self, pixel_dtype: str) -> dict[str, int]:
        """Pixel keys whose uint8 batch tensor the loader builds temporally compact, with the repeat count.

        A key ``k -> r`` here: each patch row of ``k`` in the batch holds one temporal slot (``[N, C*P]``)
        where the model's input holds ``r`` identical ones (``[N, C*r*P]``, channel-major), as a still
        image repeated to the temporal patch size is. Workers then build and ship half the bytes (r=2),
        and the consumer repeats the slot where the batch is used (``loader.media.expand_temporal``,
        after normalizing on the device). ``media_inputs(..., compact=True)`` gives that layout.
        Default: none.
        """
        return {}

    def collate_media(self, per_item: list[dict[str, Any]]) -> dict[str, Any]:
        """Items' inputs (placeholder order across the micro-batch) -> batch tensors.

        Default: concatenate every key along dim 0 (patch rows, grid rows, per-item scalars) into one
        tensor allocated for the batch (in shared memory inside a loader worker, so handing it to the
        trainer process copies nothing); ``PendingRows`` are built straight into their slice of it.
        """
        keys: list[str] = []
        for d in per_item:
            keys += [k for k in d if k not in keys]
        return {k: concat_into_batch_tensor([d[k] for d in per_item if k in d]) for k in keys}


@dataclass(frozen=True)
class PendingRows:
    """Rows of a batch tensor built late: ``fill(out)`` writes an array of ``shape``/``dtype`` into ``out``
    (its C-contiguous slice of the batch buffer), so large inputs are written exactly once."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Callable[[np.ndarray], Any]


def batch_storage(nbytes: int) -> tuple[Any, int]:
    """``(storage, byte offset)``: ``nbytes`` of a torch ``UntypedStorage`` for batch tensors. In a
    DataLoader worker it is shared memory (as torch's own default collate does), so sending the batch to
    the main process copies no bytes; there the buffers of one batch are cut from one reused slot
    (``loader.buffer_pool``). Elsewhere an ordinary new storage. Every batch buffer of the loader is
    allocated here."""
    import torch

    from ..loader.buffer_pool import worker_pool

    nbytes = max(int(nbytes), 1)
    pool = worker_pool()
    if pool is None:
        return torch.UntypedStorage(nbytes), 0
    return pool.take(nbytes)


def storage_view(storage: Any, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """A tensor of ``shape``/``dtype`` (numpy or torch dtype) over ``storage`` from byte ``offset`` (a
    multiple of the element size)."""
    import torch

    tdtype = dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(0, dtype=tdtype).set_(storage, offset // tdtype.itemsize, shape)


def empty_batch_tensor(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised torch tensor for a batch, over its own ``batch_storage`` (shared memory in a worker)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    storage, offset = batch_storage(nbytes)
    return storage_view(storage, offset, tuple(shape), dtype)


def concat_into_batch_tensor(parts: list[Any]) -> Any:
    """Arrays / ``PendingRows`` joined along dim 0 into one new batch tensor, each written once."""
    first = parts[0]
    dtype = first.dtype
    tail = tuple(first.shape[1:])
    for p in parts:
        if p.dtype != dtype or tuple(p.shape[1:]) != tail:
            raise ValueError(f"cannot join inputs {dtype} {tail} and {p.dtype} {tuple(p.shape[1:])}")
    rows = sum(int(p.shape[0]) for p in parts)
    out = empty_batch_tensor((rows, *tail), dtype)
    buf = out.numpy()
    at = 0
    for p in parts:
        n = int(p.shape[0])
        if isinstance(p, PendingRows):
            p.fill(buf[at : at + n])
        else:
            buf[at : at + n] = p
        at += n
    return out


def item_kind(item: Any) -> str:
    return item["kind"] if isinstance(item, Mapping) else item.kind


def item_info(item: Any) -> dict[str, Any]:
    """The plan facts the writer recorded for an item (``MediaItem.info``)."""
    return dict(item.get("info", {}) if isinstance(item, Mapping) else item.info)


def payload_frames(payload: Payload) -> np.ndarray:
    """Vision frames uint8 [T, H, W, 3] of an image or video payload."""
    arr = payload["frames"] if isinstance(payload, Mapping) else payload
    arr = np.asarray(arr)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"vision payload has shape {arr.shape}, expected [H,W,3] or [T,H,W,3]")
    return arr


def audio_waveform(stored: np.ndarray) -> np.ndarray:
    """float32 [n] waveform of a stored audio array: int16 ``k`` is ``k / 32768`` (libsndfile's scale, the
    writer's inverse), float32 is the waveform itself; both are exactly what the counts came from."""
    arr = np.asarray(stored)
    if arr.dtype == np.int16:
        return arr.astype(np.float32) / np.float32(INT16_SCALE)
    if arr.dtype == np.float32:
        return arr
    raise ValueError(f"audio payload has dtype {arr.dtype}, expected int16 or float32")


def payload_audio(payload: Payload) -> np.ndarray | None:
    """Stored mono audio [n] (int16 or float32, see ``audio_waveform``) of an audio payload or a video's own
    track; None when there is none. Its length is the sample count; ``audio_waveform`` gives the samples."""
    if isinstance(payload, Mapping):
        if "audio" not in payload:
            return None
        arr = np.asarray(payload["audio"])
    else:
        arr = np.asarray(payload)
    if arr.ndim != 1:
        raise ValueError(f"audio payload has shape {arr.shape}, expected [n]")
    if arr.dtype not in STORED_AUDIO_DTYPES:
        raise ValueError(f"audio payload has dtype {arr.dtype}, expected int16 or float32")
    return arr


def normalize_lut(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """float32 [3, 256]: ``(v / 255 - mean[c]) / std[c]`` for every uint8 value (rescale + normalize)."""
    v = np.arange(256, dtype=np.float64) / 255.0
    return ((v[None, :] - np.asarray(mean)[:, None]) / np.asarray(std)[:, None]).astype(np.float32)
