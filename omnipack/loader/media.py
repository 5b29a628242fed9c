"""Stored media parts -> arrays, and the load-time check that a row's placeholders match its media.

Parts are what ``omnipack.media.probe.materialize`` wrote: images npy (default) or png (older datasets)
uint8 RGB already at the target size, videos npz {frames uint8 [T,H,W,3], audio} (stored or deflated),
audio npy mono at 16 kHz (int16 when exact, else float32; ``profiles.model_inputs.audio_waveform`` reads both).
npy and stored npz members are read as zero-copy views of the part's bytes; PIL is imported only when a
png is actually decoded.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..dataset.codec import view_npy, view_npz
from ..dataset.contract import MediaItem, is_any_of
from ..profiles.model_inputs import EncoderInputs, MediaInputOptions, Payload


class MediaMismatchError(ValueError):
    """A row's placeholder tokens disagree with the features its stored media produce."""


def decode_payload(part: str, data: bytes) -> Payload:
    """The array(s) of one stored media part, chosen by its extension (read-only views where possible)."""
    ext = part.rsplit(".", 1)[-1]
    if ext == "npy":
        return view_npy(data)
    if ext == "npz":
        return view_npz(data)
    if ext == "png":
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            if img.mode != "RGB":  # stored RGB already; convert() would copy the whole image again
                img = img.convert("RGB")
            return np.asarray(img, dtype=np.uint8)
    raise ValueError(
        f"unsupported media part {part!r}: this omnipack reads npy, npz and png payloads; "
        "re-prepare the dataset with this version"
    )


def check_row_media(
    profile: EncoderInputs,
    items: Sequence[MediaItem],
    payloads: Sequence[Payload],
    tokens: np.ndarray,
    *,
    placeholder_ids: Mapping[str, Sequence[int]] | None,
    row_key: str,
    sample_ids: Sequence[str],
) -> None:
    """Raise ``MediaMismatchError`` unless every item's ``num_tokens``, the placeholder ids counted in its
    block (when ``placeholder_ids`` is known) and the feature count of its stored payload all agree."""
    tokens = np.asarray(tokens)
    for idx, (m, payload) in enumerate(zip(items, payloads, strict=True)):
        a, b = m.block_start, m.block_end
        where = (
            f"row {row_key!r}, sample {sample_ids[m.sample_index]!r}, media {idx} ({m.kind}, part {m.part!r})"
        )
        try:
            features = profile.feature_count(m, payload)
        except ValueError as e:
            raise MediaMismatchError(f"{where}: stored media unusable: {e}") from None
        counted = None
        if placeholder_ids is not None and m.kind in placeholder_ids:
            counted = int(is_any_of(tokens[a:b], placeholder_ids[m.kind]).sum())
        if features != m.num_tokens or (counted is not None and counted != m.num_tokens):
            seen = "" if counted is None else f", placeholder tokens in tokens[{a}:{b}] = {counted}"
            raise MediaMismatchError(
                f"{where}: placeholder count mismatch: meta num_tokens = {m.num_tokens}{seen}, "
                f"features of the stored {m.kind} = {features} ({_shape(payload)}). The row would feed the "
                "model misaligned embeddings; re-prepare the dataset (or check it with `omnipack verify`)."
            )


def _shape(payload: Payload) -> str:
    if isinstance(payload, Mapping):
        return ", ".join(f"{k} {tuple(np.shape(v))}" for k, v in payload.items())
    return f"shape {tuple(np.shape(payload))}"


def row_media_inputs(
    profile: EncoderInputs, items: Sequence[MediaItem], payloads: Sequence[Any], options: MediaInputOptions
) -> list[dict]:
    """Per-item encoder inputs of one row, in placeholder order, each built as ``options`` asks."""
    order = sorted(range(len(items)), key=lambda i: (items[i].sample_index, items[i].token_start))
    return [profile.media_inputs(items[i], payloads[i], options) for i in order]


def normalize_pixels(pixels: Any, mean: Any, std: Any) -> Any:
    """uint8 patches ``[N, C*...]`` (channel-major rows) -> float32 ``(x / 255 - mean[c]) / std[c]``.

    A torch function, so a trainer runs it on the GPU after copying the 4x smaller uint8 patches there.
    The float32 operations and their order are the HF Qwen-VL image processors', so the result is
    bit-identical to their ``pixel_values`` (IEEE division and subtraction give the same bits on CPU and GPU).
    """
    import torch

    n, c = pixels.shape[0], len(mean)
    m = torch.as_tensor(mean, dtype=torch.float32, device=pixels.device).view(1, c, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=pixels.device).view(1, c, 1)
    x = pixels.reshape(n, c, -1).to(torch.float32)
    x = x.div_(255.0).sub_(m).div_(s)
    return x.reshape(pixels.shape)


def expand_temporal(pixels: Any, channels: int, repeat: int) -> Any:
    """Temporally compact patches ``[N, C*P]`` -> ``[N, C*repeat*P]``: each channel's slot repeated
    ``repeat`` times, the (channel, temporal, patch) row layout of the HF Qwen-VL processors for a still
    image (``EncoderInputs.pixel_repeats``). Works on uint8 or normalized float32 patches (normalization is
    per element, so expanding before or after it gives the same bits); a torch function, run where the
    batch is used (the GPU), so workers build and ship one slot."""
    n = pixels.shape[0]
    return pixels.reshape(n, channels, 1, -1).expand(n, channels, repeat, -1).reshape(n, -1)


def patchify_frames(
    pixels: Any, grids: Sequence[Sequence[int]], channels: int, patch_size: int, merge_size: int, frames: int
) -> Any:
    """Rows holding each item's stored uint8 frames in turn -> its patches, in the HF Qwen-VL layout.

    ``pixels`` ``[N, C*frames*P]`` holds, for each item of ``grids`` (``(t, gh, gw)`` rows, in order), its
    ``t*frames`` frames ``[H, W, C]`` as stored (``H = gh*patch_size``; videos padded with their last frame
    to whole temporal patches), in its ``t*gh*gw`` rows (``EncoderInputs.unpatched_pixels``). Returns the
    same shape with rows over (t, h-block, w-block, merge-h, merge-w) and columns over (channel, frame,
    patch-h, patch-w): what the processor gives (``frames`` = its temporal patch size), or the compact
    one-slot layout (``frames`` = 1) that ``expand_temporal`` repeats. A torch function, run where the
    batch is used (the GPU), so the loader workers only copy stored bytes. ``grids``: Python ints (read
    them before moving the batch to a device)."""
    import torch

    out = torch.empty_like(pixels)
    ps, m, c, start = patch_size, merge_size, channels, 0
    for t, gh, gw in grids:
        n = t * gh * gw
        x = pixels[start : start + n].reshape(t, frames, gh // m, m, ps, gw // m, m, ps, c)
        out[start : start + n].view(t, gh // m, gw // m, m, m, c, frames, ps, ps).copy_(
            x.permute(0, 2, 5, 3, 6, 8, 1, 4, 7)
        )
        start += n
    if start != pixels.shape[0]:
        raise ValueError(f"grids cover {start} patch rows, the pixels hold {pixels.shape[0]}")
    return out
