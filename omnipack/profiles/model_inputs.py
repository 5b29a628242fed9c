"""The trainer half of a model family: stored media payloads -> the model's encoder inputs.

``EncoderInputs`` is built from the settings the planner recorded in ``omnipack.json`` (plain JSON; no
preprocessor_config or tokenizer is needed at train time) and answers, per stored item, how many features
it produces (checked against the row's placeholders), which encoder inputs it gives (numpy arrays named as
the model's forward arguments) and how a micro-batch's items are collated into tensors. Its module imports
only numpy (torch inside functions): a trainer install without transformers, PIL, PyAV or decord loads
every family. It imports nothing of ``omnipack.loader``: the loader hands its buffer allocator in
(``MediaInputOptions.allocate``).

The interface, member by member (a family subclasses ``EncoderInputs``; "must" = no default):

Class attributes
    ``name`` (must): the family's profile name, as its planner's ``name``.
    ``placeholder_tokens`` (must): ``{kind: tokens}``, every token of a block of that kind that stands for
    one encoder feature; the loader counts them against ``feature_count``. A key for each kind the planner
    takes.
    ``batch_keys`` (must): every encoder input a batch of this family can carry, named as the model's
    forward arguments; ``collate_media`` may produce no other key (the loader checks).
    ``pixel_keys`` (default none): the batch keys that hold pixels, uint8 with ``pixel_dtype="uint8"``.

Construction
    ``__init__(settings)``: reads what it needs from the recorded settings (a ``KeyError`` for a missing
    one); call ``super().__init__(settings)``. ``from_settings(settings)`` (inherited) turns a missing
    key into a ValueError that says to re-prepare.

Per item, in a loader worker (``encode_sample``), with the row's media entry ``item`` (``MediaItem`` or its
JSON dict) and its decoded ``payload`` (``omnipack.loader.media.decode_payload``)
    ``feature_count(item, payload) -> int`` (abstract): the encoder features (= placeholder tokens) the
        stored payload gives, computed from the stored data (not the recorded plan) so that a mismatch
        shows up; ValueError for a payload the family cannot use.
    ``media_inputs(item, payload, options) -> dict`` (abstract): the item's encoder inputs, numpy arrays
        (or ``PendingRows`` where ``options.deferred``) keyed by ``batch_keys``. ``options`` is a
        ``MediaInputOptions``, always passed; a family honours what it supports of it (see there) and
        raises ValueError for a ``pixel_dtype`` it cannot give.

Per micro-batch, in a loader worker (``batch``)
    ``collate_media(per_item, options) -> dict`` (default: concatenate every key along dim 0 into one
        tensor from ``options.allocate``, building ``PendingRows`` in place): the items' inputs, in
        placeholder order across the micro-batch, as batch tensors.
    ``token_inputs(tokens, placeholder_ids) -> dict`` (default none): per-token model inputs, functions of
        the micro-batch's whole ``[1, T]`` token tensor (the loader CP-slices them as the tokens), e.g. Gemma
        3's ``token_type_ids``, GLM-4.6V's ``mm_token_type_ids`` (2 on a video's tokens, 1 on an image's).

Once, when the loader is configured
    ``pixel_normalization() -> (mean, std) | None`` (default None): per-channel statistics of the model's
        pixel input ``(u8 / 255 - mean) / std``; a family with them can give uint8 pixels, normalized on the
        device (the loader's default for it).
    ``pixel_repeats(pixel_dtype) -> {key: r}`` (default none): pixel keys the family can give temporally
        compact (one slot where the model input holds ``r`` identical ones) under ``options.compact``.
    ``unpatched_pixels(pixel_dtype) -> {key: (grid key, patch size, merge size, frames)}`` (default none):
        pixel keys the family can give as the stored frames under ``options.unpatched`` (patchified by the
        consumer, ``omnipack.loader.media.patchify_frames``).
    ``wave_features() -> {key: front end}`` (default none): audio feature keys the family can give as the
        clips' stored samples under ``options.waves``, each with the picklable front end that computes the
        features where the batch is used (``front_end(waves, frames) -> features``; its ``lengths_key``
        names the batch key holding each clip's feature frames), e.g. ``audio_features.WhisperLogMel``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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

# Pixel dtypes a loader may ask for: normalized float32 (the processor's values) or raw uint8.
PIXEL_DTYPES = ("float32", "uint8")

# ``allocate(nbytes) -> (torch.UntypedStorage, byte offset)``: where batch tensors are built.
Allocator = Callable[[int], tuple[Any, int]]


def private_storage(nbytes: int) -> tuple[Any, int]:
    """The default ``Allocator``: a new private torch storage of ``nbytes`` (at least one byte)."""
    import torch

    return torch.UntypedStorage(max(int(nbytes), 1)), 0


def wave_samples_key(feature_key: str) -> str:
    """The batch key holding the clips' stored samples for the audio features ``feature_key`` under
    ``MediaInputOptions(waves=True)``: a name of its own (``input_features`` -> ``input_features_waves``),
    so a consumer reading ``feature_key`` gets features or a missing key, never samples."""
    return f"{feature_key}_waves"


@dataclass(frozen=True)
class MediaInputOptions:
    """What the loader asks of ``media_inputs`` / ``collate_media``; one object, always passed.

    ``pixel_dtype``: "float32" (normalized, the processor's values) or "uint8" (raw pixels in the same
    layout, for families whose ``pixel_normalization`` is not None). ``deferred``: pixel inputs may come
    as ``PendingRows`` that ``collate_media`` builds straight into the batch tensor (a family may always
    give plain arrays). ``compact``: the keys ``pixel_repeats(pixel_dtype)`` names hold one temporal slot
    per patch row. ``allocate``: storage for the batch tensors ``collate_media`` builds (the loader passes
    its workers' shared, reused buffers; default: private memory); a tensor made otherwise (e.g. by
    ``torch.from_numpy``) is copied into the loader's shared memory afterwards. ``unpatched`` (uint8): the
    keys ``unpatched_pixels(pixel_dtype)`` names hold each item's stored frames, not yet cut into patches
    (still images one frame, so it implies ``compact``); the consumer patchifies them where the batch is
    used. ``waves``: for each key ``k`` that ``wave_features()`` names, ``wave_samples_key(k)`` holds each
    clip's stored samples, laid out for its front end, which the consumer runs where the batch is used (no
    STFT in the loader); ``k`` itself is absent, so it never holds samples where features are expected.
    """

    pixel_dtype: str = "float32"
    deferred: bool = False
    compact: bool = False
    unpatched: bool = False
    waves: bool = False
    allocate: Allocator = private_storage

    def __post_init__(self) -> None:
        if self.pixel_dtype not in PIXEL_DTYPES:
            raise ValueError(f"pixel_dtype must be one of {PIXEL_DTYPES}, got {self.pixel_dtype!r}")


class EncoderInputs(ABC):
    """Base class of a family's trainer half; the module docstring documents every member."""

    name: ClassVar[str]
    # Placeholder tokens of a block of each kind (every token that stands for one encoder feature).
    placeholder_tokens: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Encoder inputs a batch of this family can carry (``PackedBatch.encoder_inputs`` keys).
    batch_keys: ClassVar[tuple[str, ...]] = ()
    # The batch keys that hold pixels (uint8 on request, normalized on the device).
    pixel_keys: ClassVar[tuple[str, ...]] = ()

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

    @abstractmethod
    def feature_count(self, item: Any, payload: Payload) -> int:
        """Encoder features (= placeholder tokens) the stored ``payload`` of ``item`` produces.

        A family calls this base for a kind it does not take (it raises NotImplementedError naming it).
        """
        raise NotImplementedError(f"profile {self.name} has no feature count for {item_kind(item)} media")

    @abstractmethod
    def media_inputs(self, item: Any, payload: Payload, options: MediaInputOptions) -> dict[str, Any]:
        """One item's encoder inputs keyed by ``batch_keys``, built as ``options`` asks.

        A family calls this base for a kind it does not take (it raises NotImplementedError naming it).
        """
        raise NotImplementedError(
            f"profile {self.name} cannot build encoder inputs for {item_kind(item)} media yet; "
            "load with decode_media=False"
        )

    def pixel_normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """Per-channel (mean, std) of pixel inputs, ``x = (u8 / 255 - mean) / std``; None if not applicable."""
        return None

    def token_inputs(self, tokens: Any, placeholder_ids: Mapping[str, Sequence[int]]) -> dict[str, Any]:
        """Per-token model inputs derived from the token ids (``tokens``: the micro-batch's whole ``[1, T]``
        tensor, its rows' sequences complete; the loader CP-slices the results as it slices the tokens), each
        shaped like ``tokens``. ``placeholder_ids``: the dataset's placeholder token ids per media kind.
        Default: none."""
        return {}

    def pixel_repeats(self, pixel_dtype: str) -> dict[str, int]:
        """Pixel keys whose uint8 batch tensor the loader builds temporally compact, with the repeat count.

        A key ``k -> r`` here: each patch row of ``k`` in the batch holds one temporal slot (``[N, C*P]``)
        where the model's input holds ``r`` identical ones (``[N, C*r*P]``, channel-major), as a still
        image repeated to the temporal patch size is. Workers then build and ship half the bytes (r=2),
        and the consumer repeats the slot where the batch is used (``loader.media.expand_temporal``,
        after normalizing on the device). ``MediaInputOptions(compact=True)`` asks for that layout.
        Default: none.
        """
        return {}

    def unpatched_pixels(self, pixel_dtype: str) -> dict[str, tuple[str, int, int, int]]:
        """Pixel keys the loader can fill with the stored uint8 frames instead of patches, each with
        ``(grid key, patch size, merge size, frames per temporal patch)``.

        Under ``MediaInputOptions(unpatched=True)`` (which implies ``compact``) a key ``k`` here holds, for each item,
        its frames ``[H, W, C]`` as stored in its rows of the batch tensor (same shape as the patches: the
        same bytes in stored order), so workers copy stored bytes (a memcpy) instead of the transposing
        copy; ``loader.media.patchify_frames`` (which ``PackedBatch`` accessors run on the device) gives the
        patches. Default: none.
        """
        return {}

    def wave_features(self) -> dict[str, Any]:
        """Audio feature keys the loader can fill with the clips' stored samples instead of their features,
        each with its front end: a picklable callable ``front_end(waves, frames) -> features`` whose
        ``lengths_key`` names the batch key holding each clip's feature frames.

        Under ``MediaInputOptions(waves=True)`` the key ``wave_samples_key(k)`` (not ``k``) holds the clips'
        samples as the front end lays them out (int16 when stored so: 1.6x fewer bytes than float32 log-mel features), so workers copy
        stored samples instead of running the STFT; ``PackedBatch`` accessors run the front end on the
        device (``frames``: Python ints read from the batch's ``lengths_key`` tensor). Default: none.
        """
        return {}

    def collate_media(self, per_item: list[dict[str, Any]], options: MediaInputOptions) -> dict[str, Any]:
        """Items' inputs (placeholder order across the micro-batch) -> batch tensors.

        Default: concatenate every key along dim 0 (patch rows, grid rows, per-item scalars) into one
        tensor from ``options.allocate`` (in a loader worker, its shared buffers, so handing the batch to
        the trainer process copies nothing); ``PendingRows`` are built straight into their slice of it.
        """
        keys: list[str] = []
        for d in per_item:
            keys += [k for k in d if k not in keys]
        return {
            k: concat_into_batch_tensor([d[k] for d in per_item if k in d], options.allocate) for k in keys
        }


@dataclass(frozen=True)
class PendingRows:
    """Rows of a batch tensor built late: ``fill(out)`` writes an array of ``shape``/``dtype`` into ``out``
    (its C-contiguous slice of the batch buffer), so large inputs are written exactly once."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Callable[[np.ndarray], Any]


def storage_view(storage: Any, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """A tensor of ``shape``/``dtype`` (numpy or torch dtype) over ``storage`` from byte ``offset`` (a
    multiple of the element size)."""
    import torch

    tdtype = dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype)).dtype
    return torch.empty(0, dtype=tdtype).set_(storage, offset // tdtype.itemsize, shape)


def empty_batch_tensor(shape: tuple[int, ...], dtype: Any, allocate: Allocator = private_storage) -> Any:
    """An uninitialised torch tensor for a batch, over storage from ``allocate``."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    storage, offset = allocate(max(nbytes, 1))
    return storage_view(storage, offset, tuple(shape), dtype)


def concat_into_batch_tensor(parts: list[Any], allocate: Allocator = private_storage) -> Any:
    """Arrays / ``PendingRows`` joined along dim 0 into one new batch tensor (storage from ``allocate``),
    each written once."""
    first = parts[0]
    dtype = first.dtype
    tail = tuple(first.shape[1:])
    for p in parts:
        if p.dtype != dtype or tuple(p.shape[1:]) != tail:
            raise ValueError(f"cannot join inputs {dtype} {tail} and {p.dtype} {tuple(p.shape[1:])}")
    rows = sum(int(p.shape[0]) for p in parts)
    out = empty_batch_tensor((rows, *tail), dtype, allocate)
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


def join_into_batch_tensor(
    parts: list[np.ndarray], axis: int, allocate: Allocator = private_storage, fill: float = 0
) -> Any:
    """Arrays joined along ``axis`` into one new batch tensor (storage from ``allocate``), each written
    once; the other axes are padded with ``fill`` to the largest part (as HF processors pad a batch: zeros,
    or ones for Phi-4-multimodal's crop masks)."""
    first = parts[0]
    for p in parts:
        if p.dtype != first.dtype or p.ndim != first.ndim:
            raise ValueError(f"cannot join inputs {first.dtype} {first.shape} and {p.dtype} {p.shape}")
    shape = [max(int(p.shape[d]) for p in parts) for d in range(first.ndim)]
    shape[axis] = sum(int(p.shape[axis]) for p in parts)
    out = empty_batch_tensor(tuple(shape), first.dtype, allocate)
    buf = out.numpy()
    if any(p.shape[d] != shape[d] for p in parts for d in range(first.ndim) if d != axis):
        buf[...] = fill
    at = 0
    for p in parts:
        n = int(p.shape[axis])
        where = tuple(slice(at, at + n) if d == axis else slice(0, p.shape[d]) for d in range(p.ndim))
        buf[where] = p
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
