"""Shape and dtype of a stored media part read from its header alone, one small reader per format.

``omnipack verify`` checks every payload's exact stored size against its plan; reading headers instead of
decoding pixels keeps that near the cost of reading the bytes. Each reader returns the array the loader
would decode the part to: ``{array name: (shape, dtype)}`` (``""`` names a single-array part).
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Callable

import numpy as np

from .codec import NPY_HEADER_MAX, stored_member_offset
from .codec import npy_header as codec_npy_header

Header = dict[str, tuple[tuple[int, ...], np.dtype]]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# PNG colour type -> samples per pixel (palette images decode to RGB).
PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}
# JPEG start-of-frame markers (baseline, progressive, lossless, ...); C4, C8 and CC are not frames.
JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class HeaderError(ValueError):
    """A payload whose header cannot be read."""


def npy_header(data: bytes) -> Header:
    """``.npy``: the array header (magic, version, dict) at the start of the file; the part must hold
    exactly the data bytes the header announces."""
    h = codec_npy_header(data)
    if h.data_offset + h.nbytes != len(data):
        raise HeaderError(f"npy header says {h.nbytes} data bytes, the part holds {len(data) - h.data_offset}")
    return {"": (h.shape, h.dtype)}


def npz_header(data: bytes) -> Header:
    """``.npz``: each member's npy header, read in place for stored members; a deflated member is inflated
    only up to its header."""
    out: Header = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            if info.compress_type == zipfile.ZIP_STORED:
                start = stored_member_offset(data, info)
                h = codec_npy_header(data, start)
                if h.data_offset + h.nbytes != start + info.file_size:
                    raise HeaderError(f"npz member {info.filename!r}: header and member size disagree")
            else:
                with z.open(info) as f:
                    h = codec_npy_header(f.read(NPY_HEADER_MAX))
            out[info.filename.removesuffix(".npy")] = (h.shape, h.dtype)
    return out


def png_header(data: bytes) -> Header:
    """``.png``: width, height, bit depth and colour type from IHDR, the first chunk."""
    if data[:8] != PNG_MAGIC or data[12:16] != b"IHDR" or len(data) < 26:
        raise HeaderError("not a PNG (no IHDR at the start)")
    w, h, depth, colour = struct.unpack(">IIBB", data[16:26])
    if colour not in PNG_CHANNELS:
        raise HeaderError(f"PNG colour type {colour} unknown")
    return {"": ((h, w, PNG_CHANNELS[colour]), np.dtype(np.uint8 if depth <= 8 else np.uint16))}


def jpeg_header(data: bytes) -> Header:
    """``.jpg``: precision, height, width and components from the first start-of-frame marker."""
    if data[:2] != b"\xff\xd8":
        raise HeaderError("not a JPEG (no SOI marker)")
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise HeaderError(f"JPEG marker expected at byte {i}")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in JPEG_SOF:
            if i + 10 > len(data):
                break
            depth, h, w, comps = struct.unpack(">BHHB", data[i + 4 : i + 10])
            return {"": ((h, w, comps), np.dtype(np.uint8 if depth <= 8 else np.uint16))}
        if marker == 0xDA:  # start of scan before any frame header
            break
        i += 2 + length
    raise HeaderError("JPEG has no start-of-frame marker")


HEADER_READERS: dict[str, Callable[[bytes], Header]] = {
    "npy": npy_header,
    "npz": npz_header,
    "png": png_header,
    "jpg": jpeg_header,
    "jpeg": jpeg_header,
}


def payload_header(part: str, data: bytes) -> Header | None:
    """The arrays a stored part decodes to, from its header; None for a format without a reader here."""
    reader = HEADER_READERS.get(part.rsplit(".", 1)[-1].lower())
    if reader is None:
        return None
    try:
        return reader(data)
    except HeaderError:
        raise
    except Exception as e:  # truncated or malformed headers surface as HeaderError with the cause
        raise HeaderError(f"{type(e).__name__}: {e}") from None


def shaped_like(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zero-cost array of ``shape`` (all elements alias one value): enough for shape-only counting."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)
