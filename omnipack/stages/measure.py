"""Measure stage: one input part (a record range of one input file) -> its measured samples and rejects.

The input is split into parts of about ``part_lines`` records each, never across files, by each file's
reader (``omnipack.inputs``: JSONL by line ends, Parquet by row groups, JSON arrays and Arrow by record
ranges), so a part is a plain-data unit (``InputPart``) this stage reads without knowing the format. A
part's samples go to ``stages/measure/part-K.parquet`` (the per-sample columns) and ``part-K.arrow`` (those
plus the token columns, for the write stage's in-place reads), and its rejects to ``part-K.rejects.parquet``, keyed by their record index within
the part: the pack stage turns (part, record) into the global sample index once every part is measured, so
no part needs to know how many records the parts before it hold.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import __version__, progress
from ..inputs import InputPart, InputSpec, data_files, read_part, split_parts
from ..inputs.base import file_stamp
from ..manifest import RawSample
from ..measure import (
    REJECTS_SCHEMA,
    SAMPLES_PARQUET_SCHEMA,
    SAMPLES_SCHEMA,
    MeasureConfig,
    Measurer,
    TableWriter,
    _batches,
)
from ..media.sources import media_root_key
from .lock import holder_live as lock_holder_live
from .lock import owner as lock_owner
from .lock import renewed as lock_renewed
from .model_files import local_measure_config
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
from .spec import RunSpec
from .storage import create_exclusive, make_dirs, publish, read_parquet, remove_partials, staging_file
from .unit import Stage, run_once

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
        "tokenizer_fingerprint": spec.summary.get("tokenizer_fingerprint"),
        "max_line_bytes": spec.max_line_bytes,
        "inputs": spec.inputs.settings() if spec.inputs is not None else None,  # format, layout, field map
    }


def part_key(spec: RunSpec, part: InputPart) -> str:
    return digest({**measure_settings(spec), "part": asdict(part), "name": Path(part.path).name})


def part_files(measure_dir: Path, number: int) -> dict[str, Path]:
    stem = f"part-{number:06d}"
    return {
        "samples": measure_dir / f"{stem}.parquet",
        "rejects": measure_dir / f"{stem}.rejects.parquet",
        "arrow": measure_dir / f"{stem}.arrow",
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


_MEASURERS: dict[str, Measurer] = {}


def _measurer(config: MeasureConfig) -> Measurer:
    """This process's Measurer (the tokenizer is loaded once per worker, for all the parts it measures)."""
    key = digest(asdict(config))
    if key not in _MEASURERS:
        _MEASURERS[key] = Measurer(config)
    return _MEASURERS[key]


def measure_part(spec: RunSpec, number: int) -> PartRecord:
    """Measure one part (or reuse its earlier output when its record matches); returns its record."""
    return run_once(
        "measure",
        number,
        part_files(spec.measure_dir, number)["record"],
        part_key(spec, spec.parts[number]),
        PartRecord.from_json,
        lambda record: outputs_intact(record, spec.measure_dir),
        lambda: _measure(spec, number),
    )[0]


def _measure(spec: RunSpec, number: int) -> PartRecord:
    """Part ``number`` measured: its tables published, and its record (keyed by ``run_once``)."""
    files = part_files(spec.measure_dir, number)
    make_dirs(spec.measure_dir)
    remove_partials(spec.measure_dir, f"part-{number:06d}.*")  # of this unit, by a killed run
    measurer = _measurer(local_measure_config(spec.measure, spec.model, spec.model_options))  # shipped files
    cache_stats = getattr(measurer.profile, "cache_stats", None)  # a processor-backed profile's cache
    cache_before = cache_stats() if cache_stats else {}
    tmp = {name: staging_file(p) for name, p in files.items() if name != "record"}
    measured, rejected = _measure_into(spec, number, measurer, tmp)
    outputs = {
        files[name].name: RecordedFile(tmp[name].stat().st_size, file_xxh3(tmp[name]))
        for name in ("samples", "rejects", "arrow")
    }
    for name, path in tmp.items():
        publish(path, files[name])
    for name in ("samples", "rejects", "arrow"):  # as published (a rename moves the ctime)
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
            tmp["samples"], SAMPLES_SCHEMA, arrow_path=tmp["arrow"], parquet_schema=SAMPLES_PARQUET_SCHEMA
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
    have the columns of ``SAMPLES_PARQUET_SCHEMA`` here (the token columns are in the parts' Arrow copies)."""
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
