"""Measure stage: one input part (a record range of one input file) -> its measured samples and rejects.

Per sample (``Measurer``), a pure function from a manifest record to its measured record (the expanded
token ids and labels, media plans with their spans, and the lengths and cost the packer needs) or a reject.

The input is split into parts of about ``part_lines`` records each, never across files, by each file's
reader (``omnipack.inputs``: JSONL by line ends, Parquet by row groups, JSON arrays and Arrow by record
ranges), so a part is a plain-data unit (``InputPart``) this stage reads without knowing the format. A
part's samples go to ``stages/measure/part-K.parquet`` (the per-sample columns, and where each sample's
record is in ``part-K.tokens``: its token arrays and what else the write stage reads, one byte range a
sample, see ``token_file``), and its rejects to
``part-K.rejects.parquet``, keyed by their record index within the part: the pack stage turns (part, record) into the global sample index once every part is measured, so
no part needs to know how many records the parts before it hold.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import __version__, progress
from ..alignment import pad_to_multiple
from ..errors import Reject, SampleReject, sample_failed
from ..inputs import InputPart, InputSpec, data_files, read_part, split_parts
from ..inputs.base import file_stamp
from ..manifest import MediaRef, RawSample
from ..media.probe import probe
from ..media.sources import media_root_key, resolve_source
from ..profiles import get_profile
from ..profiles.base import MediaPlan
from ..profiles.cost import media_encoder_flops
from ..text.chat import ChatTokenizer, EncodedSample
from .lock import holder_live as lock_holder_live
from .lock import owner as lock_owner
from .lock import renewed as lock_renewed
from .model_files import ShippedModel, cache_dir, local_copy
from .records import (
    PartRecord,
    PartSpan,
    PlanRecord,
    RecordedFile,
    digest,
    file_xxh3,
    output_stamp,
    read_record,
    write_json_atomic,
)
from .spec import MeasureConfig, RunSpec
from .storage import create_exclusive, make_dirs, publish, read_parquet, remove_partials, staging_file
from .token_file import LOCATION_COLUMNS, write_records
from .tokenizer_facts import TOKENIZER_OFFER, tokenizer_offer_key
from .unit import Stage, run_once
from .worker import WorkerContext

# ---- per sample: a manifest record -> its measured record or its reject

SAMPLES_SCHEMA = pa.schema(
    [
        ("sample_index", pa.int64()),
        ("sample_id", pa.string()),
        ("source", pa.string()),
        ("num_tokens", pa.int32()),
        ("padded_length", pa.int32()),
        ("num_images", pa.int16()),
        ("num_videos", pa.int16()),
        ("num_audios", pa.int16()),
        ("num_media", pa.int16()),
        ("image_tokens", pa.int32()),
        ("video_tokens", pa.int32()),
        ("audio_tokens", pa.int32()),
        ("vision_patches", pa.int64()),
        ("audio_frames", pa.int64()),
        ("media_bytes", pa.int64()),  # estimated shard bytes of the sample's media (shards are cut by it)
        # modeled training cost (profiles.cost), null when the profile has no cost model: forward FLOPs of
        # the sample's media encoders, and its whole per-sample cost (what balanced packing evens out)
        ("encoder_flops", pa.float64()),
        ("sample_cost", pa.float64()),
        ("media_json", pa.string()),
        # each assistant turn's [start, end) in the sample's tokens, flattened [s0, e0, s1, e1, ...]: what
        # finalize publishes as the role spans ``omnipack verify`` checks the supervised tokens against
        ("assistant_spans", pa.list_(pa.int32())),
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("mrope_position_ids", pa.list_(pa.int32())),  # flattened [3, L], null when not computed
    ]
)
# The token columns travel only in a measured part's token file (the write stage reads them there); its
# Parquet file holds the per-sample columns the pack and finalize stages read, a few dozen bytes a sample
# instead of eight per token, and where each sample's record is in the token file.
TOKEN_COLUMNS = ("input_ids", "labels", "mrope_position_ids")
SAMPLES_PARQUET_SCHEMA = pa.schema(
    [f for f in SAMPLES_SCHEMA if f.name not in TOKEN_COLUMNS] + [(c, pa.int64()) for c in LOCATION_COLUMNS]
)
# how a part's files are laid out (in its key: parts measured with another layout are measured again)
PART_LAYOUT = "parquet+tokens"
REJECTS_SCHEMA = pa.schema(  # a part's rejects: the fields of ``Reject``
    [
        ("sample_index", pa.int64()),
        ("sample_id", pa.string()),
        ("source", pa.string()),
        ("stage", pa.string()),
        ("reason", pa.string()),
    ]
)


class Measurer:
    """Per-process measuring context: the profile and the tokenizer, loaded once."""

    def __init__(self, config: MeasureConfig, tokenizer: Any = None) -> None:
        """``tokenizer``: ``config.tokenizer``'s, already loaded (``ChatTokenizer``)."""
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the pool parallelises, not the tokenizer
        self.config = config
        self.profile = get_profile(config.profile, **config.profile_options)
        self.chat = ChatTokenizer(config.tokenizer, self.profile, mrope=config.mrope, tokenizer=tokenizer)
        self.cost_model = None if config.cost is None else self.profile.cost_model(config.cost)

    def measure_many(
        self, raws: list[RawSample], on_probed: Callable[[int], None] | None = None
    ) -> list[tuple[str, dict[str, Any]] | tuple[str, Reject]]:
        """Each of ``raws`` measured, their texts tokenized in one batch: a record, or a reject for a data
        problem (a ``SampleReject``); any other error is a bug and raises ``StageError`` naming the sample.
        ``on_probed(1)`` is called as each sample's media are probed (the per-sample part of the work:
        progress by sample)."""
        results: list[tuple[str, dict[str, Any]] | tuple[str, Reject] | None] = [None] * len(raws)
        ready: list[tuple[int, list[MediaRef], list[MediaPlan]]] = []
        for k, raw in enumerate(raws):
            if raw.error is not None:
                results[k] = "reject", Reject(raw.index, raw.sample_id, raw.source, "read", raw.error)
            else:
                try:
                    refs = raw.media_refs()
                    metas = []
                    for ref in refs:
                        source = resolve_source(
                            ref.path, self.config.media_root, self.config.media_allow_roots, self.config.remote
                        )
                        metas.append(probe(source, ref.kind))
                    ready.append((k, refs, self.profile.plan_sample(metas)))
                except Exception as e:
                    results[k] = self._reject(raw, e)
            if on_probed is not None:
                on_probed(1)
        encoded = self.chat.encode_many(
            [(raws[k].messages, plans, raws[k].tools) for k, _, plans in ready], self.config.max_tokens
        )
        for (k, refs, _), enc in zip(ready, encoded, strict=True):
            if isinstance(enc, Exception):
                results[k] = self._reject(raws[k], enc)
                continue
            try:
                results[k] = "sample", self._record(raws[k], refs, enc)
            except Exception as e:
                raise sample_failed("measure", raws[k].sample_id, raws[k].source, e) from e
        return results  # type: ignore[return-value]

    @staticmethod
    def _reject(raw: RawSample, e: Exception) -> tuple[str, Reject]:
        """A data problem's reject; anything else is a bug, raised naming the sample (never a reject: a
        broken profile must not quietly drop a share of the corpus)."""
        if not isinstance(e, SampleReject):
            raise sample_failed("measure", raw.sample_id, raw.source, e) from e
        return "reject", Reject.of(raw.index, raw.sample_id, raw.source, "measure", e)

    def _record(self, raw: RawSample, refs: list[MediaRef], enc: EncodedSample) -> dict[str, Any]:
        tokens_by_kind = {"image": 0, "video": 0, "audio": 0}
        media = []
        for ref, span in zip(refs, enc.spans, strict=True):
            tokens_by_kind[ref.kind] += span.num_placeholders
            media.append(
                {
                    "kind": ref.kind,
                    "ref": ref.path,
                    "plan": span.plan.to_json(),
                    "span": [span.start, span.end, span.placeholder_start, span.num_placeholders],
                }
            )
        n = enc.num_tokens
        padded = pad_to_multiple(n, self.config.align)
        flops = cost = None
        if self.cost_model is not None:
            flops = media_encoder_flops(self.profile, self.cost_model.shapes, [s.plan for s in enc.spans])
            cost = self.cost_model.sample_cost(padded, flops)
        return {
            "sample_index": raw.index,
            "sample_id": raw.sample_id,
            "source": raw.source,
            "num_tokens": n,
            "padded_length": padded,
            "num_images": sum(r.kind == "image" for r in refs),
            "num_videos": sum(r.kind == "video" for r in refs),
            "num_audios": sum(r.kind == "audio" for r in refs),
            "num_media": len(refs),
            "image_tokens": tokens_by_kind["image"],
            "video_tokens": tokens_by_kind["video"],
            "audio_tokens": tokens_by_kind["audio"],
            "vision_patches": sum(s.plan.vision_patches for s in enc.spans),
            "audio_frames": sum(s.plan.audio_frames for s in enc.spans),
            "media_bytes": sum(media_bytes_estimate(s.plan) for s in enc.spans),
            "encoder_flops": flops,
            "sample_cost": cost,
            "media_json": json.dumps(media),
            "assistant_spans": enc.assistant_spans.reshape(-1),
            "input_ids": enc.input_ids,
            "labels": enc.labels,
            "mrope_position_ids": None
            if enc.mrope_position_ids is None
            else enc.mrope_position_ids.reshape(-1),
        }


def media_bytes_estimate(plan: MediaPlan) -> int:
    """About the bytes a media item takes in a shard, stored raw: frames or an image at the target size as
    uint8 RGB, audio as 4-byte samples (compressed encodings come out smaller); a family's own stored arrays
    (``ModelProfile.store_media``) as the plan records them."""
    stored = plan.info.get("stored_arrays")
    if stored:
        return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in stored.values())
    h, w = plan.target_hw or (0, 0)
    if plan.kind == "video":
        frames = len(plan.frame_indices or ())
    else:  # an image stores one view, or one per ``image_views`` box
        frames = len(plan.image_views or ((),)) if plan.kind == "image" else 0
    return frames * h * w * 3 + 4 * int(plan.num_audio_samples or 0)


# Samples measured (and tokenized) in one call: the tokenizer's batch path runs at its own batch-encode
# speed only on large batches; the byte budget keeps a batch of long samples small.
MEASURE_BATCH = 256
MEASURE_BATCH_BYTES = 8 << 20


def _batches(samples: Iterable[RawSample]) -> Iterator[list[RawSample]]:
    batch: list[RawSample] = []
    size = 0
    for raw in samples:
        if batch and (len(batch) == MEASURE_BATCH or size + raw.size > MEASURE_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(raw)
        size += raw.size
    if batch:
        yield batch


def _list_column(values: list[Any], type_: pa.ListType) -> pa.Array:
    """A list column from per-record numpy arrays (or None): one concatenation and an offsets array
    instead of converting each record's list on its own; other values take pyarrow's own conversion."""
    item = np.dtype(type_.value_type.to_pandas_dtype())
    present = [v for v in values if v is not None]
    if not present or not all(isinstance(v, np.ndarray) and v.dtype == item and v.ndim == 1 for v in present):
        return pa.array(values, type=type_)
    lengths = np.zeros(len(values), dtype=np.int64)
    lengths[[i for i, v in enumerate(values) if v is not None]] = [len(v) for v in present]
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = None if len(present) == len(values) else pa.array([v is None for v in values])
    flat = pa.array(np.concatenate(present), type=type_.value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, type=type_, mask=mask)


def records_to_table(records: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist(records, schema=schema)``, column by column: list columns of numeric arrays
    (token ids, labels) are built in bulk."""
    columns = []
    for f in schema:
        values = [r.get(f.name) for r in records]
        if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type):
            columns.append(_list_column(values, f.type))
        else:
            columns.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)


class TableWriter:
    """Streams dict records into a Parquet file in row groups; with ``tokens_path``, each sample's record
    into a token file as well (``token_file``: the write stage reads a sample there as one byte range),
    its place in it going into the Parquet file's location columns. ``parquet_schema`` (``schema``'s columns
    but the token ones, plus the location columns) is what goes into the Parquet file."""

    def __init__(
        self,
        path: Path,
        schema: pa.Schema,
        batch_rows: int = 2048,
        tokens_path: Path | None = None,
        parquet_schema: pa.Schema | None = None,
    ) -> None:
        self.path, self.schema, self.batch_rows = path, schema, batch_rows
        self._buf: list[dict[str, Any]] = []
        self._parquet_schema = parquet_schema or schema
        self._writer = pq.ParquetWriter(path, self._parquet_schema)
        self._tokens = None if tokens_path is None else open(tokens_path, "wb")  # noqa: SIM115 (closed in close)
        self._tokens_size = 0
        self.count = 0

    def add(self, record: dict[str, Any]) -> None:
        self._buf.append(record)
        self.count += 1
        if len(self._buf) >= self.batch_rows:
            self.flush()

    def write_table(self, table: pa.Table) -> None:
        """``table`` (of this writer's schema) as one more row group (its records appended to the token file)."""
        if self._tokens is not None:
            offsets, sizes = write_records(table, self._tokens, self._tokens_size)
            self._tokens_size += int(sizes.sum())
            for name, values in zip(LOCATION_COLUMNS, (offsets, sizes), strict=True):
                table = table.append_column(name, pa.array(values, pa.int64()))
        self._writer.write_table(table.select(self._parquet_schema.names))

    def flush(self) -> None:
        if self._buf:
            self.write_table(records_to_table(self._buf, self.schema))
            self._buf = []

    def close(self) -> None:
        self.flush()
        self._writer.close()
        if self._tokens is not None:
            self._tokens.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sample_arrays(record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """input_ids, labels and mRoPE ids of a measured record as int32 arrays."""
    ids = np.asarray(record["input_ids"], dtype=np.int32)
    labels = np.asarray(record["labels"], dtype=np.int32)
    mrope = record.get("mrope_position_ids")
    mrope = None if mrope is None else np.asarray(mrope, dtype=np.int32).reshape(3, -1)
    return ids, labels, mrope


# ---- per part

# records (JSONL: lines) per part: enough work to amortise a part's files, small enough to spread
PART_LINES = 4096
PARTS_FILE = "parts.json"

__all__ = ["PART_LINES", "InputPart", "load_parts", "measure_part", "split_input"]


def split_input(
    manifests: list[Path], part_lines: int = PART_LINES, spec: InputSpec | None = None
) -> list[InputPart]:
    """The inputs' parts, in input order (``omnipack.inputs.split_parts``)."""
    return split_parts(manifests, spec or InputSpec(), part_lines)


def parts_key(manifests: list[Path], spec: InputSpec, part_lines: int) -> str:
    """What the input's split depends on: its data files' names, sizes and modification stamps (no reads)."""
    files = [[str(df.path), *file_stamp(df.path)] for _, df in data_files(manifests, spec)]
    return digest({"files": files, "part_lines": part_lines, "inputs": spec.settings()})


def load_parts(
    stages: Path, manifests: list[Path], spec: InputSpec, part_lines: int, *, poll_s: float = 0.2
) -> list[InputPart]:
    """The input's parts, split once and kept in ``stages/parts.json`` while the data files and the reading
    settings stay the same (so every rerun sees the same parts without reading the input again).

    The ranks of a staged run start together: the first to create ``stages/parts-KEY.claim`` (a
    create-if-absent file or object) reads the input and writes ``parts.json``; the others wait for it
    instead of each reading the whole input, and get the very same parts. A claim left by a dead process
    (on this host), or one not renewed within its expiry (another host), is taken over."""
    key = parts_key(manifests, spec, part_lines)
    cache, claim = stages / PARTS_FILE, stages / f"parts-{key[:16]}.claim"
    make_dirs(stages)
    while True:
        record = read_record(cache, key)
        if record is not None:
            return [InputPart(**p) for p in record["parts"]]
        mine = lock_owner()
        if create_exclusive(claim, json.dumps(mine).encode()):
            try:
                with lock_renewed(claim, mine):  # a long split on another host is not taken for a dead one
                    record = read_record(cache, key)  # written between our look and our claim
                    if record is not None:
                        return [InputPart(**p) for p in record["parts"]]
                    parts = split_input(manifests, part_lines, spec)
                    write_json_atomic(cache, {"key": key, "parts": [asdict(p) for p in parts]})
                    return parts
            finally:
                claim.unlink(missing_ok=True)
        try:
            holder = json.loads(claim.read_text())
        except (OSError, json.JSONDecodeError):
            holder = None  # released (or being written) right now: look again
        if holder is not None and not lock_holder_live(holder):
            claim.unlink(missing_ok=True)  # its splitter died: take over
            continue
        time.sleep(poll_s)


def measure_settings(spec: RunSpec) -> dict[str, Any]:
    """Everything a part's measured output depends on besides its bytes."""
    return {
        "omnipack_version": __version__,
        # timeouts change how a part is measured, not what: a resumed run may change them
        "measure": {**asdict(spec.measure), "remote": spec.measure.remote.access()},
        "media_root": media_root_key(spec.measure.media_root),
        "tokenizer_fingerprint": spec.facts.tokenizer_fingerprint,
        "max_line_bytes": spec.max_line_bytes,
        "inputs": spec.inputs.settings() if spec.inputs is not None else None,  # format, layout, field map
        "part_layout": PART_LAYOUT,
    }


def part_key(spec: RunSpec, part: InputPart) -> str:
    return digest({**measure_settings(spec), "part": asdict(part), "name": Path(part.path).name})


def part_files(measure_dir: Path, number: int) -> dict[str, Path]:
    stem = f"part-{number:06d}"
    return {
        "samples": measure_dir / f"{stem}.parquet",
        "rejects": measure_dir / f"{stem}.rejects.parquet",
        "tokens": measure_dir / f"{stem}.tokens",
        "record": measure_dir / f"{stem}.json",
    }


def outputs_intact(record: PartRecord, root: Path) -> bool:
    """A recorded unit's files are all there as recorded: the same stamps, or sizes and checksums."""
    return all(info.unchanged(root / name) for name, info in record.files.items())


def read_part_record(spec: RunSpec, number: int, *, check_key: bool = True) -> PartRecord | None:
    """Part ``number``'s record when it was made with the current settings (or, without ``check_key``,
    whatever settings); None when the part is not measured."""
    if check_key:
        return MEASURE.current(spec, None, number)
    try:
        return PartRecord.from_json(json.loads(part_files(spec.measure_dir, number)["record"].read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def local_measure_config(
    config: MeasureConfig, shipped: ShippedModel | None, options: tuple[tuple[str, ShippedModel], ...] = ()
) -> MeasureConfig:
    """``config`` reading its tokenizer (and the preprocessor configs its profile options name) from this
    machine's copy of the run's shipped files, on every node (the driver's too): a worker reads exactly the
    files its spec names, even where the folder at the named path is missing or was edited since."""
    if shipped is None:
        return config
    profile_options = dict(config.profile_options)
    for key, copy in options:
        profile_options[key] = os.path.join(local_copy(copy), copy.files[0][0])
    return replace(config, tokenizer=local_copy(shipped), profile_options=profile_options)


def worker_measurer(
    context: WorkerContext,
    config: MeasureConfig,
    shipped: ShippedModel | None = None,
    options: tuple[tuple[str, ShippedModel], ...] = (),
) -> Measurer:
    """The worker's Measurer for ``config``, reading the shipped files from this machine's copies
    (``local_measure_config``): made once per worker (the tokenizer load, the profile's setup) for all the
    parts it measures. Keyed by the settings, the shipped files' digests and the cache holding their copies,
    so by content, not by a folder that may have been edited."""
    key = digest({"config": asdict(config), "shipped": shipped, "options": options, "cache": str(cache_dir())})

    def make() -> Measurer:
        # the tokenizer the driver loaded from the same files, where the executor sent it (``offer_tokenizer``)
        loaded = None if shipped is None else context.offered(TOKENIZER_OFFER, tokenizer_offer_key(shipped))
        return Measurer(local_measure_config(config, shipped, options), loaded)

    return context.kept("measurer", key, make)


def measure_part(spec: RunSpec, number: int, context: WorkerContext) -> PartRecord:
    """Measure one part (or reuse its earlier output when its record matches); returns its record."""
    return run_once(
        "measure",
        number,
        part_files(spec.measure_dir, number)["record"],
        part_key(spec, spec.parts[number]),
        PartRecord.from_json,
        lambda record: outputs_intact(record, spec.measure_dir),
        lambda: _measure(spec, number, worker_measurer(context, spec.measure, spec.model, spec.model_options)),
    )[0]


def _measure(spec: RunSpec, number: int, measurer: Measurer) -> PartRecord:
    """Part ``number`` measured by ``measurer``: its tables published, and its record (keyed by
    ``run_once``)."""
    files = part_files(spec.measure_dir, number)
    make_dirs(spec.measure_dir)
    remove_partials(spec.measure_dir, f"part-{number:06d}.*")  # of this unit, by a killed run
    cache_stats = getattr(measurer.profile, "cache_stats", None)  # a processor-backed profile's cache
    cache_before = cache_stats() if cache_stats else {}
    tmp = {name: staging_file(p) for name, p in files.items() if name != "record"}
    measured, rejected = _measure_into(spec, number, measurer, tmp)
    outputs = {
        files[name].name: RecordedFile(tmp[name].stat().st_size, file_xxh3(tmp[name]))
        for name in ("samples", "rejects", "tokens")
    }
    for name, path in tmp.items():
        publish(path, files[name])
    for name in ("samples", "rejects", "tokens"):  # as published (a rename moves the ctime)
        outputs[files[name].name].stamp = output_stamp(files[name])
    cost_model = None if measurer.cost_model is None else measurer.cost_model.describe()
    part = spec.parts[number]
    record = PartRecord("", number, part, measured + rejected, measured, rejected, outputs, cost_model)
    if cache_stats:  # this part's processor calls and cache hits, per media kind (summed in omnipack.json)
        record.processor_cache = {
            kind: {k: n - cache_before.get(kind, {}).get(k, 0) for k, n in counts.items()}
            for kind, counts in cache_stats().items()
        }
    return record


def _measure_into(spec: RunSpec, number: int, measurer: Measurer, tmp: dict[str, Path]) -> tuple[int, int]:
    """Part ``number``'s samples and rejects written to the staging files ``tmp``; their counts."""
    part: InputPart = spec.parts[number]
    samples: list[RawSample]
    with (
        TableWriter(
            tmp["samples"], SAMPLES_SCHEMA, tokens_path=tmp["tokens"], parquet_schema=SAMPLES_PARQUET_SCHEMA
        ) as good,
        TableWriter(tmp["rejects"], REJECTS_SCHEMA) as bad,
    ):
        for samples in _batches(
            read_part(part, spec.inputs or InputSpec(max_record_bytes=spec.max_line_bytes))
        ):
            for kind, rec in measurer.measure_many(samples, lambda n: progress.advance("measure", number, n)):
                if kind == "sample":
                    good.add(rec)
                else:
                    bad.add(rec.to_json())
    pa.default_memory_pool().release_unused()
    return good.count, bad.count


def part_offsets(parts: Sequence[PartSpan | PartRecord]) -> np.ndarray:
    """Global sample index of each part's first record, plus the total: [P + 1]."""
    return np.concatenate([[0], np.cumsum([p.records for p in parts])]).astype(np.int64)


def read_measured(
    measure_dir: Path, parts: Sequence[PartSpan | PartRecord], columns: list[str], *, rejects: bool = False
) -> pa.Table:
    """The measured samples (or rejects) of all parts as one table, ``sample_index`` made global. Samples
    have the columns of ``SAMPLES_PARQUET_SCHEMA`` here (the token columns are in the parts' token files)."""
    offsets = part_offsets(parts)
    tables = []
    for rec, offset in zip(parts, offsets[:-1], strict=False):
        files = part_files(measure_dir, rec.number)
        table = read_parquet(files["rejects" if rejects else "samples"], columns=columns)
        if "sample_index" in columns:
            i = table.schema.get_field_index("sample_index")
            table = table.set_column(
                i, "sample_index", pc.add(table.column(i), pa.scalar(int(offset), pa.int64()))
            )
        tables.append(table)
    schema = REJECTS_SCHEMA if rejects else SAMPLES_PARQUET_SCHEMA
    if not tables:
        return pa.table({c: pa.array([], schema.field(c).type) for c in columns})
    return pa.concat_tables(tables)


def read_run_measured(stages: Path, columns: list[str]) -> pa.Table | None:
    """A finished run's measured samples (global ``sample_index``), from the parts its plan used, less the
    duplicates the pack stage dropped; None when the run has no plan."""
    plan = PlanRecord.read(stages / "plan.json")
    if plan is None:
        return None
    table = read_measured(stages / "measure", plan.spans, sorted({*columns, "sample_index"}))
    dropped = pa.array(plan.dropped_duplicates, pa.int64())
    table = table.filter(pc.invert(pc.is_in(table.column("sample_index"), value_set=dropped)))
    return table.select(columns)


def _describe(spec: RunSpec, units: list[int], total: int) -> str:
    files = len({spec.parts[u].path for u in units})
    return f"{total:,} records in {len(units)} parts of {files} input file(s)"


MEASURE: Stage[PartRecord] = Stage(
    "measure",
    units=lambda spec, plan: [p.number for p in spec.parts],
    key=lambda spec, plan, number: part_key(spec, spec.parts[number]),
    record_path=lambda spec, number: part_files(spec.measure_dir, number)["record"],
    load=PartRecord.from_json,
    run=measure_part,
    size=lambda spec, plan, number: spec.parts[number].num_lines or spec.parts[number].num_records,
    item="records",
    bar_item="samples",
    describe=_describe,
)
