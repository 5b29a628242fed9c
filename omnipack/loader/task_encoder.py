"""The Energon task encoder: omnipack rows -> Megatron-ready THD batches (with media encoder inputs).

Rows are already packed, so the loader runs with ``packing_buffer_size=None``; a micro-batch of MBS rows
becomes one ``[1, MBS*W]`` THD stream, optionally sliced for a context-parallel rank. With the family's
trainer half (``model_inputs``; ``from_dataset`` builds it), ``encode_sample`` (in the Energon worker
processes) checks each row's contract, views every stored media part, checks it against the row's
placeholders and plans the model's encoder inputs;
``batch`` builds them once, straight into the batch tensors (in shared memory inside a worker, so the hand-
over to the trainer copies nothing), in placeholder order across the micro-batch.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from megatron.energon import Batch, Cooker, DefaultTaskEncoder, edataclass, stateless
from megatron.energon.errors import FatalSampleError

from ..alignment import pad_to_multiple
from ..dataset.contract import PackedRowArrays, row_contract_errors
from ..dataset.meta import read_omnipack_meta
from ..profiles import get_encoder_inputs
from ..profiles.base import ModelProfile
from ..profiles.hf_config import dataset_placeholder_ids
from ..profiles.model_inputs import EncoderInputs, MediaInputOptions, storage_view, wave_samples_key
from .batch import concat_rows, packed_seq_fields, packed_seq_params
from .buffer_pool import ALIGN, BufferLease, batch_storage, unpin_small, worker_pool
from .compat import check_dataset_alignment
from .context_parallel import cp_partition_indices, slice_batch_for_cp
from .media import (
    MediaMismatchError,
    check_row_media,
    decode_payload,
    expand_temporal,
    normalize_pixels,
    patchify_frames,
    row_media_inputs,
)
from .sample import PackedRowSample, cook_packed_row


class FatalMediaMismatch(FatalSampleError, MediaMismatchError):
    """A MediaMismatchError that Energon's error handler must not skip: a wrong row stops the loader."""


class RowContractError(FatalSampleError, ValueError):
    """A row breaks the packed-row contract (boundaries, dtypes, padding mask, supervision on placeholders).

    Fatal for Energon (its default handler would log and skip the row): training on it would be silently
    wrong, so the loader stops and names the row key and sample ids.
    """


PIXEL_DTYPE_CHOICES = ("auto", "float32", "uint8")
AUDIO_FEATURES_CHOICES = ("auto", "device", "worker")


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
    # The model's encoder inputs, named as its forward arguments; which keys exist is the family's
    # (``EncoderInputs.batch_keys``), e.g. Qwen-VL ``pixel_values`` / ``image_grid_thw``, Qwen3-Omni also
    # ``input_features`` / ``feature_attention_mask``, Nemotron Omni ``image_grid_hw`` / ``input_features_mask``.
    # Placeholder order across the micro-batch. Shipped audio samples are no forward argument: they have a key
    # of their own (``input_features_waves``, see ``wave_features``) that the accessors turn into features.
    encoder_inputs: dict[str, torch.Tensor] | None = None
    # The encoder inputs that hold pixels; uint8 ones (the default for Qwen families) are raw pixel values
    # and the model input is (x / 255 - pixel_mean[c]) / pixel_std[c] per channel
    # (``normalized_media_inputs`` / ``as_dict`` apply it, on the device when given one, bit-identical to
    # the HF processor's float32).
    pixel_keys: tuple[str, ...] = ()
    pixel_mean: torch.Tensor | None = None  # float32 [3]
    pixel_std: torch.Tensor | None = None  # float32 [3]
    # Pixel keys held temporally compact in ``encoder_inputs`` (uint8 only), with the model's repeat count:
    # a still image's patch row holds its one temporal slot ``[N, 3*P]``; the model input (and
    # ``media_inputs`` / ``normalized_media_inputs`` / ``as_dict``) repeats it to ``[N, 3*r*P]``
    # (``EncoderInputs.pixel_repeats``; half the bytes to build, hand over and copy to the GPU at r=2).
    pixel_repeats: dict[str, int] | None = None
    # Pixel keys whose rows in ``encoder_inputs`` hold each item's stored uint8 frames, not yet cut into
    # patches (``EncoderInputs.unpatched_pixels``: grid key, patch size, merge size, frames per temporal
    # patch); every accessor below patchifies them (``loader.media.patchify_frames``; on the device for
    # ``as_dict(device)``), so workers only copy stored bytes.
    unpatched_pixels: dict[str, tuple[str, int, int, int]] | None = None
    # Audio feature keys whose clips' stored samples, not yet features, ``encoder_inputs`` holds under
    # ``wave_samples_key(key)`` (``input_features_waves``; ``key`` itself is absent), with the family's front
    # end (``EncoderInputs.wave_features``, e.g. Whisper's log-mel); every accessor below runs it (on the
    # device for ``as_dict(device)``) and gives ``key``, so workers only copy stored samples.
    wave_features: dict[str, Any] | None = None
    # cp_size > 1: int64 [T_local], the full-stream position of each of this rank's tokens.
    cp_token_indices: torch.Tensor | None = None
    # Per-token model inputs the family derives from the tokens (``EncoderInputs.token_inputs``, e.g.
    # Gemma 3's ``token_type_ids``), shaped like ``tokens`` (this CP rank's slice).
    token_inputs: dict[str, torch.Tensor] | None = None
    # From a loader worker: the worker's shared buffers this batch lives in, reused by the worker once this
    # batch's tensors are freed here (``loader.buffer_pool``).
    buffer_lease: BufferLease | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled in a loader worker: tensors in the worker's reused buffers travel as references to them
        # (``BufferLease.pack``). Every field, since the dataclass is slotted.
        state = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return state if self.buffer_lease is None else self.buffer_lease.pack(state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in the trainer process: those tensors alias the worker's buffers, which the worker
        # reuses once they are all freed here (``BufferLease.unpack``); small tensors get memory of their
        # own, so that keeping one keeps no batch alive (also when buffers are not reused).
        lease = state.get("buffer_lease")
        if lease is not None:
            state = lease.unpack(state)
        elif torch.utils.data.get_worker_info() is None:
            state = unpin_small(state)
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def media_inputs(self) -> dict[str, torch.Tensor]:
        """The encoder inputs present in this batch (placeholder order across the micro-batch), in the HF
        layout: unpatched pixels (``unpatched_pixels``) are cut into patches, temporally compact ones
        (``pixel_repeats``) repeated and audio samples (``wave_features``) turned into features here."""
        host = self.encoder_inputs or {}
        out = self._featurized(self._patchified(dict(host), host), host)
        return {k: self._expanded(k, v) for k, v in out.items()}

    def _channels(self) -> int:
        return len(self.pixel_mean) if self.pixel_mean is not None else 3

    def _patchified(
        self, values: dict[str, torch.Tensor], host: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """``values`` with its unpatched pixel keys cut into patches (where they are: the device), the items'
        grids read from ``host`` (this batch's own tensors, so no device sync)."""
        for key, (grid_key, ps, merge, frames) in (self.unpatched_pixels or {}).items():
            if key in values:
                grids = host[grid_key].tolist()
                values[key] = patchify_frames(values[key], grids, self._channels(), ps, merge, frames)
        return values

    def _featurized(
        self, values: dict[str, torch.Tensor], host: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """``values`` with its audio sample keys turned into features by the family's front end (where they
        are: the device), each clip's frame count read from ``host`` (no device sync). The samples' key
        (``wave_samples_key``) is replaced by the features' key, at the same position."""
        for key, front_end in (self.wave_features or {}).items():
            src = wave_samples_key(key)
            if src in values:
                feats = front_end(values[src], host[front_end.lengths_key].tolist())
                values = {key if k == src else k: feats if k == src else v for k, v in values.items()}
        return values

    def _expanded(self, key: str, value: torch.Tensor) -> torch.Tensor:
        repeat = (self.pixel_repeats or {}).get(key, 1)
        if repeat == 1:
            return value
        return expand_temporal(value, self._channels(), repeat)

    def normalized_media_inputs(self, device: Any = None) -> dict[str, torch.Tensor]:
        """``media_inputs`` moved to ``device`` with uint8 pixel patches normalized to float32 there.

        With uint8 pixels (the default for Qwen profiles) the 4x smaller patches cross the host-device link
        and are normalized on the device, bit-identical to the HF processor's ``pixel_values``; with
        ``pixel_dtype="float32"`` this only moves tensors.
        """
        out = {
            k: v.to(device, non_blocking=True) if device is not None else v
            for k, v in (self.encoder_inputs or {}).items()
        }
        # Stored frames cross the link as they are and are cut into patches there (a copy on the device);
        # stored audio samples likewise, and their log-mel is computed there.
        out = self._featurized(self._patchified(out, self.encoder_inputs or {}), self.encoder_inputs or {})
        if self.pixel_mean is not None and self.pixel_std is not None:
            for k in self.pixel_keys:
                if k in out and out[k].dtype == torch.uint8:
                    out[k] = normalize_pixels(out[k], self.pixel_mean, self.pixel_std)
        # Compact pixels cross the link once per image and are repeated on the device, after normalizing.
        return {k: self._expanded(k, v) for k, v in out.items()}

    def as_dict(self, device: Any = None) -> dict[str, Any]:
        """The Megatron-Bridge ``get_batch`` dict, model-ready: media inputs as ``normalized_media_inputs``
        (float32 pixels). With ``device`` every tensor is moved there first (non-blocking), so uint8 pixels
        cross the host-device link and are normalized on the device."""
        out = self._token_fields()
        if device is not None:
            out = {
                k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in out.items()
            }
        out.update(self.normalized_media_inputs(device))
        return out

    def _token_fields(self) -> dict[str, Any]:
        """Token, boundary and position fields by their ``get_batch`` names (no media)."""
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
        out.update(self.token_inputs or {})
        return out

    def packed_seq_params(self) -> Any:
        """megatron-core's ``PackedSeqParams`` (qkv_format "thd"); ImportError naming the extra without it."""
        return packed_seq_params(self._token_fields())  # no media: nothing to normalize

    def packed_seq_fields(self) -> dict[str, Any]:
        """The same fields as a plain dict (with ``total_tokens``), for trainers without megatron-core."""
        return packed_seq_fields(self._token_fields())


def _model_inputs_argument(
    model_inputs: EncoderInputs | ModelProfile | None, profile: EncoderInputs | ModelProfile | None
) -> EncoderInputs | None:
    """The family's trainer half from ``model_inputs=`` or the deprecated ``profile=`` (a planner is
    reduced to its trainer half: the loader needs nothing else)."""
    if profile is not None:
        if model_inputs is not None:
            raise TypeError("pass model_inputs= only (profile= is its deprecated name)")
        warnings.warn(
            "OmnipackTaskEncoder(profile=...) is deprecated: pass model_inputs=",
            DeprecationWarning,
            stacklevel=3,
        )
        model_inputs = profile
    if isinstance(model_inputs, ModelProfile):
        model_inputs = model_inputs.inputs()
    return model_inputs


def _resolved_pixel_dtype(
    pixel_dtype: str, model_inputs: EncoderInputs | None, decode_media: bool
) -> tuple[str, tuple[Any, Any] | None]:
    """The pixel dtype ``auto`` stands for, and the family's pixel normalisation; checked."""
    if pixel_dtype not in PIXEL_DTYPE_CHOICES:
        raise ValueError(f"pixel_dtype must be one of {PIXEL_DTYPE_CHOICES}, got {pixel_dtype!r}")
    if decode_media and model_inputs is None:
        raise ValueError("decode_media needs model_inputs (use OmnipackTaskEncoder.from_dataset)")
    norm = model_inputs.pixel_normalization() if model_inputs is not None else None
    if pixel_dtype == "auto":
        pixel_dtype = "uint8" if norm is not None else "float32"
    if pixel_dtype == "uint8" and decode_media and norm is None:
        raise ValueError(f"profile {getattr(model_inputs, 'name', None)!r} has no uint8 pixel path")
    return pixel_dtype, norm


def _resolved_audio_features(
    audio_features: str, model_inputs: EncoderInputs | None, decode_media: bool, uint8_pixels: bool
) -> dict[str, Any]:
    """The family's audio front ends the accessors run (``{feature key: front end}``; empty: the workers
    build the features). ``auto``: "device" with uint8 pixels (the consumer finishes the inputs anyway),
    "worker" with float32 ones (model-ready encoder inputs from the workers)."""
    if audio_features not in AUDIO_FEATURES_CHOICES:
        raise ValueError(f"audio_features must be one of {AUDIO_FEATURES_CHOICES}, got {audio_features!r}")
    if not decode_media or model_inputs is None:
        return {}
    front_ends = dict(model_inputs.wave_features())
    if audio_features == "device" and not front_ends:
        raise ValueError(
            f"profile {model_inputs.name!r} has no device-side audio front end (wave_features): "
            'use audio_features="auto" or "worker"'
        )
    device = audio_features == "device" or (audio_features == "auto" and uint8_pixels)
    return front_ends if device else {}


class OmnipackTaskEncoder(DefaultTaskEncoder[PackedRowSample, PackedRowSample, PackedBatch, PackedBatch]):
    """Cooks omnipack rows and batches them into THD micro-batches (CP-sliced when ``cp_size > 1``).

    ``model_inputs``: the family's trainer half (``omnipack.profiles.model_inputs.EncoderInputs``, e.g.
    ``get_encoder_inputs(name, settings)``; a ``ModelProfile`` planner is reduced to it). ``profile=`` is its
    deprecated name. Without it media parts pass through as bytes (``batch.media``). With it, every row's
    media is decoded in ``encode_sample``; ``check_media`` asserts placeholder counts against the stored media
    (``MediaMismatchError`` names the row and sample) and ``decode_media`` builds encoder inputs (then the
    bytes are dropped so workers do not ship them twice). Prefer ``from_dataset``.

    ``pixel_dtype``: "auto" (default) is "uint8" for profiles with a per-channel pixel normalization
    (Qwen families) and "float32" otherwise. "uint8" gives the raw pixel values in the HF layout, a quarter
    of the bytes to build, ship between workers and copy to the GPU, plus ``batch.pixel_mean`` /
    ``batch.pixel_std`` (float32 [3]): the model input is ``(x.float() / 255 - mean[c]) / std[c]`` with
    ``x`` viewed as ``[patches, 3, -1]``, which ``batch.as_dict(device)`` /
    ``batch.normalized_media_inputs(device)`` compute on the device, bit-identical to the HF processor.
    "float32" builds those normalized values in the worker (same bits, 4x the bytes).

    ``audio_features``: where the audio features of a family with a device-side front end
    (``EncoderInputs.wave_features``: Qwen3-Omni's Whisper log-mel) are computed. "device": the workers ship
    each clip's stored samples under ``wave_samples_key`` (``encoder_inputs["input_features_waves"]``, no
    ``input_features``) and ``media_inputs`` / ``normalized_media_inputs`` / ``as_dict`` compute the
    features (on the device for ``as_dict(device)``), bit-identical on CPU to "worker", which builds
    ``encoder_inputs["input_features"]`` in the workers. "auto" (default): "device" with uint8 pixels,
    "worker" with float32 ones; "device" for a family without such a front end is a ValueError.

    ``check_rows`` (default on): every row is checked against the packed-row contract
    (``omnipack.dataset.contract.row_contract_errors``: boundaries, dtypes, padding mask, labels / loss mask, no
    supervision on placeholders); a broken row raises ``RowContractError`` (fatal for Energon) naming the
    row key and sample ids. ``align``: the dataset's alignment (``from_dataset`` reads it).

    ``reuse_buffers`` (default on): a loader worker reuses a batch's shared memory once no process can read
    that batch any more: the trainer process freed every tensor of it, and no child forked while it held
    the batch may map it (``omnipack.loader.buffer_pool``), instead of fresh shared memory per batch; off,
    each batch gets fresh memory. Either way small tensors are copied out of the shared memory on arrival,
    so keeping one keeps no batch alive.
    """

    decoder = None  # parts arrive as raw bytes; the cooker decodes .npy without pickle
    cookers = [Cooker(cook_packed_row)]

    def __init__(
        self,
        *,
        cp_size: int = 1,
        cp_rank: int = 0,
        tp_size: int = 1,
        sequence_parallel: bool = False,
        model_inputs: EncoderInputs | ModelProfile | None = None,
        decode_media: bool = False,
        check_media: bool = True,
        placeholder_ids: Mapping[str, Sequence[int]] | None = None,
        pixel_dtype: str = "auto",
        audio_features: str = "auto",
        check_rows: bool = True,
        align: int = 1,
        reuse_buffers: bool = True,
        profile: EncoderInputs | ModelProfile | None = None,
    ) -> None:
        super().__init__(raw_batch_type=PackedBatch, batch_type=PackedBatch)
        model_inputs = _model_inputs_argument(model_inputs, profile)
        pixel_dtype, norm = _resolved_pixel_dtype(pixel_dtype, model_inputs, decode_media)
        if not 0 <= cp_rank < cp_size:
            raise ValueError(f"cp_rank {cp_rank} outside [0, {cp_size})")
        self.cp_size, self.cp_rank = cp_size, cp_rank
        self.tp_size, self.sequence_parallel = tp_size, sequence_parallel
        self.model_inputs = model_inputs
        self.decode_media = decode_media
        self.check_media = check_media and model_inputs is not None
        self.placeholder_ids = (
            None if placeholder_ids is None else {k: list(v) for k, v in placeholder_ids.items()}
        )
        self.pixel_dtype = pixel_dtype
        self.check_rows = check_rows
        self.reuse_buffers = reuse_buffers
        self.align = int(align)
        # What the model must apply to uint8 pixels (None in float32 mode: already applied).
        self.pixel_mean = self.pixel_std = None
        if pixel_dtype == "uint8" and norm is not None:
            self.pixel_mean = torch.tensor(norm[0], dtype=torch.float32)
            self.pixel_std = torch.tensor(norm[1], dtype=torch.float32)
        # Pixel keys built temporally compact (uint8 still images: one slot instead of identical copies).
        uint8_media = decode_media and self.pixel_mean is not None
        self.pixel_repeats = dict(model_inputs.pixel_repeats(pixel_dtype)) if uint8_media else {}
        # Pixel keys the workers fill with the stored frames (a copy of the stored bytes, no transposing
        # gather); the batch's accessors cut them into patches where it is used.
        self.unpatched_pixels = dict(model_inputs.unpatched_pixels(pixel_dtype)) if uint8_media else {}
        # Audio feature keys whose stored samples the workers ship (under wave_samples_key); the batch's
        # accessors compute the features where it is used. Empty: features built in the workers.
        self.wave_features = _resolved_audio_features(audio_features, model_inputs, decode_media, uint8_media)
        self.audio_features = "device" if self.wave_features else "worker"
        # What every media_inputs / collate_media call gets. Deferred: pixel patches are built once, in
        # batch(), straight into the batch tensor, which the workers' reused shared buffers hold.
        self.media_options = MediaInputOptions(
            pixel_dtype=pixel_dtype,
            deferred=True,
            compact=bool(self.pixel_repeats),
            unpatched=bool(self.unpatched_pixels),
            waves=bool(self.wave_features),
            allocate=batch_storage,
        )

    @property
    def profile(self) -> EncoderInputs | None:
        """Deprecated name of ``model_inputs``."""
        warnings.warn(
            "OmnipackTaskEncoder.profile is deprecated: read model_inputs", DeprecationWarning, stacklevel=2
        )
        return self.model_inputs

    @classmethod
    def from_dataset(
        cls,
        path: str | Path,
        *,
        tp: int = 1,
        cp: int = 1,
        cp_rank: int = 0,
        sequence_parallel: bool = False,
        fp8: str = "none",
        decode_media: bool = True,
        check_media: bool = True,
        pixel_dtype: str = "auto",
        audio_features: str = "auto",
        check_rows: bool = True,
        reuse_buffers: bool = True,
    ) -> OmnipackTaskEncoder:
        """An encoder for the dataset at ``path``, configured from its ``.nv-meta/omnipack.json``.

        Checks that the dataset's alignment serves ``tp/cp/sequence_parallel/fp8`` (``DatasetAlignmentError``
        otherwise) and builds the profile's trainer half (``EncoderInputs``) from the recorded name and
        settings: only that family's module is imported, and no preprocessor_config or tokenizer is needed.
        ``pixel_dtype``: "auto", "uint8" (normalized on the device, see the class) or "float32";
        ``audio_features``: "auto", "device" (log-mel where the batch is used) or "worker" (see the class);
        ``check_rows``: the per-row contract check; ``reuse_buffers``: workers reuse shared memory (see the
        class).
        """
        meta = read_omnipack_meta(path)  # a folder, or msc://PROFILE/path as Energon opens it
        check_dataset_alignment(
            int(meta["align"]),
            tp=tp,
            cp=cp,
            sequence_parallel=sequence_parallel,
            fp8=fp8,
            seq_length=int(meta["seq_length"]),
        )
        rec = meta["profile"]
        model_inputs = get_encoder_inputs(rec["name"], rec.get("settings", {}))
        return cls(
            cp_size=cp,
            cp_rank=cp_rank,
            tp_size=tp,
            sequence_parallel=sequence_parallel,
            model_inputs=model_inputs,
            decode_media=decode_media,
            check_media=check_media,
            placeholder_ids=dataset_placeholder_ids(meta, model_inputs)[0],
            pixel_dtype=pixel_dtype,
            audio_features=audio_features,
            check_rows=check_rows,
            align=int(meta["align"]),
            reuse_buffers=reuse_buffers,
        )

    def row_errors(self, sample: PackedRowSample) -> list[str]:
        """The contract violations of one cooked row (empty when it is sound)."""
        t = sample.arrays()
        row = PackedRowArrays(
            **{k: v.numpy() for k, v in t.items()},
            sample_ids=sample.sample_ids,
            media=sample.media_items,
        )
        return row_contract_errors(row, self.align, self.placeholder_ids)

    @stateless
    def encode_sample(self, sample: PackedRowSample) -> PackedRowSample:
        if self.check_rows and (errs := self.row_errors(sample)):
            raise RowContractError(
                f"row {sample.__key__!r} (samples {sample.sample_ids}) breaks the packed-row contract: "
                + "; ".join(errs)
                + ". Training on it would be wrong; check the dataset with `omnipack verify` "
                "(check_rows=False skips this check)."
            )
        if self.model_inputs is None or not (self.check_media or self.decode_media):
            return sample
        items = sample.media_items
        parts = sample.media or {}
        payloads = [decode_payload(m.part, parts[m.part]) for m in items]
        if self.check_media:
            try:
                check_row_media(
                    self.model_inputs,
                    items,
                    payloads,
                    sample.tokens.numpy(),
                    placeholder_ids=self.placeholder_ids,
                    row_key=sample.__key__,
                    sample_ids=sample.sample_ids,
                )
            except MediaMismatchError as e:
                raise FatalMediaMismatch(str(e)) from None
        if self.decode_media:
            sample.media_inputs = row_media_inputs(self.model_inputs, items, payloads, self.media_options)
            sample.media = None
        return sample

    @stateless
    def batch(self, samples: list[PackedRowSample]) -> PackedBatch:
        pool = worker_pool() if self.reuse_buffers else None
        if pool is None:
            return self._batch(samples)
        with pool.batch_scope() as scope:
            out = self._batch(samples)
            out.buffer_lease = pool.lease(scope)
        return out

    def _rank_tokens(self, fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
        """(this CP rank's token fields, its per-token model inputs, where its tokens sit in the stream)."""
        token_inputs: dict[str, Any] = {}
        if self.model_inputs is not None and self.placeholder_ids is not None:
            # from the rows' whole token stream (a value may depend on the media marks around a token), then
            # CP-sliced as the tokens are
            token_inputs = self.model_inputs.token_inputs(fields["tokens"], self.placeholder_ids)
        if self.cp_size == 1:
            return fields, token_inputs, None
        # Where this rank's tokens sit in the full stream: a model that merges media embeddings (which are not
        # CP-split) finds the placeholders local to this rank through it.
        cp_token_indices = cp_partition_indices(fields["cu_seqlens_q_padded"], self.cp_size, self.cp_rank)
        named = {f"token_inputs.{k}": v for k, v in token_inputs.items()}
        fields = slice_batch_for_cp(
            {**fields, **named},
            self.cp_size,
            self.cp_rank,
            tp_size=self.tp_size,
            sequence_parallel=self.sequence_parallel,
            extra_token_keys=named,
        )
        return fields, {k: fields.pop(name) for k, name in zip(token_inputs, named, strict=True)}, cp_token_indices

    def _batch(self, samples: list[PackedRowSample]) -> PackedBatch:
        fields, token_inputs, cp_token_indices = self._rank_tokens(concat_rows([s.arrays() for s in samples]))
        media: dict[str, Any] = {}
        if self.decode_media and self.model_inputs is not None:
            per_item = [d for s in samples for d in (s.media_inputs or [])]
            if per_item:
                media = self.model_inputs.collate_media(per_item, self.media_options)
                unknown = set(media) - set(self.model_inputs.batch_keys)
                if unknown:
                    raise ValueError(
                        f"profile {self.model_inputs.name} produced batch keys {sorted(unknown)} outside its "
                        f"batch_keys {list(self.model_inputs.batch_keys)}"
                    )
        norm: dict[str, Any] = dict.fromkeys(("pixel_mean", "pixel_std"))
        if self.pixel_mean is not None and self.pixel_std is not None:
            norm.update(pixel_mean=self.pixel_mean.clone(), pixel_std=self.pixel_std.clone())
        # Every optional field explicitly (from_samples would otherwise look them up on the row samples).
        # Encoder inputs travel under ("encoder", key) so one shared storage holds every small tensor.
        flat = share_in_one_storage(
            {
                "mrope_position_ids": None,  # rows without mRoPE ids (from_samples would list the rows' Nones)
                **fields,
                **norm,
                "cp_token_indices": cp_token_indices,
                **{("encoder", k): v for k, v in media.items()},
                **{("token", k): v for k, v in token_inputs.items()},
            }
        )
        encoder_inputs = {k[1]: flat.pop(k) for k in list(flat) if isinstance(k, tuple) and k[0] == "encoder"}
        token_fields = {k[1]: flat.pop(k) for k in list(flat) if isinstance(k, tuple) and k[0] == "token"}
        return PackedBatch.from_samples(
            samples,
            **flat,
            encoder_inputs=encoder_inputs if self.decode_media else None,
            token_inputs=token_fields or None,
            pixel_keys=tuple(self.model_inputs.pixel_keys) if self.model_inputs is not None else (),
            pixel_repeats={k: r for k, r in self.pixel_repeats.items() if k in encoder_inputs} or None,
            unpatched_pixels={k: v for k, v in self.unpatched_pixels.items() if k in encoder_inputs} or None,
            wave_features={k: v for k, v in self.wave_features.items() if wave_samples_key(k) in encoder_inputs}
            or None,
            sample_ids=[s.sample_ids for s in samples],
            row_meta=[s.meta for s in samples],
            media=None if self.decode_media else [s.media or {} for s in samples],
            buffer_lease=None,  # set by batch() in a worker
        )

    @stateless
    def encode_batch(self, batch: PackedBatch) -> PackedBatch:
        return batch


def share_in_one_storage(values: dict[Any, Any], align: int = ALIGN) -> dict[Any, Any]:
    """Inside a loader worker: the tensors of ``values`` not yet in shared memory, copied into ONE shared
    buffer (cut from the batch's pool slot, ``loader.buffer_pool``; ``align``-byte aligned, non-overlapping
    views); other values unchanged. Outside a worker: ``values`` as they are.

    Handing a batch to the trainer process passes one file descriptor per storage, each a socket
    handshake the trainer's main process waits on; a batch has ~15-25 small tensors (tokens, boundaries,
    grids, audio features) besides the pixel buffers that ``collate_media`` already built in shared memory.
    """
    if torch.utils.data.get_worker_info() is None:
        return values
    todo = [k for k, v in values.items() if isinstance(v, torch.Tensor) and not v.is_shared()]
    offsets, total = {}, 0
    for k in todo:
        offsets[k] = total
        total += pad_to_multiple(values[k].numel() * values[k].element_size(), align)
    if not todo:
        return values
    storage, base = batch_storage(total)
    out = dict(values)
    for k in todo:
        v = values[k]
        out[k] = storage_view(storage, base + offsets[k], tuple(v.shape), v.dtype).copy_(v)
    return out
