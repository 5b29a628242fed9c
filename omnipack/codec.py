"""Bytes <-> packed rows: ``.npy`` parts (never pickled) and one ``meta.json`` per row."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping

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


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def encode_row(row: PackedRowArrays, media_payloads: Mapping[str, bytes]) -> dict[str, bytes]:
    """Tar parts of a row: meta.json first (small, readable), then arrays, then media."""
    meta = {**row.meta(), DIGESTS_KEY: content_digests(row, media_payloads)}
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
