"""The packed-row data contract: what one Energon sample of an omnipack dataset holds.

One place for part names, dtypes and invariants; the writer produces it, the loader reads it and
``omnipack verify`` proves it. ``schemas/packed_row.schema.json`` documents the same contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from .file_payload import FilePayload

IGNORE_INDEX = -100
FORMAT_VERSION = 1

# Per-token arrays, each of length W (the pack width); mrope ids are [3, W].
TOKEN_PARTS = ("tokens", "labels", "loss_mask", "position_ids", "padding_mask")
BOUNDARY_PARTS = ("cu_seqlens", "cu_seqlens_padded")
OPTIONAL_TOKEN_PARTS = ("mrope_position_ids",)
META_PART = "meta.json"


def part_name(field_name: str) -> str:
    """Tar part (extension) of an array field."""
    return f"{field_name}.npy"


@dataclass
class MediaItem:
    """One media block of a row, in placeholder order.

    ``[block_start, block_end)`` is the whole expanded block in the row (markers, timestamp text and
    placeholders, which may be interleaved with other tokens, e.g. per-frame text or audio-in-video);
    ``token_start`` is the row position of its first placeholder and ``num_tokens`` how many placeholder
    tokens the block holds; ``part`` names the tar part holding its data (already at the model's target
    size / sample rate).
    """

    kind: str  # "image" | "video" | "audio"
    part: str
    sample_index: int  # index of the owning sequence within the row
    token_start: int
    num_tokens: int
    block_start: int
    block_end: int
    grid_thw: list[int] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "part": self.part,
            "sample_index": self.sample_index,
            "token_start": self.token_start,
            "num_tokens": self.num_tokens,
            "block": [self.block_start, self.block_end],
        }
        if self.grid_thw is not None:
            out["grid_thw"] = list(self.grid_thw)
        if self.info:
            out["info"] = self.info
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MediaItem:
        return cls(
            kind=d["kind"],
            part=d["part"],
            sample_index=d["sample_index"],
            token_start=d["token_start"],
            num_tokens=d["num_tokens"],
            block_start=d["block"][0],
            block_end=d["block"][1],
            grid_thw=d.get("grid_thw"),
            info=d.get("info", {}),
        )


@dataclass
class PackedRowArrays:
    """A packed THD row as numpy arrays plus JSON metadata (no media payloads)."""

    tokens: np.ndarray  # int32 [W]
    labels: np.ndarray  # int32 [W], IGNORE_INDEX where not supervised
    loss_mask: np.ndarray  # int32 [W], 1 exactly where labels != IGNORE_INDEX
    position_ids: np.ndarray  # int32 [W], restart at 0 per sequence, gaps continue last+1
    padding_mask: np.ndarray  # bool [W], True exactly on alignment / tail padding
    cu_seqlens: np.ndarray  # int32 [n+1], logical (real) boundaries
    cu_seqlens_padded: np.ndarray  # int32 [n+1], physical boundaries, last == W
    sample_ids: list[str]
    media: list[MediaItem] = field(default_factory=list)
    mrope_position_ids: np.ndarray | None = None  # int32 [3, W]
    extra_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def seq_length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seqlens(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    @property
    def seqlens_padded(self) -> np.ndarray:
        return np.diff(self.cu_seqlens_padded)

    @property
    def max_seqlen(self) -> int:
        return int(self.seqlens.max())

    @property
    def max_seqlen_padded(self) -> int:
        return int(self.seqlens_padded.max())

    def meta(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "seq_length": self.seq_length,
            "sample_ids": list(self.sample_ids),
            "max_seqlen": self.max_seqlen,
            "max_seqlen_padded": self.max_seqlen_padded,
            "num_real_tokens": int(self.seqlens.sum()),
            "media": [m.to_json() for m in self.media],
            **self.extra_meta,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        out = {name: getattr(self, name) for name in TOKEN_PARTS + BOUNDARY_PARTS}
        if self.mrope_position_ids is not None:
            out["mrope_position_ids"] = self.mrope_position_ids
        return out


DIGESTS_KEY = "digests"  # meta.json: content fingerprints recorded at write time
# A mix-up detector (the shard checksum guards the bytes): xxh3 runs near memory speed, so verify can
# redo it for every payload at little more than the cost of reading it.
DIGEST_ALGORITHM = "xxh3_64"


def _crc(chunks: list[bytes | memoryview]) -> str:
    h = xxhash.xxh3_64()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def sample_digests(row: PackedRowArrays) -> list[str]:
    """Per sample: its id, its place in the row (start, length, padded length), tokens, labels and mRoPE
    ids, so content moved to another sample, edited in place or shifted in the row no longer matches."""
    cu, cup = row.cu_seqlens.astype(np.int64), row.cu_seqlens_padded.astype(np.int64)
    out = []
    for i in range(len(cu) - 1):
        a, n, p = int(cup[i]), int(cu[i + 1] - cu[i]), int(cup[i + 1] - cup[i])
        chunks = [row.sample_ids[i].encode(), np.asarray([a, n, p], dtype="<i8").tobytes()]
        chunks += [np.ascontiguousarray(row.tokens[a : a + n], dtype="<i4").data]
        chunks += [np.ascontiguousarray(row.labels[a : a + n], dtype="<i4").data]
        if row.mrope_position_ids is not None:
            chunks += [np.ascontiguousarray(row.mrope_position_ids[:, a : a + n], dtype="<i4").data]
        out.append(_crc(chunks))
    return out


def media_digest(data: bytes | FilePayload) -> str:
    """The stored bytes of one media part (a payload read from a sample store: the xxh3 it was checked
    against, the same digest without another pass over the bytes)."""
    return data.digest if isinstance(data, FilePayload) else _crc([data])


def content_digests(
    row: PackedRowArrays, media_payloads: Mapping[str, bytes | FilePayload], known: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Fingerprints tying a row's content to the samples it names, recorded in meta.json at write time:
    ``samples[i]`` of sample i (``sample_digests``), ``media[j]`` of the stored bytes of media item j.
    ``known``: the ``media_digest`` of parts already hashed (by the sample store), by part name: reused."""
    known = known or {}
    media = [known[m.part] if m.part in known else media_digest(media_payloads[m.part]) for m in row.media]
    return {"algorithm": DIGEST_ALGORITHM, "samples": sample_digests(row), "media": media}


def row_invariant_errors(row: PackedRowArrays, align: int) -> list[str]:
    """Every broken invariant of a row, as readable messages (empty list = valid)."""
    errs: list[str] = []
    w = row.seq_length
    for name in TOKEN_PARTS:
        arr = getattr(row, name)
        if arr.shape != (w,):
            errs.append(f"{name} has shape {arr.shape}, expected ({w},)")
    if errs:
        return errs
    for name in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "cu_seqlens_padded"):
        if getattr(row, name).dtype != np.int32:
            errs.append(f"{name} dtype {getattr(row, name).dtype}, expected int32")
    if row.padding_mask.dtype != np.bool_:
        errs.append(f"padding_mask dtype {row.padding_mask.dtype}, expected bool")
    cu, cup = row.cu_seqlens.astype(np.int64), row.cu_seqlens_padded.astype(np.int64)
    n = len(row.sample_ids)
    if cu.shape != (n + 1,) or cup.shape != (n + 1,):
        return errs + [f"cu_seqlens {cu.shape} / cu_seqlens_padded {cup.shape} do not match {n} samples"]
    errs += _boundary_errors(cu, cup, w, align)
    if errs:  # the per-position checks below index by these boundaries
        return errs
    return _sequence_content_errors(row, cup, np.diff(cu))


def _boundary_errors(cu: np.ndarray, cup: np.ndarray, w: int, align: int) -> list[str]:
    """Broken invariants of a row's logical (``cu``) and padded (``cup``) sequence boundaries."""
    errs: list[str] = []
    if cu[0] != 0 or cup[0] != 0:
        errs.append("boundaries must start at 0")
    lens, plens = np.diff(cu), np.diff(cup)
    if (lens <= 0).any():
        errs.append("cu_seqlens not strictly increasing")
    if (plens <= 0).any():
        errs.append("cu_seqlens_padded not strictly increasing")
    if cup[-1] != w:
        errs.append(f"cu_seqlens_padded ends at {cup[-1]}, expected W={w}")
    if (lens > plens).any():
        errs.append("a logical length exceeds its padded length")
    if (plens % align).any():
        errs.append(f"padded lengths {plens[plens % align != 0].tolist()} not multiples of align={align}")
    return errs


def _sequence_content_errors(row: PackedRowArrays, cup: np.ndarray, lens: np.ndarray) -> list[str]:
    """Broken invariants of padding, positions, labels and media within valid sequence boundaries."""
    errs: list[str] = []
    w = row.seq_length
    starts, plens = cup[:-1], np.diff(cup)
    expected_pad = np.ones(w, dtype=bool)
    expected_pos = np.empty(w, dtype=np.int64)
    for s, length, plen in zip(starts, lens, plens, strict=True):
        expected_pad[s : s + length] = False
        expected_pos[s : s + plen] = np.arange(plen)
    if not np.array_equal(row.padding_mask, expected_pad):
        errs.append("padding_mask is not exactly the alignment gaps")
    if not np.array_equal(row.position_ids.astype(np.int64), expected_pos):
        errs.append("position_ids do not restart at 0 per sequence (gaps continuing last+1)")
    supervised = row.labels != IGNORE_INDEX
    if not np.array_equal(supervised, row.loss_mask.astype(bool)):
        errs.append("loss_mask disagrees with labels != -100")
    if not is_any_of(row.loss_mask, (0, 1)).all():
        errs.append("loss_mask holds values other than 0/1")
    if supervised[row.padding_mask].any():
        errs.append("a padding position is supervised")
    sup_idx = np.flatnonzero(supervised)
    if len(sup_idx) and (sup_idx[-1] + 1 >= w or (row.labels[sup_idx] != row.tokens[sup_idx + 1]).any()):
        errs.append("a label is not the next token of its sequence")
    last = (starts + lens - 1).astype(np.int64)
    if supervised[last].any():
        errs.append("the last token of a sequence has a label (it would predict the next sample)")
    for i, m in enumerate(row.media):
        a, b = cup[m.sample_index], cup[m.sample_index] + lens[m.sample_index]
        if not (a <= m.block_start <= m.token_start < m.block_end <= b):
            errs.append(f"media {i} ({m.part}) lies outside its sequence {m.sample_index}")
    return errs


def media_placeholder_errors(
    row: PackedRowArrays,
    placeholder_ids: dict[str, list[int]],
    merge_sizes: dict[str, int] | None = None,
) -> list[str]:
    """Every media block whose placeholder tokens disagree with its recorded count or grid.

    ``placeholder_ids`` maps a media kind to the token ids that count as its features (a video with
    its own audio counts video and audio pads). Each block's placeholders are counted over its extent
    ``[block_start, block_end)``, so interleaved layouts (per-frame text, audio-in-video) need no special
    case; and every placeholder token of the row must belong to some block. ``merge_sizes`` (optional)
    maps a kind with a patch grid to its spatial merge size: ``prod(grid_thw) / merge**2`` must equal the
    block's vision features. Kinds missing from ``placeholder_ids`` are not checked (the caller says so).
    """
    errs: list[str] = []
    tokens = row.tokens

    def who(i: int, m: MediaItem) -> str:
        sid = row.sample_ids[m.sample_index] if 0 <= m.sample_index < len(row.sample_ids) else "?"
        return f"media {i} ({m.kind} {m.part}, sample {sid})"

    for i, m in enumerate(row.media):
        ids = placeholder_ids.get(m.kind)
        if ids is None:
            continue
        a, b = int(m.block_start), int(m.block_end)
        if not 0 <= a <= m.token_start < b <= len(tokens):
            errs.append(f"{who(i, m)}: block [{a}, {b}) / first placeholder {m.token_start} outside the row")
            continue
        found = int(np.isin(tokens[a:b], ids).sum())
        if found != m.num_tokens:
            errs.append(
                f"{who(i, m)}: {found} placeholder tokens in its block [{a}, {b}), recorded {m.num_tokens}"
            )
        if tokens[m.token_start] not in ids:
            errs.append(f"{who(i, m)}: token {m.token_start} is not a placeholder")
        merge = (merge_sizes or {}).get(m.kind)
        extra = int((m.info or {}).get("audio_num_tokens") or 0)
        if m.grid_thw is not None and merge:
            expected = int(np.prod(m.grid_thw)) // (merge * merge)
            if expected != m.num_tokens - extra:
                errs.append(
                    f"{who(i, m)}: grid_thw {list(m.grid_thw)} / merge {merge}^2 gives {expected} "
                    f"features, block has {m.num_tokens - extra}"
                )
    checked = [m for m in row.media if m.kind in placeholder_ids]
    # Every placeholder id of the profile, also of kinds this row has no media of (a stray one is an error).
    known = sorted({int(t) for ids in placeholder_ids.values() for t in ids})
    total = int(np.isin(tokens, known).sum()) if known else 0
    recorded = sum(int(m.num_tokens) for m in checked)
    if total != recorded:
        errs.append(f"row holds {total} placeholder tokens but its media items account for {recorded}")
    return errs


def placeholder_label_errors(row: PackedRowArrays, placeholder_ids: dict[str, list[int]]) -> list[str]:
    """Supervision that touches media placeholders, naming the sample: a label (or loss) on a placeholder
    position (the model would be trained to predict from an embedding slot) and a label whose target is a
    placeholder id (it would be trained to emit one)."""
    known = sorted({int(t) for ids in placeholder_ids.values() for t in ids})
    if not known:
        return []
    errs: list[str] = []
    supervised = (row.labels != IGNORE_INDEX) | (row.loss_mask != 0)
    for what, bad in (
        ("supervised on a placeholder token", supervised & is_any_of(row.tokens, known)),
        ("a label whose target is a placeholder token", is_any_of(row.labels, known)),
    ):
        where = np.flatnonzero(bad)
        if len(where):
            seq = np.searchsorted(row.cu_seqlens_padded, where, side="right") - 1
            ids = sorted({row.sample_ids[i] for i in seq if 0 <= i < len(row.sample_ids)})
            errs.append(f"{what} at positions {where[:5].tolist()} (samples {ids})")
    return errs


def is_any_of(values: np.ndarray, members: Sequence[int]) -> np.ndarray:
    """``np.isin(values, members)`` for a handful of members (placeholder ids, 0/1): one comparison per
    member. The loader runs it on every row, where ``np.isin`` picks its lookup-table method for ids that
    sit close together and spends ~0.3 ms a call setting it up."""
    if len(members) > 16:
        return np.isin(values, np.asarray(members))
    out = np.zeros(values.shape, dtype=bool)
    for m in members:
        out |= values == m
    return out


def row_contract_errors(
    row: PackedRowArrays, align: int = 1, placeholder_ids: dict[str, list[int]] | None = None
) -> list[str]:
    """The per-row contract a trainer relies on (what the loader checks on every row, cheaply):
    ``row_invariant_errors`` (shapes, dtypes, boundaries, padding mask, labels/loss mask) plus the mRoPE
    ids' shape and dtype and, with ``placeholder_ids``, ``placeholder_label_errors``."""
    errs = row_invariant_errors(row, align)
    mrope = row.mrope_position_ids
    if mrope is not None and (mrope.shape != (3, row.seq_length) or mrope.dtype != np.int32):
        errs.append(
            f"mrope_position_ids is {mrope.dtype} {mrope.shape}, expected int32 (3, {row.seq_length})"
        )
    if placeholder_ids and row.tokens.shape == row.labels.shape == row.loss_mask.shape:
        errs += placeholder_label_errors(row, placeholder_ids)
    return errs
