"""Write stage: one shard's planned rows -> media materialised at the model's target size -> its tar.

Each row is its samples side by side (``assemble_row``), each padded to a multiple of the alignment.

A unit is one shard of the pack stage's layout: its rows are known before writing, so any worker (a local
process, a Ray actor, a Slurm task) writes it to the same bytes, and writes only it. A sample whose media
fails to decode here is rejected with its reason and its row is rebuilt from the remaining samples. The
unit's record (shard info with checksums, rejects, counts) is written after its tar and index are in place.
"""

from __future__ import annotations

import io
import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .. import progress
from ..alignment import pad_to_multiple
from ..dataset.codec import encode_row, view_npy, view_npz
from ..dataset.contract import IGNORE_INDEX, MediaItem, PackedRowArrays, media_digest, row_invariant_errors
from ..dataset.shards import ShardWriter, TarMembers, tar_members
from ..errors import Reject, SampleReject, sample_failed
from ..media.probe import materialize
from ..media.sources import media_root_key, resolve_source
from ..profiles import get_profile, profile_class
from ..profiles.base import MediaPlan
from .measure import part_files, sample_arrays
from .records import (
    PlannedShard,
    PlanRecord,
    ShardRecord,
    digest,
    file_unchanged,
    file_xxh3,
    output_stamp,
)
from .sample_store import SampleStore, UnitPayloads, shape_settings, store_root
from .spec import RunSpec, WriteSettings
from .storage import is_local, publish, remove_partials, staging_file
from .token_file import SampleRecords, TokenFiles, read_gather
from .unit import Stage, run_once
from .worker import WorkerContext

# ``ModelProfile.store_sample_media``: a sample's items (plans, decoded arrays) -> the arrays stored for each.
MediaStore = Callable[[list[MediaPlan], list[Any]], list[Mapping[str, np.ndarray]]]


# ---- row assembly: measured sequences side by side in one fixed-width THD row


@dataclass
class SequenceInput:
    """One measured sample as the row assembler needs it."""

    sample_id: str
    input_ids: np.ndarray  # int32 [L]
    labels: np.ndarray  # int32 [L]
    media: list[tuple[MediaPlan, tuple[int, int, int, int], str]] = field(default_factory=list)
    # (plan, span (start, end, placeholder_start, num_placeholders), tar part name)
    mrope_position_ids: np.ndarray | None = None  # int32 [3, L]


def assemble_row(
    seqs: Sequence[SequenceInput], seq_length: int, align: int, pad_token_id: int
) -> PackedRowArrays:
    """Sequences side by side in one fixed-width THD row, each padded to a multiple of ``align``; the row
    tail joins the last sequence's padding so ``cu_seqlens_padded[-1] == seq_length`` (TE's CP
    partitioning needs the boundaries to cover the row)."""
    if not seqs:
        raise ValueError("a row needs at least one sequence")
    lengths = np.array([len(s.input_ids) for s in seqs], dtype=np.int64)
    padded = np.array([pad_to_multiple(int(n), align) for n in lengths], dtype=np.int64)
    if padded.sum() > seq_length:
        raise ValueError(f"sequences need {int(padded.sum())} positions, row has {seq_length}")
    padded[-1] += seq_length - padded.sum()
    cu = np.zeros(len(seqs) + 1, dtype=np.int32)
    cup = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    np.cumsum(padded, out=cup[1:])

    tokens = np.full(seq_length, pad_token_id, dtype=np.int32)
    labels = np.full(seq_length, IGNORE_INDEX, dtype=np.int32)
    padding_mask = np.ones(seq_length, dtype=bool)
    position_ids = np.empty(seq_length, dtype=np.int32)
    with_mrope = all(s.mrope_position_ids is not None for s in seqs)
    mrope = np.empty((3, seq_length), dtype=np.int32) if with_mrope else None
    media: list[MediaItem] = []
    for i, s in enumerate(seqs):
        a, n, p = int(cup[i]), int(lengths[i]), int(padded[i])
        tokens[a : a + n] = s.input_ids
        labels[a : a + n] = s.labels
        padding_mask[a : a + n] = False
        # Gap positions continue last+1 so rotary embeddings stay monotone inside the padded sequence.
        position_ids[a : a + p] = np.arange(p, dtype=np.int32)
        if mrope is not None:
            mrope[:, a : a + n] = s.mrope_position_ids
            nxt = int(s.mrope_position_ids.max()) + 1 if n else 0
            mrope[:, a + n : a + p] = np.arange(nxt, nxt + p - n, dtype=np.int32)
        media.extend(_media_items(s, i, a))
    loss_mask = (labels != IGNORE_INDEX).astype(np.int32)
    return PackedRowArrays(
        tokens=tokens,
        labels=labels,
        loss_mask=loss_mask,
        position_ids=position_ids,
        padding_mask=padding_mask,
        cu_seqlens=cu,
        cu_seqlens_padded=cup,
        sample_ids=[s.sample_id for s in seqs],
        media=media,
        mrope_position_ids=mrope,
    )


_NOT_INFO = ("kind", "num_tokens", "grid_thw", "truncate")  # a media item's own fields, or the writer's


def _media_items(seq: SequenceInput, i: int, start_pos: int) -> list[MediaItem]:
    """The media of sequence ``i`` of a row, placed at its start position ``start_pos``."""
    items = []
    for plan, (start, end, ph_start, n_ph), part in seq.media:
        # (``truncate`` is the writer's instruction, recorded as the info's "truncated")
        info = {k: v for k, v in plan.to_json().items() if k not in _NOT_INFO}
        info["info"] = plan.recorded_info
        items.append(
            MediaItem(
                kind=plan.kind,
                part=part,
                sample_index=i,
                token_start=start_pos + ph_start,
                num_tokens=n_ph,
                block_start=start_pos + start,
                block_end=start_pos + end,
                grid_thw=None if plan.grid_thw is None else list(plan.grid_thw),
                info={k: v for k, v in info.items() if v not in (None, 0, {})},
            )
        )
    return items


# a payload made for the sample store: ``UnitPayloads.put``'s arguments (ref, plan, ext, bytes, digest)
NewPayload = tuple[str, dict[str, Any], str, bytes, str]


@dataclass
class RowResult:
    key: str
    members: TarMembers | None  # the row's tar members; None when every sample of the row was rejected
    rejects: list[Reject]
    num_samples: int
    real_tokens: int
    # payloads made for the sample store: kept by the caller in row order, so a store's segment is the same
    # whichever thread built which row
    new_payloads: list[NewPayload] = field(default_factory=list)


def sample_media(
    rec: dict[str, Any],
    cfg: WriteSettings,
    store_media: MediaStore | None = None,
    first: int = 0,
    samples: UnitPayloads | None = None,
    new_payloads: list[NewPayload] | None = None,
) -> tuple[list[tuple[MediaPlan, tuple[int, int, int, int], str]], dict[str, bytes], dict[str, str]]:
    """A measured sample's media materialised as stored: (plan, span, part name) per item, the parts'
    bytes, named from ``media.{first}`` on (the items of the row before it), and the ``media_digest`` of
    those parts whose digest is known (kept in or checked by the sample store: the row's meta.json reuses
    it); ``SampleReject`` for media that can not be read. ``samples``: the sample store, whose payloads are
    copied instead of decoded; the new ones go to ``new_payloads`` (``UnitPayloads.put``'s arguments), for
    the caller to keep in row order."""
    media, payloads, digests = [], {}, {}
    entries = json.loads(rec["media_json"])
    plans = [MediaPlan.from_json(m["plan"]) for m in entries]
    # a repack copies a payload as an earlier write made it (not one stored from its sample's media set)
    reused = [
        None if samples is None or "sample_joint" in plan.info else samples.get(m["ref"], m["plan"])
        for m, plan in zip(entries, plans, strict=True)
    ]
    todo = [k for k, found in enumerate(reused) if found is None]
    made = _materialized([(entries[k]["ref"], plans[k]) for k in todo], cfg, store_media)
    made_at = dict(zip(todo, made, strict=True))
    for k, (m, plan) in enumerate(zip(entries, plans, strict=True)):
        known = None
        if reused[k] is not None:
            ext, data = reused[k]
            known = data.digest
        else:
            ext, data = made_at[k]
            if samples is not None and "sample_joint" not in plan.info:
                known = media_digest(data)
                if new_payloads is not None:
                    new_payloads.append((m["ref"], m["plan"], ext, data, known))
        part = f"media.{first + len(payloads)}.{ext}"
        payloads[part] = data
        if known is not None:
            digests[part] = known
        media.append((plan, tuple(m["span"]), part))
    return media, payloads, digests


def build_row(
    key: str,
    records: list[dict[str, Any]],
    cfg: WriteSettings,
    store_media: MediaStore | None = None,
    samples: UnitPayloads | None = None,
) -> RowResult:
    """Materialise a row's media and assemble its arrays; pure function of its inputs (the sample store is
    only read: the payloads it should keep come back in ``RowResult.new_payloads``), so rows can be built on
    several threads at once. ``store_media``: a profile's own arrays for a sample's decoded items
    (``ModelProfile.store_sample_media``), stored as npz. ``samples``: the sample store, whose payloads are
    copied instead of decoded."""
    seqs: list[SequenceInput] = []
    payloads: dict[str, bytes] = {}
    digests: dict[str, str] = {}
    rejects: list[Reject] = []
    new_payloads: list[NewPayload] = []
    for rec in records:
        try:
            media, sample_payloads, known = sample_media(
                rec, cfg, store_media, len(payloads), samples, new_payloads
            )
        except SampleReject as e:
            rejects.append(Reject.of(rec["sample_index"], rec["sample_id"], rec["source"], "write", e))
            continue
        except Exception as e:
            raise sample_failed("write", rec["sample_id"], rec["source"], e) from e
        ids, labels, mrope = sample_arrays(rec)
        seqs.append(SequenceInput(rec["sample_id"], ids, labels, media, mrope))
        payloads.update(sample_payloads)
        digests.update(known)
    if not seqs:
        return RowResult(key, None, rejects, 0, 0, new_payloads)
    row = assemble_row(seqs, cfg.seq_length, cfg.align, cfg.pad_token_id)
    errors = row_invariant_errors(row, cfg.align)
    if errors:  # a bug, not bad input: refuse to write a wrong row
        raise AssertionError(f"row {key} breaks the contract: {errors}")
    # laid out here, on the build-ahead thread: the writing thread only writes (``tar_members``)
    members = tar_members(key, encode_row(row, payloads, digests))
    return RowResult(key, members, rejects, len(seqs), int(row.seqlens.sum()), new_payloads)


def _materialized(
    items: list[tuple[str, MediaPlan]], cfg: WriteSettings, store_media: MediaStore | None
) -> list[tuple[str, bytes]]:
    """(ext, bytes) of each of a sample's media items' payloads (``(ref, plan)``), decoded from its source
    and sized to its plan; with ``store_media``, the profile's arrays for the items together, as npz."""
    made = [
        materialize(
            resolve_source(ref, cfg.media_root, cfg.media_allow_roots, cfg.remote),
            plan.storage,
            image_encoding=cfg.image_encoding if store_media is None else "npy",
            compress_video=cfg.compress_video and store_media is None,
        )
        for ref, plan in items
    ]
    if store_media is None or not items:
        return made
    # npy / stored npz: the decoded arrays are views of the bytes
    decoded = [view_npy(data) if ext == "npy" else view_npz(data) for ext, data in made]
    stored = store_media([plan for _, plan in items], decoded)
    return [("npz", npz_bytes(arrays)) for arrays in stored]


@dataclass
class _PlanView:
    record: PlanRecord
    samples: TokenFiles


def _plan_view(spec: RunSpec, context: WorkerContext) -> _PlanView:
    """The plan's record and the measured parts' token files, once per worker and plan (a unit reads its
    own shard's part of the plan: ``shard_samples``); a replanned run drops the old mappings."""
    record = PlanRecord.from_json(json.loads(spec.plan_record.read_text()))

    def open_view() -> _PlanView:
        files = [part_files(spec.measure_dir, n)["tokens"] for n in record.parts]
        return _PlanView(record, TokenFiles(files, np.asarray(record.offsets)))

    return context.kept("plan", record.key, open_view, latest_only=True)


def _media_store(spec: RunSpec, context: WorkerContext) -> MediaStore | None:
    """The run's profile's ``store_sample_media`` when it stores arrays of its own (built once per worker and
    profile, as the measure stage builds it); None for the families that store the decoded media."""
    config = spec.measure
    if not profile_class(config.profile).stores_own_media():
        return None

    def make() -> MediaStore:
        return get_profile(config.profile, **config.profile_options).store_sample_media

    return context.kept("media store", digest({"profile": config.profile, "options": config.profile_options}), make)


def sample_store(spec: RunSpec) -> SampleStore | None:
    """The run's sample store for its profile and pixel settings (``stages.sample_store``), opened once per
    process for the run (the spec holds it: ``RunSpec.samples``); None when the run keeps none."""

    def open_store() -> SampleStore | None:
        root = store_root(spec)
        own_media = profile_class(spec.measure.profile).stores_own_media()
        return None if root is None else SampleStore.at(root, shape_settings(spec, own_media))

    return spec.samples.get(open_store)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Named arrays as an uncompressed npz (the loader views its members in place)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def shard_key(spec: RunSpec, plan_key: str, shard: PlannedShard) -> str:
    return digest({"plan": plan_key, "write": spec.write, "shard": shard.to_json()})


def shard_record_path(spec: RunSpec, number: int) -> Path:
    return spec.write_dir / f"shard-{number:06d}.json"


def read_shard_record(spec: RunSpec, plan: PlanRecord, number: int) -> ShardRecord | None:
    """Shard ``number``'s record when it was made for this plan and settings; None when it is not."""
    return WRITE.current(spec, plan, number)


def shard_done(spec: RunSpec, record: ShardRecord | None, *, check_bytes: bool = False) -> bool:
    """A recorded shard whose tar and index are in place with the recorded size; with ``check_bytes``, also
    unchanged since recorded: their recorded stamps (a ``stat``), or else their recorded xxh3-128 checksums
    (a read of the shard), since a damaged shard can keep its size."""
    if record is None:
        return False
    info = record.shard
    if info is None:
        return True
    tar = spec.out / info.path
    idx = tar.with_name(f"{tar.name}.idx")
    if not (tar.is_file() and tar.stat().st_size == info.num_bytes and idx.is_file()):
        return False
    if not check_bytes:
        return True
    stamps = record.stamps or {}
    return file_unchanged(tar, info.num_bytes, info.xxh3_128, stamps.get("tar")) and file_unchanged(
        idx, idx.stat().st_size, record.index_xxh3, stamps.get("idx")
    )


BUILD_THREADS_MAX = 4  # row builders per write unit, within its worker's CPUs (``WorkerContext.cpus``)


def _built_ahead(
    build: Callable[[int], RowResult], rows: list[int], threads: int = 1, ahead: int | None = None
) -> Iterator[RowResult]:
    """``build(r)`` of each row in order, computed up to ``ahead`` rows ahead (``threads + 1`` by default:
    each thread busy and one row ready, so few rows are held however large) on ``threads`` background
    threads, so decoding and resizing the next rows' media (Pillow and the video / audio decoders release
    the GIL) overlaps the tar writing of this one, and on a worker with spare CPUs other rows' decoding too
    (benchmarks/README.md, "Write threads benchmark"). ``build`` is a pure function of its row, and the rows
    come back in row order, so the rows and their bytes are those of a plain loop."""
    ahead = threads + 1 if ahead is None else ahead
    if len(rows) < 2:
        yield from map(build, rows)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="omnipack-write") as pool:
        pending: deque[Future[RowResult]] = deque()
        try:
            for r in rows:
                pending.append(pool.submit(build, r))
                if len(pending) > ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:  # an error or a closed generator: do not build the rest
                f.cancel()


def write_shard(spec: RunSpec, number: int, context: WorkerContext) -> ShardRecord:
    """Write one shard of the layout (or keep it when its record matches); returns its record."""
    view = _plan_view(spec, context)
    return run_once(
        "write",
        number,
        shard_record_path(spec, number),
        shard_key(spec, view.record.key, view.record.shards[number]),
        ShardRecord.from_json,
        lambda record: shard_done(spec, record, check_bytes=True),
        lambda: _write(spec, view, number, _media_store(spec, context), context.cpus),
    )[0]


def _write(
    spec: RunSpec, view: _PlanView, number: int, store: MediaStore | None, cpus: int = 1
) -> ShardRecord:
    """Shard ``number`` written and published with its index; its record (keyed by ``run_once``). ``cpus``:
    the worker's share of the CPUs, which its row builders stay within."""
    path = shard_record_path(spec, number)
    remove_partials(spec.write_dir, f"{path.name}.*")  # this unit's record, half-written by a killed run
    # in a folder the shard is written in place (under a temporary name); for an object store it is
    # built in a local staging folder and uploaded whole
    shard = view.record.shards[number]
    local_root = spec.out if is_local(spec.out) else staging_file(spec.out / shard.path).parent / "root"
    record = _write_rows(spec, view, number, local_root, store, cpus)
    if record.shard is None:
        return record
    name = record.shard.path
    record.index_xxh3 = file_xxh3(local_root / f"{name}.idx")
    if not is_local(spec.out):  # the index first: a present tar always has its index
        for file in (f"{name}.idx", name):
            publish(local_root / file, spec.out / file)
    tar = spec.out / name
    record.stamps = {"tar": output_stamp(tar), "idx": output_stamp(tar.with_name(f"{tar.name}.idx"))}
    return record


def shard_samples(
    spec: RunSpec, view: _PlanView, number: int
) -> tuple[np.ndarray, np.ndarray, SampleRecords]:
    """Shard ``number``'s plan rows, where each row's samples start among its samples (plus their count),
    and the samples in row order: its entries of the gather table, and its samples' records read from
    their parts' token files (from an object store, only their byte ranges)."""
    entries = read_gather(spec.gather_table, len(view.record.shards), number)
    rows = entries["row"]
    if len(rows) == 0:
        raise AssertionError(f"shard {number} has no rows in {spec.gather_table}")
    first = np.flatnonzero(np.concatenate([[True], rows[1:] != rows[:-1], [True]]))
    samples = view.samples.open(entries["sample_index"], entries["offset"], entries["bytes"])
    return rows[first[:-1]], first, samples


def _write_rows(
    spec: RunSpec, view: _PlanView, number: int, local_root: Path, store: MediaStore | None, cpus: int = 1
) -> ShardRecord:
    """Shard ``number``'s rows built and written into a tar under ``local_root`` (``store``: the profile's
    ``store_media``, or None); its record's counts. Rows are built on up to ``cpus`` threads (one for a
    profile that stores arrays of its own: its processor objects are not known to be thread-safe)."""
    shard = view.record.shards[number]
    writer = ShardWriter(
        local_root,
        shard.prefix,
        max_bytes=1 << 62,  # one shard: the layout already cut the rows
        split=shard.split,
        checksums=spec.write.shard_checksums,
        first_number=shard.index,
    )
    record = ShardRecord("", number, None, None, None, [], 0, 0, 0)
    samples = None
    if (kept := sample_store(spec)) is not None:
        kept.load_index()  # the index the run merged before this stage (segments of earlier writes)
        samples = UnitPayloads(kept, media_root_key(spec.write.media_root), f"shard-{number:06d}")

    shard_rows, first, gathered = shard_samples(spec, view, number)

    def build(k: int) -> RowResult:
        records = [gathered.record(i) for i in range(first[k], first[k + 1])]
        return build_row(f"{int(shard_rows[k]):09d}", records, spec.write, store, samples)

    threads = 1 if store is not None else min(BUILD_THREADS_MAX, cpus)
    rows = _built_ahead(build, list(range(len(shard_rows))), threads)
    try:
        for res in rows:
            progress.advance("write", number, 1)
            record.rejects.extend(res.rejects)
            if samples is not None:
                for payload in res.new_payloads:  # in row order: the same segment whichever thread built it
                    samples.put(*payload)
            if res.members is not None:
                writer.write_members(res.members)
                record.rows_written += 1
                record.samples_written += res.num_samples
                record.real_tokens += res.real_tokens
    except BaseException:
        rows.close()  # stop the build-ahead thread now, not when the traceback is collected
        writer.abort()
        if samples is not None:
            samples.writer.abort()
        raise
    infos = writer.close()
    if samples is not None:  # after the shard is whole: payloads of a failed unit are not kept
        samples.writer.commit()
    pa.default_memory_pool().release_unused()
    record.shard = infos[0] if infos else None
    return record


def _plan(plan: PlanRecord | None) -> PlanRecord:
    if plan is None:
        raise AssertionError("the write stage's units come from the plan")
    return plan


def _shard_files(spec: RunSpec, plan: PlanRecord | None, number: int) -> list[Path]:
    """Shard ``number``'s tar and index in a local output, the tar first (a present tar always has its index);
    none on an object store, whose upload replaces an object in one PUT."""
    if not is_local(spec.out):
        return []
    tar = spec.out / _plan(plan).shards[number].path
    return [tar, tar.with_name(f"{tar.name}.idx")]


WRITE: Stage[ShardRecord] = Stage(
    "write",
    units=lambda spec, plan: [s.number for s in _plan(plan).shards],
    key=lambda spec, plan, number: shard_key(spec, _plan(plan).key, _plan(plan).shards[number]),
    record_path=shard_record_path,
    load=ShardRecord.from_json,
    run=write_shard,
    size=lambda spec, plan, number: _plan(plan).shards[number].rows,
    item="rows",
    bar_item="rows",
    describe=lambda spec, units, total: f"{total:,} rows in {len(units)} shard(s)",
    outputs=_shard_files,
)
