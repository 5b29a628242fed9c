"""``omnipack verify DATASET``: prove a written dataset still satisfies the packed-row contract.

Each shard is read once (checksum, tar index and every row in one sequential pass), shards in parallel;
the row invariants come from ``omnipack.contract`` so the writer and this tool cannot drift apart.
Every failure names its shard, row and sample(s); the exit status is non-zero on any failure.
"""

from __future__ import annotations

import argparse
import functools
import json
import struct
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..codec import npy_header
from ..contract import (
    BOUNDARY_PARTS,
    FORMAT_VERSION,
    META_PART,
    OPTIONAL_TOKEN_PARTS,
    TOKEN_PARTS,
    media_placeholder_errors,
    part_name,
    row_invariant_errors,
)
from .dataset_reader import Dataset, ShardReader, default_workers, map_shards, open_dataset, read_index

# (name, what it proves), in report order.
CHECKS: list[tuple[str, str]] = [
    ("metadata", "omnipack.json, .info.json and split.yaml readable; align matches the parallel layout"),
    ("shard-files", "shards named by omnipack.json, .info.json and split.yaml agree and exist, no strays"),
    ("checksums", "each shard's size and sha256 match those recorded at write time"),
    ("tar-index", "each .tar.idx holds the offset of every row's first header, then the data end"),
    ("shard-counts", "rows per shard match .info.json and omnipack.json; row keys unique"),
    ("row-parts", "every row has all required parts and decodes; each media part present, none stray"),
    ("row-meta", "meta.json agrees with the arrays (W, samples, real tokens, max seqlens, version)"),
    ("row-contract", "boundaries, alignment, padding mask, position resets, labels (omnipack.contract)"),
    (
        "media",
        "placeholder tokens per media block match num_tokens, grid_thw and the stored payload's features",
    ),
    ("accounting", "input = packed + rejected; no sample twice; packed ids in the measure table"),
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
    profile: str | None = None  # JSON {name, options}: decode payloads and count their features


@dataclass
class ShardReport:
    shard: str
    rows: int = 0
    failures: dict[str, list[str]] = field(default_factory=dict)
    samples: list[tuple[str, str]] = field(default_factory=list)  # (sample id, where)
    notes: set[str] = field(default_factory=set)  # media checks that could not run

    def fail(self, check: str, msg: str) -> None:
        self.failures.setdefault(check, []).append(msg)


def _image_hw(part: str, data: bytes) -> tuple[int, int] | None:
    """(height, width) of a stored image from its header only; None for other encodings."""
    if part.endswith(".png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return h, w
    if part.endswith(".npy"):
        shape = npy_header(data).shape  # header only, no payload
        return (int(shape[0]), int(shape[1])) if len(shape) >= 2 else None
    return None


def _describe(job: ShardJob, local: int, key: str, sample_ids: list[str]) -> str:
    ids = ", ".join(sample_ids[:3]) + (f", … (+{len(sample_ids) - 3})" if len(sample_ids) > 3 else "")
    return f"{job.shard} row {local} (key {key}, global row {job.first_row + local}; samples {ids})"


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
    rep.samples.extend((sid, where) for sid in row.sample_ids)

    media_parts = {m.part for m in row.media}
    absent = sorted(p for p in media_parts if p not in raw.parts)
    stray = sorted(p for p in raw.parts if p not in KNOWN_PARTS and p not in media_parts)
    if absent:
        rep.fail("row-parts", f"{where}: media parts missing: {absent}")
    if stray:
        rep.fail("row-parts", f"{where}: parts not named by meta.json: {stray}")
    if len(media_parts) != len(row.media):
        rep.fail("row-parts", f"{where}: two media items share a part")

    w = row.seq_length
    if w != job.seq_length:
        rep.fail("row-meta", f"{where}: W={w}, dataset seq_length={job.seq_length}")
    for name in ("seq_length", "max_seqlen", "max_seqlen_padded", "num_real_tokens", "format_version"):
        if name not in meta:
            rep.fail("row-meta", f"{where}: meta.json lacks {name!r}")
    if meta.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        rep.fail("row-meta", f"{where}: format_version {meta.get('format_version')} != {FORMAT_VERSION}")
    if row.mrope_position_ids is not None and row.mrope_position_ids.shape != (3, w):
        rep.fail(
            "row-contract", f"{where}: mrope_position_ids shape {row.mrope_position_ids.shape} != (3, {w})"
        )

    errs = row_invariant_errors(row, job.align)
    for e in errs:
        rep.fail("row-contract", f"{where}: {e}")
    shape_ok = len(row.cu_seqlens) == len(row.sample_ids) + 1 == len(row.cu_seqlens_padded)
    if not shape_ok or any("shape" in e for e in errs):
        return  # later checks index by the boundaries
    for name, expected in (
        ("seq_length", w),
        ("max_seqlen", row.max_seqlen),
        ("max_seqlen_padded", row.max_seqlen_padded),
        ("num_real_tokens", int(row.seqlens.sum())),
    ):
        if name in meta and meta[name] != expected:
            rep.fail("row-meta", f"{where}: meta.json {name}={meta[name]}, the arrays say {expected}")

    unknown = {m.kind for m in row.media} - set(job.placeholder_ids or {})
    if unknown and job.placeholder_ids is not None:
        rep.notes.update(f"{k} blocks not counted: no placeholder id recorded for {k}" for k in unknown)
    if job.placeholder_ids is not None:  # rows without media too: a stray placeholder is an error
        for e in media_placeholder_errors(row, job.placeholder_ids, job.merge_sizes):
            rep.fail("media", f"{where}: {e}")
    for i, m in enumerate(row.media):
        target = (m.info or {}).get("target_hw")
        if m.kind != "image" or target is None or m.part not in raw.parts:
            continue
        try:
            hw = _image_hw(m.part, raw.parts[m.part])
        except Exception as e:
            rep.fail("media", f"{where}: media {i} ({m.part}) header unreadable: {e}")
            continue
        if hw is not None and list(hw) != list(target):
            rep.fail("media", f"{where}: media {i} ({m.part}) stored {hw[0]}x{hw[1]}, target_hw {target}")
    if job.profile is not None and row.media:
        _check_payloads(job, row, raw, where, rep)


@functools.cache
def _profile(spec: str) -> Any:
    from ..profiles import get_profile

    d = json.loads(spec)
    return get_profile(d["name"], **d.get("options", {}))


def _check_payloads(job: ShardJob, row: Any, raw: Any, where: str, rep: ShardReport) -> None:
    """Each stored payload must yield exactly the features its block has placeholders for."""
    from ..loader.media import decode_payload

    profile = _profile(job.profile)
    for i, m in enumerate(row.media):
        if m.part not in raw.parts:
            continue  # reported by row-parts
        try:
            features = profile.feature_count(m, decode_payload(m.part, raw.parts[m.part]))
        except Exception as e:
            rep.fail("media", f"{where}: media {i} ({m.part}) payload unusable: {type(e).__name__}: {e}")
            continue
        if features != m.num_tokens:
            rep.fail(
                "media",
                f"{where}: media {i} ({m.kind} {m.part}) stored payload gives {features} features, "
                f"block has {m.num_tokens} placeholders",
            )


def verify_shard(job: ShardJob) -> ShardReport:
    """All per-shard checks in one sequential read of the shard."""
    rep = ShardReport(job.shard)
    path = Path(job.root) / job.shard
    if not path.is_file():
        rep.fail("shard-files", f"{job.shard}: file missing")
        return rep
    reader = ShardReader(path, checksum=True)
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
    if job.recorded is None:
        rep.fail("checksums", f"{job.shard}: no checksum recorded in omnipack.json")
    else:
        if size != job.recorded.get("num_bytes"):
            rep.fail("checksums", f"{job.shard}: {size} bytes, recorded {job.recorded.get('num_bytes')}")
        if reader.sha256 != job.recorded.get("sha256"):
            rep.fail(
                "checksums", f"{job.shard}: sha256 {reader.sha256} != recorded {job.recorded.get('sha256')}"
            )
        if job.recorded.get("count") != rep.rows:
            rep.fail(
                "shard-counts",
                f"{job.shard}: {rep.rows} rows, omnipack.json says {job.recorded.get('count')}",
            )
    if job.expected_count is not None and job.expected_count != rep.rows:
        rep.fail("shard-counts", f"{job.shard}: {rep.rows} rows, .info.json says {job.expected_count}")

    idx_path = Path(str(path) + ".idx")
    if not idx_path.is_file():
        rep.fail("tar-index", f"{job.shard}.idx: missing")
    else:
        idx = read_index(idx_path).astype(np.int64).tolist()
        expected = [*offsets, reader.data_end]
        if len(idx) != len(expected):
            rep.fail("tar-index", f"{job.shard}.idx: {len(idx)} entries, the tar needs {len(expected)}")
        elif idx != expected:
            bad = next(i for i, (a, b) in enumerate(zip(idx, expected, strict=True)) if a != b)
            what = "data end" if bad == len(offsets) else f"row {bad}"
            rep.fail(
                "tar-index",
                f"{job.shard}.idx: entry {bad} ({what}) is {idx[bad]}, the tar has {expected[bad]}",
            )
    return rep


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
        from ..profiles import get_profile
        from ..profiles.base import dataset_placeholder_ids

        profile = ds.meta.get("profile") or {}
        ids, source = dataset_placeholder_ids(
            ds.meta, get_profile(profile.get("name", ""), **(profile.get("options") or {})), tokenizer
        )
    except Exception as e:
        return None, f"placeholder ids unavailable: {type(e).__name__}: {e}"
    return ids, source if ids is not None else f"{source} (use --tokenizer)"


def _dataset_checks(ds: Dataset, results: dict[str, CheckResult]) -> None:
    from ..alignment import ParallelLayout

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
    on_disk = {str(p.relative_to(ds.root)) for p in ds.root.rglob("*.tar") if ".nv-meta" not in p.parts}
    stray = sorted(on_disk - recorded - info)
    if stray:
        sf.failures.append(f"tar files not named by any metadata: {stray}")


def _accounting(
    ds: Dataset, reports: list[ShardReport], res: CheckResult, measure_check: bool = True
) -> None:
    counts = ds.meta.get("counts") or {}
    rejects = ds.rejects()
    seen: dict[str, str] = {}
    for rep in reports:
        for sid, where in rep.samples:
            if sid in seen:
                res.failures.append(f"sample {sid} packed twice: {seen[sid]} and {where}")
            else:
                seen[sid] = where
    packed = sum(len(r.samples) for r in reports)
    rows = sum(r.rows for r in reports)
    n_in, n_packed, n_rej = counts.get("input"), counts.get("packed"), counts.get("rejected")
    if n_in is not None and n_packed is not None and n_rej is not None and n_in != n_packed + n_rej:
        res.failures.append(f"omnipack.json: input {n_in} != packed {n_packed} + rejected {n_rej}")
    if n_packed is not None and packed != n_packed:
        res.failures.append(f"{packed} samples in the shards, omnipack.json says {n_packed} packed")
    if counts.get("rows") is not None and rows != counts["rows"]:
        res.failures.append(f"{rows} rows in the shards, omnipack.json says {counts['rows']}")
    if n_rej is not None and len(rejects) != n_rej:
        res.failures.append(f"{len(rejects)} lines in rejects.jsonl, omnipack.json says {n_rej} rejected")
    by_stage = dict(Counter(r.get("stage") for r in rejects))
    if counts.get("rejected_by_stage") is not None and by_stage != counts["rejected_by_stage"]:
        res.failures.append(
            f"rejects.jsonl by stage {by_stage} != omnipack.json {counts['rejected_by_stage']}"
        )
    rej_ids = Counter(r.get("sample_index") for r in rejects)
    twice = [i for i, n in rej_ids.items() if n > 1]
    if twice:
        res.failures.append(f"samples rejected twice (sample_index): {sorted(twice)[:10]}")
    both = sorted(set(seen) & {r.get("sample_id") for r in rejects})
    if both:
        res.failures.append(f"samples both packed and rejected: {both[:10]}")

    samples = ds.root / "stages" / "measure" / "samples.parquet"
    if not measure_check:
        return
    if not samples.exists():
        res.notes.append("no stages/measure/samples.parquet: packed ids not checked against it")
        return
    import pyarrow.parquet as pq

    table = pq.read_table(samples, columns=["sample_index", "sample_id"])
    measured = set(table.column("sample_id").to_pylist())
    unknown = [s for s in seen if s not in measured]
    if unknown:
        res.failures.append(
            f"{len(unknown)} packed samples not in the measure table, e.g. "
            + "; ".join(f"{s} in {seen[s]}" for s in unknown[:3])
        )
    if counts.get("measured") is not None and table.num_rows != counts["measured"]:
        res.failures.append(
            f"measure table has {table.num_rows} samples, omnipack.json says {counts['measured']}"
        )
    idx = set(table.column("sample_index").to_pylist())
    overlap = sorted(idx & {r.get("sample_index") for r in rejects if r.get("stage") in ("read", "measure")})
    if overlap:
        res.failures.append(f"sample_index both measured and rejected before measuring: {overlap[:10]}")


def run_verify(
    root: str | Path,
    *,
    workers: int = 1,
    tokenizer: str | None = None,
    progress: bool | None = None,
    payloads: bool = True,
) -> list[CheckResult]:
    """Run every check over the dataset at ``root``; returns one result per check, in ``CHECKS`` order.

    ``payloads`` decodes every stored media item and counts the features it yields (the heavy part)."""
    ds = open_dataset(root)
    results = {name: CheckResult(name, desc) for name, desc in CHECKS}
    _dataset_checks(ds, results)
    prof = ds.meta.get("profile") or {}
    profile_spec = None
    if payloads and prof.get("name"):
        profile_spec = json.dumps({"name": prof["name"], "options": prof.get("options") or {}})
        try:
            _profile(profile_spec)
        except Exception as e:
            results["media"].notes.append(f"payload features not checked: profile unusable: {e}")
            profile_spec = None

    ph_ids, source = placeholder_ids_for(ds, tokenizer)
    if ph_ids is None:
        results["media"].skipped = f"placeholder counts not checked: {source}"
    else:
        results["media"].notes.append(f"placeholder ids {ph_ids} from {source}")
    counts = ds.shard_counts if ds.info is not None else {}
    recorded = ds.recorded_shards
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
            )
        )
        first += counts.get(shard, (recorded.get(shard) or {}).get("count", 0))
    if not jobs:
        results["shard-files"].failures.append("the dataset names no shards")
    reports = map_shards(verify_shard, jobs, workers=workers, progress=progress, label="verify")
    for rep in reports:
        for check, msgs in rep.failures.items():
            results[check].failures.extend(msgs)
    results["media"].notes += sorted({n for rep in reports for n in rep.notes})
    _accounting(ds, reports, results["accounting"])
    return [results[n] for n in CHECK_NAMES]


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
    results = run_verify(
        args.dataset,
        workers=args.workers,
        tokenizer=args.tokenizer,
        progress=False if args.json else args.progress,
        payloads=args.payloads,
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
    p.add_argument("--workers", "-j", type=int, default=default_workers(), help="processes (one shard each)")
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
        help="decode every stored media item and count its features (default; --no-payloads skips it)",
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bar")
    p.set_defaults(func=cmd_verify)
