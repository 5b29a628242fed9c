"""``omnipack verify DATASET``: prove a written dataset still satisfies the packed-row contract.

Each shard is read once (checksum, tar index and every row in one sequential pass), shards in parallel;
the row invariants come from ``omnipack.dataset.contract`` so the writer and this tool cannot drift apart.
Every failure names its shard, row and sample(s); the exit status is non-zero on any failure.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..alignment import ParallelLayout
from ..dataset.accounting import read_ledger
from ..dataset.contract import (
    BOUNDARY_PARTS,
    DIGEST_ALGORITHM,
    DIGESTS_KEY,
    FORMAT_VERSION,
    IGNORE_INDEX,
    META_PART,
    OPTIONAL_TOKEN_PARTS,
    TOKEN_PARTS,
    MediaItem,
    media_digest,
    media_placeholder_errors,
    part_name,
    placeholder_label_errors,
    row_invariant_errors,
    sample_digests,
)
from ..dataset.meta import NV_META
from ..dataset.payload_header import Header, HeaderError, payload_header, shaped_like
from ..dataset.reader import Dataset, ShardReader, default_workers, map_shards, open_dataset, read_index
from ..dataset.role_spans import first_outside, read_role_spans, true_runs
from ..dataset.root import (
    ROOT_KEY,
    Leaf,
    dataset_leaves,
    leaf_differences,
    merkle_root,
    shard_algorithm,
)
from ..executors import EXECUTORS
from ..loader.media import decode_payload
from ..media.audio_storage import STORED_AUDIO_DTYPES
from ..pipeline import check_rank
from ..profiles import get_profile
from ..profiles.base import MediaPlan, MediaSpan
from ..profiles.hf_config import dataset_placeholder_ids
from ..stages.storage import STAGES_DIR, local_files
from .verify_source import SOURCE_CHECK, run_source_check

# (name, what it proves), in report order.
CHECKS: list[tuple[str, str]] = [
    ("metadata", "omnipack.json, .info.json and split.yaml readable; align matches the parallel layout"),
    ("shard-files", "shards named by omnipack.json, .info.json and split.yaml agree and exist, no strays"),
    ("checksums", "each shard's size and checksum (xxh3-128, or sha256) match those recorded at write time"),
    ("tar-index", "each .tar.idx holds the offset of every row's first header, then the data end"),
    ("shard-counts", "rows per shard match .info.json and omnipack.json; row keys unique"),
    (
        "splits",
        "split.yaml puts every shard in exactly one split, the one omnipack.json records, and excludes "
        "nothing; rows per split match omnipack.json's rows_by_split",
    ),
    ("row-parts", "every row has all required parts and decodes; each media part present, none stray"),
    ("row-meta", "meta.json agrees with the arrays (W, samples, real tokens, max seqlens, version)"),
    (
        "row-contract",
        "boundaries, alignment, padding mask, position resets, labels (omnipack.dataset.contract); no label on or "
        "targeting a placeholder; mRoPE ids as the profile computes them",
    ),
    (
        "content",
        "each sample's tokens, labels, boundaries and mRoPE ids, and each media payload, match the "
        "fingerprints recorded at write time",
    ),
    (
        "media",
        "placeholder tokens per media block match num_tokens and grid_thw; each payload's stored shape is "
        "exactly its plan's (frames, size, audio samples) and gives num_tokens features",
    ),
    (
        "accounting",
        "every input sample index is packed or rejected exactly once, where the dataset's accounting ledger "
        "(.nv-meta/accounting.parquet) says: its row and position, or its reject as in rejects.jsonl",
    ),
    (
        "roles",
        "no token outside an assistant turn is trained on: every supervised label targets a token inside "
        "an assistant turn of its sample, as recorded at measure time from the chat template's turn markers "
        "(.nv-meta/role_spans.parquet)",
    ),
    (
        "root",
        "with --expect-root, the root digest recomputed from every file (omnipack.dataset.root) is the one "
        "its producer printed; without, the root omnipack.json records is that of its recorded leaves",
    ),
]
CHECK_NAMES = [c for c, _ in CHECKS]
MAX_SHOWN = 20  # failures printed per check (all are in --json)
REQUIRED_PARTS = [META_PART] + [part_name(n) for n in TOKEN_PARTS + BOUNDARY_PARTS]
KNOWN_PARTS = set(REQUIRED_PARTS) | {part_name(n) for n in OPTIONAL_TOKEN_PARTS}


@dataclass
class CheckResult:
    name: str
    description: str
    failures: list[str] = field(default_factory=list)
    skipped: str | None = None  # why the check could not run
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "fail" if self.failures else ("skip" if self.skipped else "pass")


@dataclass(frozen=True)
class ShardJob:
    """Everything a worker needs to verify one shard (plain data: it crosses process boundaries)."""

    root: str
    shard: str
    first_row: int  # global index of the shard's first row
    seq_length: int
    align: int
    expected_count: int | None
    recorded: dict[str, Any] | None  # omnipack.json's record: count, num_bytes, sha256
    placeholder_ids: dict[str, list[int]] | None
    merge_sizes: dict[str, int]
    profile: str | None = None  # JSON {name, options}: recompute mRoPE, count payload features
    payloads: bool = True  # check stored media: exact shapes from headers, fingerprints, features
    mrope: bool | None = None  # omnipack.json says rows carry mrope_position_ids (None: not recorded)
    checksums: bool = True  # recompute each shard's checksum (the costliest part of reading a shard)
    sha256: bool = False  # recompute the sha256 rather than the fast xxh3-128 (always for shards without one)


@dataclass
class RowSeen:
    """What accounting needs of one row: its key, where it is, and the samples it names."""

    key: str
    where: str
    sample_ids: list[str]
    # the roles check: [start, end) runs of supervised positions (label or loss mask) in row coordinates,
    # and the samples' physical boundaries (cu_seqlens_padded); None where the row's boundaries are unusable
    supervised: np.ndarray | None = None
    bounds: np.ndarray | None = None


@dataclass
class ShardReport:
    shard: str
    rows: int = 0
    failures: dict[str, list[str]] = field(default_factory=dict)
    rows_seen: list[RowSeen] = field(default_factory=list)
    rows_without_digests: list[str] = field(default_factory=list)  # where each such row is
    notes: set[str] = field(default_factory=set)  # checks that could not run
    leaf: Leaf | None = None  # (shard, size, "algorithm:hex") when its checksum was computed: a root leaf

    def fail(self, check: str, msg: str) -> None:
        self.failures.setdefault(check, []).append(msg)


def _describe(job: ShardJob, local: int, key: str, sample_ids: list[str]) -> str:
    ids = ", ".join(sample_ids[:3]) + (f", … (+{len(sample_ids) - 3})" if len(sample_ids) > 3 else "")
    return f"{job.shard} row {local} (key {key}, global row {job.first_row + local}; samples {ids})"


def _plan_of(m: MediaItem) -> Any:
    return MediaPlan.from_json({"kind": m.kind, "num_tokens": m.num_tokens, "grid_thw": m.grid_thw, **m.info})


def _mrope_errors(profile: Any, row: Any) -> list[str]:
    """mRoPE ids recomputed from each sample's tokens and media plans, and the gap rule of the writer."""
    stored = row.mrope_position_ids
    cu, cup = row.cu_seqlens.astype(np.int64), row.cu_seqlens_padded.astype(np.int64)
    errs = []
    for i, sid in enumerate(row.sample_ids):
        a, n, p = int(cup[i]), int(cu[i + 1] - cu[i]), int(cup[i + 1] - cup[i])
        try:
            spans = [
                MediaSpan(_plan_of(m), m.block_start - a, m.block_end - a, m.token_start - a, m.num_tokens)
                for m in row.media
                if m.sample_index == i
            ]
            expected = profile.mrope_position_ids(row.tokens[a : a + n], spans)
        except Exception as e:
            errs.append(f"sample {sid}: mRoPE ids cannot be recomputed: {type(e).__name__}: {e}")
            continue
        if expected is None:
            errs.append(f"sample {sid}: the profile has no mRoPE, yet the row stores mrope_position_ids")
            return errs
        got = stored[:, a : a + n]
        if not np.array_equal(got, expected):
            col = int(np.flatnonzero((got != expected).any(axis=0))[0])
            errs.append(
                f"sample {sid}: mrope_position_ids at row position {a + col} are {got[:, col].tolist()}, "
                f"the profile computes {expected[:, col].tolist()}"
            )
            continue
        nxt = int(got.max()) + 1 if n else 0
        gap = np.arange(nxt, nxt + p - n)
        if not (stored[:, a + n : a + p] == gap).all():
            errs.append(f"sample {sid}: mrope_position_ids in its padding do not continue from {nxt}")
    return errs


def _expected_arrays(m: MediaItem) -> dict[str, tuple[tuple[int, ...], tuple[np.dtype, ...]]] | None:
    """The arrays a media item's plan says its payload holds (exact shape, the dtypes it may have); None
    when the plan lacks sizes."""
    info = m.info or {}
    hw = info.get("target_hw")
    n_audio = info.get("num_audio_samples")
    stored = (info.get("info") or {}).get("stored_arrays")
    if stored:  # a family that stores arrays of its own (``ModelProfile.store_media``) records their shapes
        return {k: (tuple(shape), (np.dtype(dtype),)) for k, (shape, dtype) in stored.items()}
    if m.kind == "image":
        views = len(info.get("image_views") or ())
        shape = (*hw, 3) if views <= 1 else (views, *hw, 3)  # one stored view reads as one frame
        return None if hw is None else {"frames": (shape, (np.dtype(np.uint8),))}
    if m.kind == "video":
        frames = info.get("frame_indices")
        if hw is None or frames is None:
            return None
        out = {"frames": ((len(frames), *hw, 3), (np.dtype(np.uint8),))}
        if info.get("audio_num_tokens") and n_audio:
            out["audio"] = ((int(n_audio),), STORED_AUDIO_DTYPES)
        return out
    if m.kind == "audio":
        return None if not n_audio else {"audio": ((int(n_audio),), STORED_AUDIO_DTYPES)}
    return None


def _stored_arrays(kind: str, header: Header) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """A header's arrays under the names the plan uses (a single array is the frames or the audio)."""
    if set(header) != {""}:
        return dict(header)
    shape, dtype = header[""]
    if kind == "audio":
        return {"audio": (shape, dtype)}
    if kind == "image" and len(shape) == 4 and shape[0] == 1:
        shape = shape[1:]  # one stored frame
    return {"frames": (shape, dtype)}


def _payload_errors(profile: Any, m: MediaItem, part: str, data: bytes) -> list[str]:
    """A payload's exact stored shapes against its plan, and the features those shapes give."""
    header = payload_header(part, data)
    if header is None:  # no header reader for this format: decode it

        decoded = decode_payload(part, data)
        items = decoded.items() if isinstance(decoded, dict) else [("", decoded)]
        header = {k: (tuple(v.shape), v.dtype) for k, v in items}
    stored = _stored_arrays(m.kind, header)
    errs = []
    expected = _expected_arrays(m)
    if expected is not None:
        for name in sorted(set(expected) | set(stored)):
            if name not in stored:
                errs.append(f"stores no {name!r}, the plan needs {expected[name][0]}")
            elif name not in expected:
                errs.append(f"stores {name!r} {stored[name][0]} that the plan does not have")
            elif stored[name][0] != expected[name][0] or stored[name][1] not in expected[name][1]:
                (s_shape, s_dtype), (e_shape, e_dtypes) = stored[name], expected[name]
                e_dtype = " or ".join(str(d) for d in e_dtypes)
                errs.append(f"{name} stored {s_shape} {s_dtype}, the plan says {e_shape} {e_dtype}")
    if profile is not None:
        fake = {k: shaped_like(*v) for k, v in stored.items()}
        payload = next(iter(fake.values())) if len(fake) == 1 and m.kind != "video" else fake
        features = profile.inputs().feature_count(m, payload)
        if features != m.num_tokens:
            errs.append(f"stored payload gives {features} features, block has {m.num_tokens} placeholders")
    return errs


def _check_content(job: ShardJob, row: Any, meta: dict, raw: Any, where: str, rep: ShardReport) -> None:
    """Fingerprints recorded at write time against the row as stored."""
    digests = meta.get(DIGESTS_KEY)
    if digests is None:
        rep.rows_without_digests.append(where)
        return
    if not isinstance(digests, dict) or digests.get("algorithm") != DIGEST_ALGORITHM:
        rep.fail("content", f"{where}: meta.json digests unusable (algorithm {DIGEST_ALGORITHM} expected)")
        return
    recorded = digests.get("samples") or []
    actual = sample_digests(row)
    if len(recorded) != len(actual):
        rep.fail("content", f"{where}: {len(recorded)} sample fingerprints for {len(actual)} samples")
    for sid, r, a in zip(row.sample_ids, recorded, actual, strict=False):
        if r != a:
            rep.fail(
                "content",
                f"{where}: sample {sid}: tokens/labels/boundaries/mRoPE differ from what was written "
                f"(fingerprint {a}, recorded {r})",
            )
    if not job.payloads:
        return
    recorded = digests.get("media") or []
    if len(recorded) != len(row.media):
        rep.fail("content", f"{where}: {len(recorded)} media fingerprints for {len(row.media)} media items")
    for i, (m, r) in enumerate(zip(row.media, recorded, strict=False)):
        if m.part in raw.parts and media_digest(raw.parts[m.part]) != r:
            sid = row.sample_ids[m.sample_index] if 0 <= m.sample_index < len(row.sample_ids) else "?"
            rep.fail(
                "content",
                f"{where}: media {i} ({m.kind} {m.part}) of sample {sid}: bytes differ from what was written",
            )


def _check_row(job: ShardJob, local: int, raw: Any, rep: ShardReport) -> None:
    missing = [p for p in REQUIRED_PARTS if p not in raw.parts]
    if missing:
        rep.fail("row-parts", f"{job.shard} row {local} (key {raw.key}): missing parts {missing}")
        return
    try:
        row, meta = raw.decode()
    except Exception as e:  # any decode failure is a finding, not a crash
        rep.fail(
            "row-parts", f"{job.shard} row {local} (key {raw.key}): cannot decode: {type(e).__name__}: {e}"
        )
        return
    where = _describe(job, local, raw.key, row.sample_ids)
    rep.rows_seen.append(RowSeen(raw.key, where, list(row.sample_ids)))
    _check_parts(job, row, raw, where, rep)
    mrope_ok = _check_meta(job, row, meta, where, rep)
    errs = row_invariant_errors(row, job.align)
    for e in errs:
        rep.fail("row-contract", f"{where}: {e}")
    shape_ok = len(row.cu_seqlens) == len(row.sample_ids) + 1 == len(row.cu_seqlens_padded)
    if not shape_ok or any("shape" in e for e in errs):
        return  # later checks index by the boundaries
    seen = rep.rows_seen[-1]
    seen.supervised = true_runs((row.labels != IGNORE_INDEX) | (row.loss_mask != 0))
    seen.bounds = row.cu_seqlens_padded.astype(np.int64)
    for name, expected in (
        ("seq_length", row.seq_length),
        ("max_seqlen", row.max_seqlen),
        ("max_seqlen_padded", row.max_seqlen_padded),
        ("num_real_tokens", int(row.seqlens.sum())),
    ):
        if name in meta and meta[name] != expected:
            rep.fail("row-meta", f"{where}: meta.json {name}={meta[name]}, the arrays say {expected}")
    _check_content(job, row, meta, raw, where, rep)
    profile = _check_tokens(job, row, where, rep, mrope_ok and not errs)
    if job.payloads:
        _check_payloads(profile, row, raw, where, rep)


def _check_parts(job: ShardJob, row: Any, raw: Any, where: str, rep: ShardReport) -> None:
    """Each media part present, none stray, none shared; mRoPE ids present as omnipack.json says."""
    media_parts = {m.part for m in row.media}
    absent = sorted(p for p in media_parts if p not in raw.parts)
    stray = sorted(p for p in raw.parts if p not in KNOWN_PARTS and p not in media_parts)
    if absent:
        rep.fail("row-parts", f"{where}: media parts missing: {absent}")
    if stray:
        rep.fail("row-parts", f"{where}: parts not named by meta.json: {stray}")
    if len(media_parts) != len(row.media):
        rep.fail("row-parts", f"{where}: two media items share a part")
    if job.mrope is not None and (row.mrope_position_ids is not None) != job.mrope:
        has = "has" if row.mrope_position_ids is not None else "lacks"
        rep.fail("row-parts", f"{where}: {has} mrope_position_ids, omnipack.json says mrope={job.mrope}")


def _check_meta(job: ShardJob, row: Any, meta: dict, where: str, rep: ShardReport) -> bool:
    """meta.json's keys, width and version; whether the mRoPE ids (if any) have the row's shape."""
    w = row.seq_length
    if w != job.seq_length:
        rep.fail("row-meta", f"{where}: W={w}, dataset seq_length={job.seq_length}")
    for name in ("seq_length", "max_seqlen", "max_seqlen_padded", "num_real_tokens", "format_version"):
        if name not in meta:
            rep.fail("row-meta", f"{where}: meta.json lacks {name!r}")
    if meta.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        rep.fail("row-meta", f"{where}: format_version {meta.get('format_version')} != {FORMAT_VERSION}")
    mrope_ok = row.mrope_position_ids is None or row.mrope_position_ids.shape == (3, w)
    if not mrope_ok:
        rep.fail(
            "row-contract", f"{where}: mrope_position_ids shape {row.mrope_position_ids.shape} != (3, {w})"
        )
    return mrope_ok


def _check_tokens(job: ShardJob, row: Any, where: str, rep: ShardReport, mrope_checkable: bool) -> Any:
    """Placeholders never supervised and counted per block; mRoPE ids recomputed. Returns the profile."""
    unknown = {m.kind for m in row.media} - set(job.placeholder_ids or {})
    if unknown and job.placeholder_ids is not None:
        rep.notes.update(f"{k} blocks not counted: no placeholder id recorded for {k}" for k in unknown)
    if job.placeholder_ids is not None:  # rows without media too: a stray placeholder is an error
        for e in placeholder_label_errors(row, job.placeholder_ids):
            rep.fail("row-contract", f"{where}: {e}")
        for e in media_placeholder_errors(row, job.placeholder_ids, job.merge_sizes):
            rep.fail("media", f"{where}: {e}")
    profile = _profile(job.profile) if job.profile is not None else None
    if profile is not None and row.mrope_position_ids is not None and mrope_checkable:
        for e in _mrope_errors(profile, row):
            rep.fail("row-contract", f"{where}: {e}")
    return profile


def _check_payloads(profile: Any, row: Any, raw: Any, where: str, rep: ShardReport) -> None:
    for i, m in enumerate(row.media):
        if m.part not in raw.parts:
            continue  # reported by row-parts
        try:
            found = _payload_errors(profile, m, m.part, raw.parts[m.part])
        except (HeaderError, ValueError, OSError) as e:
            found = [f"payload unusable: {type(e).__name__}: {e}"]
        sid = row.sample_ids[m.sample_index] if 0 <= m.sample_index < len(row.sample_ids) else "?"
        for e in found:
            rep.fail("media", f"{where}: media {i} ({m.kind} {m.part}, sample {sid}): {e}")


@functools.cache
def _profile(spec: str) -> Any:
    d = json.loads(spec)
    return get_profile(d["name"], **d.get("options", {}))


def verify_shard(job: ShardJob) -> ShardReport:
    """All per-shard checks in one sequential read of the shard."""
    rep = ShardReport(job.shard)
    path = Path(job.root) / job.shard
    if not path.is_file():
        rep.fail("shard-files", f"{job.shard}: file missing")
        return rep
    algorithm = None
    if job.checksums:
        fast = not job.sha256 and (job.recorded or {}).get("xxh3_128") is not None
        algorithm = "xxh3_128" if fast else "sha256"
    reader = ShardReader(path, checksum=algorithm)
    offsets: list[int] = []
    for local, raw in enumerate(reader):
        offsets.append(raw.offset)
        _check_row(job, local, raw, rep)
    rep.rows = len(offsets)
    if reader.error:
        rep.fail("row-parts", f"{job.shard}: {reader.error}")
    if reader.duplicate_keys:
        rep.fail("shard-counts", f"{job.shard}: row keys appear twice: {reader.duplicate_keys[:5]}")

    size = path.stat().st_size
    if algorithm is not None and reader.digest is not None and not reader.error:
        rep.leaf = (job.shard, size, f"{algorithm}:{reader.digest}")  # the root check reuses it
    if job.recorded is None:
        rep.fail("checksums", f"{job.shard}: no checksum recorded in omnipack.json")
    else:
        if size != job.recorded.get("num_bytes"):
            rep.fail("checksums", f"{job.shard}: {size} bytes, recorded {job.recorded.get('num_bytes')}")
        if algorithm is not None and job.recorded.get(algorithm) is None:
            hint = " (prepare with --shard-sha256 to record one)" if algorithm == "sha256" else ""
            rep.fail("checksums", f"{job.shard}: no {algorithm} recorded in omnipack.json{hint}")
        elif algorithm is not None and reader.digest != job.recorded.get(algorithm):
            rep.fail(
                "checksums",
                f"{job.shard}: {algorithm} {reader.digest} != recorded {job.recorded.get(algorithm)}",
            )
        if job.recorded.get("count") != rep.rows:
            rep.fail(
                "shard-counts",
                f"{job.shard}: {rep.rows} rows, omnipack.json says {job.recorded.get('count')}",
            )
    if job.expected_count is not None and job.expected_count != rep.rows:
        rep.fail("shard-counts", f"{job.shard}: {rep.rows} rows, .info.json says {job.expected_count}")

    _check_tar_index(job.shard, path, [*offsets, reader.data_end], rep)
    return rep


def _check_tar_index(shard: str, path: Path, expected: list[int], rep: ShardReport) -> None:
    """The ``.tar.idx`` lists each row's offset in the tar, then the data end (``expected``)."""
    idx_path = Path(str(path) + ".idx")
    if not idx_path.is_file():
        rep.fail("tar-index", f"{shard}.idx: missing")
        return
    idx = read_index(idx_path).astype(np.int64).tolist()
    if len(idx) != len(expected):
        rep.fail("tar-index", f"{shard}.idx: {len(idx)} entries, the tar needs {len(expected)}")
    elif idx != expected:
        bad = next(i for i, (a, b) in enumerate(zip(idx, expected, strict=True)) if a != b)
        what = "data end" if bad == len(expected) - 1 else f"row {bad}"
        rep.fail("tar-index", f"{shard}.idx: entry {bad} ({what}) is {idx[bad]}, the tar has {expected[bad]}")


def _merge_sizes(ds: Dataset) -> dict[str, int]:
    """Spatial merge size per media kind from the recorded profile settings (kinds without one: none)."""
    settings = (ds.meta.get("profile") or {}).get("settings") or {}
    out = {}
    for kind in ("image", "video"):
        s = settings.get(kind) or ({} if kind == "image" else settings.get("image") or {})
        if isinstance(s, dict) and s.get("merge_size"):
            out[kind] = int(s["merge_size"])
    return out


def placeholder_ids_for(ds: Dataset, tokenizer: str | None = None) -> tuple[dict[str, list[int]] | None, str]:
    """Placeholder token ids per kind and where they came from: omnipack.json, else the tokenizer."""
    try:
        profile = ds.meta.get("profile") or {}
        ids, source = dataset_placeholder_ids(
            ds.meta, get_profile(profile.get("name", ""), **(profile.get("options") or {})), tokenizer
        )
    except Exception as e:
        return None, f"placeholder ids unavailable: {type(e).__name__}: {e}"
    return ids, source if ids is not None else f"{source} (use --tokenizer)"


def _dataset_checks(ds: Dataset, results: dict[str, CheckResult]) -> None:
    md = results["metadata"]
    md.failures += ds.problems
    for key in ("seq_length", "align", "shards", "counts"):
        if key not in ds.meta:
            md.failures.append(f"omnipack.json lacks {key!r}")
    try:
        expected_align = ParallelLayout(**ds.meta["parallel"]).alignment
        if ds.align % expected_align:
            md.failures.append(
                f"omnipack.json align={ds.align} is not a multiple of {expected_align}, "
                f"required by the recorded parallel layout {ds.meta['parallel']}"
            )
    except (KeyError, TypeError, ValueError) as e:
        md.failures.append(f"omnipack.json parallel layout unusable: {e}")
    if ds.seq_length and ds.align and ds.seq_length % ds.align:
        md.failures.append(f"seq_length={ds.seq_length} is not a multiple of align={ds.align}")

    sf = results["shard-files"]
    recorded = set(ds.recorded_shards)
    info = set((ds.info or {}).get("shard_counts", {}))
    split = set()
    for names in ((ds.split or {}).get("split_parts") or {}).values():
        split.update(names or [])
    if ds.info is not None and info != recorded:
        sf.failures.append(
            f".info.json and omnipack.json name different shards: only in .info.json {sorted(info - recorded)}, "
            f"only in omnipack.json {sorted(recorded - info)}"
        )
    if ds.split is not None and split != recorded:
        sf.failures.append(
            f"split.yaml and omnipack.json name different shards: only in split.yaml {sorted(split - recorded)}, "
            f"only in omnipack.json {sorted(recorded - split)}"
        )
    stray = sorted(_tars_on_disk(ds.root) - recorded - info)
    if stray:
        sf.failures.append(f"tar files not named by any metadata: {stray}")


def _tars_on_disk(root: Any) -> set[str]:
    """Every ``.tar`` under a dataset's root, relative to it, but in its metadata folders and in the run's
    scratch folder ``stages/`` (no dataset file lives there; a run may be deleting replaced shards in it
    meanwhile, ``stages.storage.BackgroundRemoval``)."""
    if not isinstance(root, Path):  # an object store: a listing, no folders that vanish
        found = (p.relative_to(root) for p in root.rglob("*.tar"))
        return {str(p) for p in found if NV_META not in p.parts and p.parts[0] != STAGES_DIR}
    found = local_files(root, "*.tar", lambda folder: folder.name == NV_META or folder == Path(STAGES_DIR))
    return {str(p.relative_to(root)) for p in found}


def _ledger(ds: Dataset, res: CheckResult) -> Any:
    """The dataset's accounting ledger (``omnipack.dataset.accounting``), None when it has none (a dataset
    made before it was published: noted) or it cannot be read (a failure)."""
    name = ds.meta.get("accounting_file")
    if name is None:
        res.notes.append("no accounting ledger (a dataset made before it was published): only counts checked")
        return None
    try:
        return read_ledger(ds.root / name)
    except FileNotFoundError:
        res.failures.append(f"{name}: missing (omnipack.json names it)")
    except ValueError as e:
        res.failures.append(f"{name}: {e}")
    return None


def _accounting(ds: Dataset, reports: list[ShardReport], res: CheckResult) -> None:
    """Counts, then the ledger: every input index 0..N-1 is packed or rejected once, where the dataset's
    accounting ledger says (its row and position, or its reject as in rejects.jsonl)."""
    counts = ds.meta.get("counts") or {}
    rejects = ds.rejects()
    rows_seen = [r for rep in reports for r in rep.rows_seen]
    _check_counts(res, counts, reports, rejects)
    n_in = counts.get("input")
    ledger = _ledger(ds, res)
    if ledger is None:  # ids alone: a sample id is packed at most once (the pack stage rejects repeats)
        by_id: dict[str, list[str]] = {}
        for r in rows_seen:
            for sid in r.sample_ids:
                by_id.setdefault(sid, []).append(r.where)
        twice = [(s, w) for s, w in by_id.items() if len(w) > 1]
        res.failures += [f"sample {s} packed twice: {w[0]} and {w[1]}" for s, w in twice]
        return
    entries = ledger.to_pylist()
    _check_entries(res, entries, counts)
    id_of = {e["sample_index"]: e["sample_id"] for e in entries}
    row_of = {e["sample_index"]: e["row"] for e in entries if e["row"] is not None}
    members: dict[int, list[tuple[int, int]]] = {}
    for e in entries:
        if e["row"] is not None:
            members.setdefault(e["row"], []).append((e["position"], e["sample_index"]))
    packed_at: Counter[int] = Counter()
    where_packed: dict[int, str] = {}
    for r in rows_seen:
        placed = members.get(int(r.key)) if r.key.isdigit() else None
        if placed is None:
            res.failures.append(f"{r.where}: key {r.key} is not a row of the accounting ledger")
            continue
        expected = [i for _, i in sorted(placed)]
        if [id_of[i] for i in expected] != r.sample_ids:
            res.failures.append(
                f"{r.where}: the accounting ledger puts sample indices {expected} "
                f"(ids {[id_of[i] for i in expected]}) in this row"
            )
            continue
        packed_at.update(expected)
        where_packed.update((i, r.where) for i in expected)
    rejected: list[int] = []
    for rej in rejects:
        idx = rej.get("sample_index")
        if isinstance(idx, int):
            rejected.append(idx)
        else:
            res.failures.append(f"reject without a sample_index: {rej}")
    _check_rejects(res, entries, rejects)
    _close_ledger(res, n_in, packed_at, rejected, id_of, where_packed, rejects, row_of)


def _check_counts(
    res: CheckResult, counts: dict[str, Any], reports: list[ShardReport], rejects: list[dict[str, Any]]
) -> None:
    """omnipack.json's counts against themselves, the shards and rejects.jsonl."""
    packed = sum(len(r.sample_ids) for rep in reports for r in rep.rows_seen)
    n_in, n_packed, n_rej = counts.get("input"), counts.get("packed"), counts.get("rejected")
    if n_in is not None and n_packed is not None and n_rej is not None and n_in != n_packed + n_rej:
        res.failures.append(f"omnipack.json: input {n_in} != packed {n_packed} + rejected {n_rej}")
    if n_packed is not None and packed != n_packed:
        res.failures.append(f"{packed} samples in the shards, omnipack.json says {n_packed} packed")
    rows = sum(r.rows for r in reports)
    if counts.get("rows") is not None and rows != counts["rows"]:
        res.failures.append(f"{rows} rows in the shards, omnipack.json says {counts['rows']}")
    if n_rej is not None and len(rejects) != n_rej:
        res.failures.append(f"{len(rejects)} lines in rejects.jsonl, omnipack.json says {n_rej} rejected")
    by_stage = dict(Counter(r.get("stage") for r in rejects))
    if counts.get("rejected_by_stage") is not None and by_stage != counts["rejected_by_stage"]:
        res.failures.append(
            f"rejects.jsonl by stage {by_stage} != omnipack.json {counts['rejected_by_stage']}"
        )


def _check_entries(res: CheckResult, entries: list[dict[str, Any]], counts: dict[str, Any]) -> None:
    """Each ledger entry is placed (row and position) or rejected (stage and reason), never both or
    neither; its measured samples (placed, or rejected by the pack or write stage) match the count."""
    bad = [
        e["sample_index"]
        for e in entries
        if (e["row"] is None) == (e["stage"] is None)
        or (e["row"] is None) != (e["position"] is None)
        or (e["stage"] is None) != (e["reason"] is None)
    ]
    if bad:
        res.failures.append(
            f"{len(bad)} accounting ledger entries are not either placed (row, position) or rejected "
            f"(stage, reason): sample indices {bad[:5]}"
        )
    measured = sum(e["row"] is not None or e["stage"] in ("pack", "write") for e in entries)
    if counts.get("measured") is not None and measured != counts["measured"]:
        res.failures.append(
            f"the accounting ledger places or packs-then-rejects {measured} measured samples, "
            f"omnipack.json says {counts['measured']} measured"
        )


def _check_rejects(res: CheckResult, entries: list[dict[str, Any]], rejects: list[dict[str, Any]]) -> None:
    """rejects.jsonl and the ledger's rejects agree: the same samples, ids, stages and reasons."""
    keys = ("sample_id", "stage", "reason")
    ledger = {e["sample_index"]: tuple(e[k] for k in keys) for e in entries if e["stage"] is not None}
    lines = {r.get("sample_index"): tuple(r.get(k) for k in keys) for r in rejects}
    differ = [i for i in ledger.keys() | lines.keys() if ledger.get(i) != lines.get(i)]
    differ.sort(key=lambda i: (not isinstance(i, int), i if isinstance(i, int) else 0))
    for i in differ[:MAX_SHOWN]:
        res.failures.append(
            f"sample index {i}: rejects.jsonl says {lines.get(i, 'nothing')}, "
            f"the accounting ledger {ledger.get(i, 'nothing')} (id, stage, reason)"
        )
    if len(differ) > MAX_SHOWN:
        res.failures.append(f"… {len(differ) - MAX_SHOWN} more rejects where the two disagree")


def _close_ledger(
    res: CheckResult,
    n_in: int | None,
    ledger: Counter[int],
    rejected: list[int],
    id_of: dict[int, str],
    where_packed: dict[int, str],
    rejects: list[dict[str, Any]],
    row_of: dict[int, int],
) -> None:
    """Every input index 0..N-1 must be packed or rejected exactly once."""
    indices = list(ledger) + rejected + list(id_of)
    n = max(([n_in] if isinstance(n_in, int) else []) + [max(indices, default=-1) + 1])
    beyond = sorted({i for i in indices if i >= (n_in if n_in is not None else n) or i < 0})
    if beyond:
        res.failures.append(
            f"{len(beyond)} sample indices lie outside the input count {n_in} of omnipack.json "
            f"(e.g. {beyond[:5]}): it was edited, or samples were added"
        )
    packed = np.zeros(n, dtype=np.int64)
    for i, c in ledger.items():
        if 0 <= i < n:
            packed[i] += c
    rej = np.bincount(np.asarray([i for i in rejected if 0 <= i < n], dtype=np.int64), minlength=n)
    bad = np.flatnonzero(packed + rej != 1)
    rejected_id = {r.get("sample_index"): r.get("sample_id") for r in rejects}
    for idx in bad[:MAX_SHOWN].tolist():
        p, j = int(packed[idx]), int(rej[idx])
        sid = id_of.get(idx, rejected_id.get(idx, "?"))
        if p + j == 0:
            placed = row_of.get(idx)
            where = "" if placed is None else f" (the accounting ledger puts it in row key {placed:09d})"
            res.failures.append(f"sample index {idx} ({sid}) is neither packed nor rejected{where}")
        elif p and j:
            res.failures.append(
                f"sample index {idx} ({sid}) is both packed ({where_packed[idx]}) and rejected"
            )
        elif p:
            res.failures.append(f"sample index {idx} ({sid}) packed {p} times")
        else:
            res.failures.append(f"sample index {idx} ({sid}) rejected {j} times")
    if len(bad) > MAX_SHOWN:
        res.failures.append(
            f"… {len(bad) - MAX_SHOWN} more sample indices not packed or rejected exactly once"
        )


def _check_splits(ds: Dataset, reports: list[ShardReport], res: CheckResult) -> None:
    """Every shard in exactly one split of split.yaml, the split omnipack.json records for it; nothing
    excluded; rows per split (as Energon reads them: a shard listed twice counts twice) as recorded."""
    parts = (ds.split or {}).get("split_parts")
    if not isinstance(parts, dict):
        res.failures.append("split.yaml has no split_parts (see metadata)")
        return
    splits_of: dict[str, list[str]] = {}
    for split, names in parts.items():
        for name in names or []:
            splits_of.setdefault(name, []).append(split)
    recorded = ds.recorded_shards
    for shard in sorted(splits_of.keys() | recorded.keys()):
        splits, rec = splits_of.get(shard, []), recorded.get(shard)
        if not splits:
            res.failures.append(f"{shard}: in no split of split.yaml (Energon would never read its rows)")
        elif len(set(splits)) > 1:
            res.failures.append(f"{shard}: in splits {sorted(set(splits))} of split.yaml, not exactly one")
        elif len(splits) > 1:
            res.failures.append(
                f"{shard}: listed {len(splits)} times in split {splits[0]!r} of split.yaml "
                "(Energon would read its rows as often)"
            )
        if rec is None and splits:
            res.failures.append(f"{shard}: in split.yaml ({splits[0]!r}), not a shard of omnipack.json")
        elif rec is not None and len(set(splits)) == 1 and rec.get("split") not in (None, splits[0]):
            said = f"split.yaml puts it in {splits[0]!r}, omnipack.json in {rec['split']!r}"
            res.failures.append(f"{shard}: {said}")
    excluded = (ds.split or {}).get("exclude") or []
    if excluded:
        res.failures.append(
            f"split.yaml excludes {excluded[:5]}: Energon would skip them (prepare excludes none)"
        )
    rows_of = {rep.shard: rep.rows for rep in reports}
    rows = Counter({split: sum(rows_of.get(n, 0) for n in names or []) for split, names in parts.items()})
    want = (ds.meta.get("counts") or {}).get("rows_by_split")
    if want is None:
        res.notes.append("omnipack.json records no rows_by_split: rows per split not compared")
        return
    for split in sorted(set(want) | {k for k, n in rows.items() if n}):
        if rows.get(split, 0) != want.get(split, 0):
            res.failures.append(
                f"split {split!r}: {rows.get(split, 0)} rows in its shards of split.yaml, omnipack.json's "
                f"rows_by_split says {want.get(split, 0)}"
            )


def _check_roles(ds: Dataset, reports: list[ShardReport], res: CheckResult) -> None:
    """Every supervised label of a packed sample targets a token of one of its assistant turns, as the
    dataset's role spans (``omnipack.dataset.role_spans``) record them; samples found by the ledger."""
    name = ds.meta.get("role_spans_file")
    if name is None:
        res.skipped = "not checked: no role spans recorded (a dataset prepared before they were published)"
        return
    try:
        spans = read_role_spans(ds.root / name)
    except FileNotFoundError:
        res.failures.append(f"{name}: missing (omnipack.json names it)")
        return
    except ValueError as e:
        res.failures.append(f"{name}: {e}")
        return
    try:
        ledger = read_ledger(ds.root / ds.meta["accounting_file"])
    except (KeyError, FileNotFoundError, ValueError):
        res.skipped = "not checked: no usable accounting ledger to find each row's samples (see accounting)"
        return
    placed = ledger.filter(pc.is_valid(ledger.column("row")))
    rows, positions, indices = (placed.column(c).to_numpy() for c in ("row", "position", "sample_index"))
    order = np.lexsort((positions, rows))
    rows, indices, ids = rows[order], indices[order], placed.column("sample_id").take(order)
    checked = 0
    for r in (r for rep in reports for r in rep.rows_seen):
        if r.supervised is None or r.bounds is None or not r.key.isdigit():
            continue
        lo, hi = np.searchsorted(rows, [int(r.key), int(r.key) + 1])
        if ids.slice(lo, hi - lo).to_pylist() != r.sample_ids:
            continue  # not the samples the ledger places here: the accounting check names the row
        owner = np.searchsorted(r.bounds, r.supervised[:, 0], side="right") - 1
        for k, sid in enumerate(r.sample_ids):
            a, index = int(r.bounds[k]), int(indices[lo + k])
            turns = spans.of(index)
            p = first_outside(r.supervised[owner == k] - a, turns)
            checked += 1
            if p is not None:
                res.failures.append(
                    f"{r.where}: sample {sid} (input index {index}): labels/loss_mask supervise sample "
                    f"position {p} (row position {a + p}), whose target token {p + 1} lies outside its "
                    f"assistant turns {turns.tolist()[:4]}"
                )
    res.notes.append(f"{checked} samples' supervised tokens checked against {len(spans.start)} assistant turns")


def _check_root(ds: Dataset, reports: list[ShardReport], res: CheckResult, expected: str | None) -> None:
    """The root of the files (``omnipack.dataset.root``) against the one the producer printed; a mismatch
    names the files whose leaves differ from those recorded, when the record gives that root. Without an
    expected root the files are not read again (the other checks cover them against the record): only the
    record's root against its leaves."""
    recorded = ds.meta.get(ROOT_KEY)
    recorded = recorded if isinstance(recorded, dict) else None
    recorded_leaves = [tuple(x) for x in (recorded or {}).get("leaves") or []]
    if expected is None:
        if recorded is None:
            res.skipped = "the dataset records no root (prepared before roots existed): give --expect-root"
        elif merkle_root(recorded_leaves) != recorded.get("sha256"):
            res.failures.append(
                f"omnipack.json's root {recorded.get('sha256')} is not that of its recorded leaves "
                f"({merkle_root(recorded_leaves)})"
            )
        else:
            res.notes.append(
                f"recorded root {recorded['sha256']}; give it as --expect-root (from the producer, not from "
                "this copy) to check the files against it"
            )
        return
    shards = ds.recorded_shards
    known = {  # shard leaves hashed already by the shard pass, with the algorithm the rule asks for
        rep.shard: rep.leaf
        for rep in reports
        if rep.leaf is not None
        and rep.leaf[2].startswith(shard_algorithm(shards.get(rep.shard) or {}) + ":")
    }
    leaves = dataset_leaves(ds.root, ds.meta, shard_digests=known)
    found, target = merkle_root(leaves), expected.strip().lower()
    if found == target:
        res.notes.append(f"root {found} ({len(leaves)} files)")
        return
    res.failures.append(f"the files give root {found}, expected {target}")
    if recorded_leaves and merkle_root(recorded_leaves) == target:
        res.failures += leaf_differences(recorded_leaves, leaves)
    else:
        res.failures.append(
            "omnipack.json's recorded leaves do not give that root (rewritten, or none recorded): "
            "the files that differ cannot be named"
        )


BYTES_PER_WORKER = 4 << 30


def run_verify(
    root: str | Path,
    *,
    workers: int = 1,
    tokenizer: str | None = None,
    progress: bool | None = None,
    payloads: bool = True,
    checksums: bool = True,
    sha256: bool = False,
    expect_root: str | None = None,
    source: SourceOptions | None = None,
) -> list[CheckResult]:
    """Run every check over the dataset at ``root``; returns one result per check, in ``CHECKS`` order
    (then ``source``'s, when asked for).

    Each shard's checksum is its recorded xxh3-128 (near memory speed); ``sha256=True`` recomputes the
    sha256 instead (shards written without an xxh3-128 always are). ``checksums=False`` skips both
    (sizes are still compared); the content
    fingerprints still cover every sample's tokens and labels and every payload's bytes.

    ``payloads`` checks every stored media item: exact shapes from its header against the plan, the
    features they give, and its recorded fingerprint (the heavy part; no pixel is decoded).

    ``expect_root`` is the root digest the dataset's producer printed (``omnipack.dataset.root``): the files
    must give it (without it, only omnipack.json's record of the root is checked against its leaves).

    ``source`` re-derives samples from the run's inputs (``omnipack.tools.verify_source``)."""
    ds = open_dataset(root)
    results = {name: CheckResult(name, desc) for name, desc in CHECKS}
    _dataset_checks(ds, results)
    jobs = _shard_jobs(ds, results, tokenizer, payloads=payloads, checksums=checksums, sha256=sha256)
    # A worker process costs about a second to start (interpreter, numpy, torch): worth it only for
    # several GiB of shards, which one process checks at a few GiB/s.
    total_bytes = sum((job.recorded or {}).get("num_bytes") or 0 for job in jobs)
    shard_workers = min(workers, max(1, total_bytes // BYTES_PER_WORKER))
    reports = map_shards(verify_shard, jobs, workers=shard_workers, progress=progress, label="verify")
    _collect(reports, results)
    _accounting(ds, reports, results["accounting"])
    _check_splits(ds, reports, results["splits"])
    _check_roles(ds, reports, results["roles"])
    _check_root(ds, reports, results["root"], expect_root)
    if not checksums and not results["checksums"].failures:
        results["checksums"].skipped = "shard checksums not recomputed (--no-checksums); sizes compared"
    out = [results[n] for n in CHECK_NAMES]
    if source is not None:
        res = CheckResult(*SOURCE_CHECK)
        res.failures, res.notes = run_source_check(root, workers=workers, **asdict(source))
        out.append(res)
    return out


@dataclass(frozen=True)
class SourceOptions:
    """``verify --source``: which samples are re-derived and how (``verify_source.run_source_check``)."""

    fraction: float | None = None  # None: all under 100k packed samples, 1% above
    seed: int = 0
    executor: str = "local"
    allow_changed: bool = False
    ray_address: str | None = None  # with executor "ray", as prepare's --ray-address
    rank: int = 0  # a staged check: this rank's input parts (part number % world_size == rank)
    world_size: int = 1


def _profile_spec(ds: Dataset, results: dict[str, CheckResult]) -> str | None:
    """The recorded profile as JSON for the shard workers; None (said) when it can not be loaded."""
    prof = ds.meta.get("profile") or {}
    if not prof.get("name"):
        return None
    spec = json.dumps({"name": prof["name"], "options": prof.get("options") or {}})
    try:
        _profile(spec)
    except Exception as e:
        results["media"].notes.append(f"payload features and mRoPE not checked: profile unusable: {e}")
        return None
    return spec


def _shard_jobs(
    ds: Dataset, results: dict[str, CheckResult], tokenizer: str | None, **flags: bool
) -> list[ShardJob]:
    profile_spec = _profile_spec(ds, results)
    ph_ids, source = placeholder_ids_for(ds, tokenizer)
    if ph_ids is None:
        results["media"].skipped = f"placeholder counts not checked: {source}"
    else:
        results["media"].notes.append(f"placeholder ids {ph_ids} from {source}")
    counts = ds.shard_counts if ds.info is not None else {}
    recorded = ds.recorded_shards
    mrope = ds.meta.get("mrope_position_ids")
    jobs, first = [], 0
    for shard in ds.shards:
        jobs.append(
            ShardJob(
                root=str(ds.root),
                shard=shard,
                first_row=first,
                seq_length=ds.seq_length,
                align=ds.align,
                expected_count=counts.get(shard),
                recorded=recorded.get(shard),
                placeholder_ids=ph_ids,
                merge_sizes=_merge_sizes(ds),
                profile=profile_spec,
                mrope=None if mrope is None else bool(mrope),
                **flags,
            )
        )
        first += counts.get(shard, (recorded.get(shard) or {}).get("count", 0))
    if not jobs:
        results["shard-files"].failures.append("the dataset names no shards")
    return jobs


def _collect(reports: list[ShardReport], results: dict[str, CheckResult]) -> None:
    """The shard reports' failures and notes into the checks' results."""
    for rep in reports:
        for check, msgs in rep.failures.items():
            results[check].failures.extend(msgs)
    results["media"].notes += sorted({n for rep in reports for n in rep.notes})
    without = [w for rep in reports for w in rep.rows_without_digests]
    total = sum(len(rep.rows_seen) for rep in reports)
    if without and len(without) == total:
        results["content"].skipped = "no row records content fingerprints (written before they existed)"
    else:
        results["content"].failures += [f"{w}: meta.json lacks the content fingerprints" for w in without]


def print_report(results: list[CheckResult], root: str, max_shown: int = MAX_SHOWN) -> None:
    from rich.console import Console
    from rich.markup import escape

    con = Console()
    style = {"pass": "bold green", "fail": "bold red", "skip": "bold yellow"}
    con.print(f"[bold]omnipack verify[/] {escape(root)}")
    for r in results:
        label = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[r.status]
        con.print(
            f"  [{style[r.status]}]{label}[/] {r.name:<13} [dim]{escape(r.description)}[/]", soft_wrap=True
        )
        for msg in r.failures[:max_shown]:
            con.print(f"         [red]-[/] {escape(msg)}", soft_wrap=True)
        if len(r.failures) > max_shown:
            con.print(f"         … and {len(r.failures) - max_shown} more (use --json or --max-shown)")
        if r.skipped:
            con.print(f"         [yellow]{escape(r.skipped)}[/]", soft_wrap=True)
        for note in r.notes:
            con.print(f"         [dim]{escape(note)}[/]", soft_wrap=True)
    failed = [r.name for r in results if r.status == "fail"]
    if failed:
        con.print(f"[bold red]FAILED[/]: {len(failed)} of {len(results)} checks ({', '.join(failed)})")
    else:
        skipped = [r.name for r in results if r.status == "skip"]
        note = f", {len(skipped)} skipped ({', '.join(skipped)})" if skipped else ""
        con.print(f"[bold green]OK[/]: {len(results) - len(skipped)} of {len(results)} checks passed{note}")


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        check_rank(args.rank, args.world_size)
        if (args.rank, args.world_size) != (0, 1) and not args.source:
            raise ValueError("--rank/--world-size split the source check's input parts: give --source")
    except ValueError as e:
        print(f"omnipack verify: error: {e}", file=sys.stderr)
        return 2
    results = run_verify(
        args.dataset,
        workers=args.workers,
        tokenizer=args.tokenizer,
        progress=False if args.json else args.progress,
        payloads=args.payloads,
        checksums=args.checksums,
        sha256=args.sha256,
        expect_root=args.expect_root,
        source=SourceOptions(
            args.source_fraction, args.source_seed, args.executor, args.allow_changed_source,
            args.ray_address, args.rank, args.world_size,
        )
        if args.source
        else None,
    )
    if args.json:
        out = {
            "dataset": args.dataset,
            "ok": all(r.status != "fail" for r in results),
            "checks": [
                {
                    "name": r.name,
                    "description": r.description,
                    "status": r.status,
                    "failures": r.failures,
                    "skipped": r.skipped,
                    "notes": r.notes,
                }
                for r in results
            ],
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_report(results, args.dataset, args.max_shown)
    bad = ("fail", "skip") if args.strict else ("fail",)
    return 1 if any(r.status in bad for r in results) else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check every row and shard of a dataset against the packed-row contract",
        description="Check a prepared dataset: metadata, shard files, checksums, .tar.idx, counts, every "
        "row's parts, meta and contract invariants, media placeholder counts, and sample accounting. "
        "Prints PASS/FAIL per check naming shard, row and sample; exits 1 on any failure.",
    )
    p.add_argument("dataset", help="dataset folder (the one holding .nv-meta/)")
    p.add_argument(
        "--workers",
        "-j",
        type=int,
        default=default_workers(),
        help="at most this many processes (one shard each; one per 4 GiB of shards)",
    )
    p.add_argument(
        "--tokenizer", help="tokenizer directory for placeholder ids (default: from omnipack.json)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument(
        "--strict", action="store_true", help="a skipped check (e.g. no placeholder ids) fails too"
    )
    p.add_argument("--max-shown", type=int, default=MAX_SHOWN, help="failures printed per check")
    p.add_argument(
        "--payloads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="check every stored media item: exact shape from its header against the plan, features, "
        "fingerprint (default; --no-payloads skips it)",
    )
    p.add_argument(
        "--checksums",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute each shard's checksum (default; --no-checksums compares sizes only: the per-sample "
        "and per-payload fingerprints still cover the content)",
    )
    p.add_argument(
        "--sha256",
        action="store_true",
        help="recompute each shard's sha256 instead of its xxh3-128 (slower; a cryptographic check of the "
        "bytes, for datasets prepared with --shard-sha256)",
    )
    p.add_argument(
        "--expect-root",
        metavar="HEX",
        help="the root digest the dataset's producer printed (omnipack.json's root.sha256): the files must "
        "give it, so a copy damaged and re-checksummed is caught (README: Verifying a dataset)",
    )
    _source_arguments(p)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.set_defaults(func=cmd_verify)


def _source_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        action="store_true",
        help="also re-derive samples from the run's inputs and settings (omnipack.json's source) with "
        "prepare's own code and compare them bit for bit; refuses changed inputs or tokenizer",
    )
    p.add_argument(
        "--source-fraction",
        type=float,
        metavar="F",
        help="with --source: re-derive a seeded random fraction F of the samples, at least one per shard "
        "(default: all under 100k packed samples, 1%% above)",
    )
    p.add_argument("--source-seed", type=int, default=0, help="with --source-fraction: the seed")
    p.add_argument(
        "--allow-changed-source",
        action="store_true",
        help="with --source: compare even when an input's digest or the tokenizer / processor differs from "
        "the recorded ones (the changes are listed and the differences counted)",
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="with --source: where the re-derivation runs, as prepare's --executor (local processes, ray)",
    )
    p.add_argument(
        "--ray-address",
        help="with --executor ray: the cluster, as prepare's --ray-address ('local', 'auto', host:port; "
        "default: RAY_ADDRESS if set, else local)",
    )
    staged = p.add_argument_group(
        "staged source check", "one rank's share of the input parts, for schedulers without Ray (e.g. a Slurm array)"
    )
    staged.add_argument(
        "--rank", type=int, default=0, help="with --source: this task's rank (input parts number %% world size)"
    )
    staged.add_argument("--world-size", type=int, default=1, help="with --source: tasks sharing the check")
