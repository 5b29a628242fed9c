"""Bytes <-> packed rows: ``.npy`` parts (never pickled) and one ``meta.json`` per row; media payloads
read as zero-copy views, or described from their headers alone."""

from __future__ import annotations

import functools
import io
import json
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .contract import (
    BOUNDARY_PARTS,
    DIGESTS_KEY,
    META_PART,
    OPTIONAL_TOKEN_PARTS,
    TOKEN_PARTS,
    MediaItem,
    PackedRowArrays,
    content_digests,
    part_name,
)
from .file_payload import FilePayload


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def load_npy(data: bytes) -> np.ndarray:
    """The array of an ``.npy`` buffer, as a writeable copy (no pickle)."""
    return view_npy(data).copy()


def encode_row(
    row: PackedRowArrays,
    media_payloads: Mapping[str, bytes | FilePayload],
    media_digests: Mapping[str, str] | None = None,
) -> dict[str, bytes | FilePayload]:
    """Tar parts of a row: meta.json first (small, readable), then arrays, then media (a payload read from a
    sample store stays a ``FilePayload``: the shard writer copies it from its file). ``media_digests``: the
    parts' ``media_digest`` where already computed (``content_digests``' ``known``)."""
    meta = {**row.meta(), DIGESTS_KEY: content_digests(row, media_payloads, media_digests)}
    parts = {META_PART: json.dumps(meta, separators=(",", ":")).encode()}
    for name, arr in row.arrays().items():
        parts[part_name(name)] = npy_bytes(arr)
    for m in row.media:
        parts[m.part] = media_payloads[m.part]
    return parts


def decode_row(parts: Mapping[str, bytes]) -> tuple[PackedRowArrays, dict]:
    """A row from its tar parts, and its parsed meta.json. Media payloads stay in ``parts``."""
    meta = json.loads(parts[META_PART])
    arrays = {name: load_npy(parts[part_name(name)]) for name in TOKEN_PARTS + BOUNDARY_PARTS}
    for name in OPTIONAL_TOKEN_PARTS:
        if part_name(name) in parts:
            arrays[name] = load_npy(parts[part_name(name)])
    row = PackedRowArrays(
        **arrays,
        sample_ids=list(meta["sample_ids"]),
        media=[MediaItem.from_json(m) for m in meta.get("media", [])],
    )
    return row, meta


# ---- media payloads: zero-copy views and header-only descriptions ----


NPY_HEADER_MAX = 65536 + 12  # an .npy header (magic, version, length, dict) is under 64 KiB by format


@dataclass(frozen=True)
class ArrayHeader:
    """What an ``.npy`` header says: element type, shape, and where the data starts in the buffer."""

    dtype: np.dtype
    shape: tuple[int, ...]
    data_offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def npy_header(data: bytes | memoryview, offset: int = 0) -> ArrayHeader:
    """Parse the ``.npy`` header at ``data[offset:]`` without touching the array data.

    Raises ValueError for a non-npy buffer, an object dtype (would need pickle) or Fortran order.
    """
    view = memoryview(data)
    # The header's own bytes (magic, version, length, dict): rows repeat the same few headers (every token
    # part of a dataset has one shape), so each distinct header is parsed once (numpy parses the dict
    # with ``ast.literal_eval``, ~0.15 ms a part, more than reading it).
    if bytes(view[offset : offset + 6]) == b"\x93NUMPY" and len(view) >= offset + 12:
        major = view[offset + 6]
        length = (
            int.from_bytes(view[offset + 8 : offset + 10], "little")
            if major == 1
            else int.from_bytes(view[offset + 8 : offset + 12], "little")
        )
        start = 10 if major == 1 else 12
        header = bytes(view[offset : offset + start + length])
    else:
        header = bytes(view[offset : offset + NPY_HEADER_MAX])
    dtype, shape, size = _parse_npy_header(header)
    return ArrayHeader(dtype=dtype, shape=shape, data_offset=offset + size)


@functools.lru_cache(maxsize=4096)
def _parse_npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, header size) of an ``.npy`` header's bytes; ValueError as ``npy_header`` says."""
    fp = io.BytesIO(header)
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    except ValueError as e:
        raise ValueError(f"not an npy payload: {e}") from None
    if dtype.hasobject:
        raise ValueError("npy payload holds Python objects (pickle is never loaded)")
    if fortran and len(shape) > 1:
        raise ValueError("npy payload is in Fortran order (omnipack writes C order)")
    return dtype, tuple(int(s) for s in shape), fp.tell()


def view_npy(data: bytes | memoryview, offset: int = 0) -> np.ndarray:
    """The array of an ``.npy`` buffer as a read-only view of ``data`` (no copy, no pickle)."""
    h = npy_header(data, offset)
    count = int(np.prod(h.shape, dtype=np.int64))
    if h.data_offset + h.nbytes > len(data):
        raise ValueError(
            f"npy payload truncated: header says {h.nbytes} data bytes, {len(data) - h.data_offset} present"
        )
    return np.frombuffer(data, dtype=h.dtype, count=count, offset=h.data_offset).reshape(h.shape)


_ZIP_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature ... name length, extra length (30 bytes)


def stored_member_offset(data: bytes | memoryview, info: zipfile.ZipInfo) -> int:
    """Where an uncompressed zip member's bytes start (its local header's name/extra lengths may differ
    from the central directory's)."""
    fields = _ZIP_LOCAL_HEADER.unpack_from(data, info.header_offset)
    if fields[0] != b"PK\x03\x04":
        raise ValueError(f"npz member {info.filename!r}: bad local header")
    return info.header_offset + _ZIP_LOCAL_HEADER.size + fields[-2] + fields[-1]


def view_npz(data: bytes) -> dict[str, np.ndarray]:
    """Arrays of an ``.npz`` buffer: stored (uncompressed) members as zero-copy views, deflated ones inflated."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type == zipfile.ZIP_STORED:
                start = stored_member_offset(data, info)
                out[name] = view_npy(memoryview(data)[start : start + info.file_size])
            else:
                out[name] = view_npy(z.read(info))
    return out
