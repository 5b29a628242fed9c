"""Images: header-only probing, decoding, resizing to the profile's target size, lossless encoding."""

from __future__ import annotations

import io
import os
import re
from typing import IO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import MediaError
from .meta import MediaMeta

# Resampling the model's image processor uses (Qwen: bicubic); the trainer never resizes again.
RESAMPLE = Image.Resampling.BICUBIC
# EXIF orientations that swap width and height (transpose, rotate 90 CW, transverse, rotate 90 CCW).
EXIF_ORIENTATION = 0x0112
SWAPS_SIDES = (5, 6, 7, 8)
# "npy" (default): raw uint8 [H, W, 3], written ~100x faster than PNG and read as a zero-copy view;
# "png": ~1.8x smaller shards for photos, but encoding dominates a prepare and decoding the loader.
IMAGE_ENCODINGS = ("npy", "png")


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation tag (1 = upright) from the file's header, without decoding pixels.

    A PNG whose ``eXIf`` chunk follows the pixel data would need a full decode to see it; such files are
    taken as upright here (the PNG specification places ``eXIf`` before the pixel data).
    """
    if img.format == "PNG" and "exif" not in img.info:
        return 1
    return int(img.getexif().get(EXIF_ORIENTATION) or 1)


def _message(e: Exception) -> str:
    """The error's message without the repr of an in-memory file PIL puts in it (an address that differs
    from run to run: reject reasons must be the same bytes for the same input)."""
    return re.sub(r"<_io\.\w+ object at 0x[0-9a-f]+>", "the image data", str(e))


def probe_image(path: str | os.PathLike | IO[bytes]) -> MediaMeta:
    """Size from the header as the image is shown (after its EXIF orientation, which HF's ``load_image``
    applies too), plus PIL's structural check; no pixel decode. ``path`` may be an open seekable binary file
    (a remote one is read in ranges: only the header blocks are fetched)."""
    try:
        with Image.open(path) as img:
            img.verify()  # must come straight after open; the image cannot be used afterwards
        if hasattr(path, "seek"):
            path.seek(0)
        with Image.open(path) as img:
            width, height = img.size
            if exif_orientation(img) in SWAPS_SIDES:
                width, height = height, width
    except MediaError:
        raise  # the bytes could not be fetched (a remote file read in ranges): its own reason
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise MediaError(f"unreadable image: {type(e).__name__}: {_message(e)}") from None
    if width <= 0 or height <= 0:
        raise MediaError(f"image has a zero side ({width}x{height})")
    return MediaMeta(kind="image", width=width, height=height)


def load_image(
    path: str | os.PathLike | IO[bytes],
    target_hw: tuple[int, int] | None = None,
    *,
    views: tuple[tuple[int, int, int, int], ...] | None = None,
    resample: str | None = None,
) -> np.ndarray:
    """Decoded RGB uint8 [H, W, 3] turned upright by its EXIF orientation (as HF's ``load_image``), resized
    to ``target_hw`` = (height, width) when given.

    ``views``: (top, left, bottom, right) boxes of the upright image, each cut from the original pixels and
    resized on its own to ``target_hw``: uint8 [len(views), H, W, 3]. ``resample``: a PIL resampling name
    (default ``RESAMPLE``)."""
    try:
        flt = RESAMPLE if resample is None else Image.Resampling[resample.upper()]
    except KeyError:
        raise MediaError(f"unknown resampling filter {resample!r}") from None
    try:
        with Image.open(path) as img:
            if exif_orientation(img) != 1:  # upright, as HF's load_image shows it
                img = ImageOps.exif_transpose(img)
            if img.mode != "RGB":  # convert() of an RGB image would only copy every pixel once more
                img = img.convert("RGB")
            if views is not None:
                return _image_views(img, views, target_hw, flt)
            if target_hw is not None and (img.height, img.width) != tuple(target_hw):
                img = img.resize((target_hw[1], target_hw[0]), resample=flt)
            return np.asarray(img, dtype=np.uint8)  # already a fresh (read-only) copy of PIL's pixels
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise MediaError(f"image decode failed: {type(e).__name__}: {_message(e)}") from None


def _image_views(
    img: Image.Image,
    views: tuple[tuple[int, int, int, int], ...],
    target_hw: tuple[int, int] | None,
    flt: Image.Resampling,
) -> np.ndarray:
    """uint8 [V, H, W, 3]: each box of ``img`` cut out and resized to ``target_hw``."""
    if not views or target_hw is None:
        raise MediaError("an image stored as views needs boxes and a target size")
    out = np.empty((len(views), target_hw[0], target_hw[1], 3), dtype=np.uint8)
    for k, (top, left, bottom, right) in enumerate(views):
        if not (0 <= top < bottom <= img.height and 0 <= left < right <= img.width):
            raise MediaError(f"view {k} box {(top, left, bottom, right)} lies outside the {img.height}x{img.width} image")
        view = img if (top, left, bottom, right) == (0, 0, img.height, img.width) else img.crop((left, top, right, bottom))
        if (view.height, view.width) != tuple(target_hw):
            view = view.resize((target_hw[1], target_hw[0]), resample=flt)
        out[k] = np.asarray(view, dtype=np.uint8)
    return out


def encode_image(pixels: np.ndarray, encoding: str = "npy") -> tuple[str, bytes]:
    """(extension, bytes) of an RGB uint8 image; both encodings are lossless."""
    buf = io.BytesIO()
    if encoding == "npy":
        # The bytes np.save writes, with one copy of the pixels instead of three (photos are megabytes).
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(pixels))
        return encoding, b"".join((buf.getvalue(), memoryview(pixels).cast("B")))
    if encoding == "png":
        Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
    else:
        raise ValueError(f"unknown image encoding {encoding!r}; choose from {IMAGE_ENCODINGS}")
    return encoding, buf.getvalue()
