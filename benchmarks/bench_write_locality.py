"""Bytes a write unit reads from an object store, against its shard's token bytes (issue 24 item 6).

Prepares the text corpus of ``bench_prepare.py`` into a local S3 server (moto's, which logs every request
it answers: ``tests/s3_server.py``), split into ``--parts`` measure parts, then runs write units one at a
time as fresh processes on other nodes would (nothing kept from an earlier unit) and counts each one's GET
requests and their body bytes. A shard's token bytes are its samples' token arrays as measured: 4 bytes a
token for the ids and for the labels, 12 more for mRoPE ids when the run keeps them.

    PYTHONPATH=. python benchmarks/bench_write_locality.py --samples 20000 --parts 20 --units 8
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_prepare import build_corpus, build_tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--parts", type=int, default=20)
    ap.add_argument("--shard-mb", type=float, default=2.0, help="the layout's shard size (estimated MB)")
    ap.add_argument("--units", type=int, default=8, help="write units measured (spread over the shards)")
    args = ap.parse_args()

    import fsspec

    from omnipack.pipeline import PrepareConfig, build_spec, run_prepare
    from omnipack.stages import write
    from omnipack.stages.records import PlanRecord
    from omnipack.stages.storage import staging_dir
    from omnipack.stages.worker import WorkerContext
    from tests.s3_server import S3Server

    manifest, tokenizer = build_corpus(args.samples, "short"), build_tokenizer(65536)
    with S3Server() as s3, tempfile.TemporaryDirectory() as tmp:
        s3.bucket("bench")
        cfg = PrepareConfig(
            manifest=[str(manifest)], media_root=tmp, tokenizer=str(tokenizer), output="s3://bench/run",
            seq_length=4096, part_lines=-(-args.samples // args.parts), shard_size_mb=args.shard_mb,
            mrope=False, progress=False,
        )  # fmt: skip
        t0 = time.perf_counter()
        run_prepare(cfg, stage="measure")
        run_prepare(cfg, stage="pack")
        print(f"measure + pack: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        spec = build_spec(cfg)
        plan = PlanRecord.read(spec.plan_record)
        measured = fsspec.filesystem("s3").du("bench/run/stages/measure")
        per_token = 4 * (2 + 3 * spec.measure.mrope)
        picks = np.unique(np.linspace(0, len(plan.shards) - 1, args.units).round().astype(int)).tolist()
        rows = []
        for number in picks:
            shutil.rmtree(staging_dir() / "cache", ignore_errors=True)
            first = len(s3.requests)
            t = time.perf_counter()
            record = write.write_shard(spec, number, WorkerContext())  # a fresh worker: nothing kept
            seconds = time.perf_counter() - t
            gets = [r for r in s3.requests[first:] if r.method == "GET"]
            read, tokens = sum(r.sent for r in gets), record.real_tokens * per_token
            rows.append((number, len(gets), read, tokens, read / tokens, seconds))
        print(
            f"{args.samples} samples, {len(plan.parts)} measure parts ({measured / 2**20:.1f} MiB on the "
            f"store), {len(plan.shards)} shards"
        )
        print("| shard | GETs | MiB read | shard token MiB | read / token bytes | unit s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for number, n, read, tokens, ratio, seconds in rows:
            mib = f"{read / 2**20:.2f} | {tokens / 2**20:.2f}"
            print(f"| {number} | {n} | {mib} | {ratio:.2f}x | {seconds:.1f} |")
        ratios = [r[4] for r in rows]
        print(f"read / token bytes: median {np.median(ratios):.2f}x, max {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
