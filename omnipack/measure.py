"""Measure stage: a pure function per sample from a manifest line to a measured record or a reject.

Each record holds the expanded token ids and labels, media plans with their spans, and the lengths the
packer needs. Records go to an Arrow IPC file (everything) and a Parquet table (the per-sample columns,
no token columns), rejects to ``rejects.parquet``, so
the pack stage can be rerun alone, and measuring can be split across machines and packed once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .alignment import pad_to_multiple
from .errors import Reject, SampleReject, sample_failed
from .manifest import MediaRef, RawSample
from .media.probe import probe
from .media.remote import DEFAULT_REMOTE, RemoteSettings
from .media.sources import resolve_source
from .profiles import get_profile
from .profiles.base import MediaPlan
from .profiles.cost import media_encoder_flops
from .text.chat import ChatTokenizer, EncodedSample

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
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("mrope_position_ids", pa.list_(pa.int32())),  # flattened [3, L], null when not computed
    ]
)
# The token columns travel only in a measured part's Arrow copy (the write stage reads them there); its
# Parquet file holds the per-sample columns the pack and finalize stages read, a few dozen bytes a sample
# instead of eight per token.
TOKEN_COLUMNS = ("input_ids", "labels", "mrope_position_ids")
SAMPLES_PARQUET_SCHEMA = pa.schema([f for f in SAMPLES_SCHEMA if f.name not in TOKEN_COLUMNS])
REJECTS_SCHEMA = pa.schema(  # a part's rejects: the fields of ``Reject``
    [
        ("sample_index", pa.int64()),
        ("sample_id", pa.string()),
        ("source", pa.string()),
        ("stage", pa.string()),
        ("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class MeasureConfig:
    """Everything a worker needs to measure samples; plain data so it can cross process boundaries."""

    profile: str
    tokenizer: str
    media_root: str | None  # None: no relative media paths (every reference embedded or absolute)
    align: int = 1
    profile_options: dict[str, Any] = field(default_factory=dict)
    mrope: bool = False
    max_tokens: int | None = None  # the row length: longer samples may be rejected before tokenizing
    media_allow_roots: tuple[str, ...] = ()  # folders outside the media root that symlinks may point into
    remote: RemoteSettings = DEFAULT_REMOTE  # how media URLs are fetched (timeouts, private addresses)
    # the config's cost-model overrides (profiles.cost); None: no cost columns (the profile has no model)
    cost: dict[str, Any] | None = None


class Measurer:
    """Per-process measuring context: the profile and the tokenizer, loaded once."""

    def __init__(self, config: MeasureConfig) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the pool parallelises, not the tokenizer
        self.config = config
        self.profile = get_profile(config.profile, **config.profile_options)
        self.chat = ChatTokenizer(config.tokenizer, self.profile, mrope=config.mrope)
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
                    plans = []
                    for ref in refs:
                        source = resolve_source(
                            ref.path, self.config.media_root, self.config.media_allow_roots, self.config.remote
                        )
                        meta = probe(source, ref.kind)
                        plans.append(self.profile.plan(meta))
                    ready.append((k, refs, plans))
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
    """Streams dict records into a Parquet file in row groups; with ``arrow_path``, the same record batches
    into an Arrow IPC file as well (the write stage memory-maps it: Parquet pages can not be), written from
    the tables in hand rather than by reading the Parquet file back. ``parquet_schema`` (a subset of
    ``schema``'s columns) limits what goes into the Parquet file."""

    def __init__(
        self,
        path: Path,
        schema: pa.Schema,
        batch_rows: int = 2048,
        arrow_path: Path | None = None,
        parquet_schema: pa.Schema | None = None,
    ) -> None:
        self.path, self.schema, self.batch_rows = path, schema, batch_rows
        self._buf: list[dict[str, Any]] = []
        self._parquet_columns = None if parquet_schema is None else parquet_schema.names
        self._writer = pq.ParquetWriter(path, parquet_schema or schema)
        self._arrow_sink = self._arrow = None
        if arrow_path is not None:
            self._arrow_sink = pa.OSFile(str(arrow_path), "wb")
            self._arrow = pa.ipc.new_file(self._arrow_sink, schema)
        self.count = 0

    def add(self, record: dict[str, Any]) -> None:
        self._buf.append(record)
        self.count += 1
        if len(self._buf) >= self.batch_rows:
            self.flush()

    def write_table(self, table: pa.Table) -> None:
        """``table`` (of this writer's schema) as one more row group (and record batch)."""
        self._writer.write_table(table if self._parquet_columns is None else table.select(self._parquet_columns))
        if self._arrow is not None:
            self._arrow.write_table(table)

    def flush(self) -> None:
        if self._buf:
            self.write_table(records_to_table(self._buf, self.schema))
            self._buf = []

    def close(self) -> None:
        self.flush()
        self._writer.close()
        if self._arrow is not None:
            self._arrow.close()
            self._arrow_sink.close()

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
