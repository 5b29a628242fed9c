"""A first prepare with one worker, its write units' rows built on one thread against its CPUs' worth of threads.

A write unit decodes and resizes its rows' media on up to ``write.BUILD_THREADS_MAX`` threads, within its
worker's share of the CPUs (``WorkerContext.cpus``: all of this process's with one worker). The baseline is
the same run with the worker given one CPU (one builder thread, as before), in the same process, the two
taking turns (A B B A ...) so both meet the same load. Corpora: ``bench_repack``'s photos (qwen2_5_vl,
W=16384) and the demo's omni mix (qwen3_omni: photos, video clips, audio). Each prepare is a fresh output
with the sample store on (the write stage keeps every payload, as a first prepare does by default); the
shards and the store's segments of both ways are compared byte for byte.

    PYTHONPATH=. python benchmarks/bench_write_threads.py --repeats 3     # ~3 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from bench_repack import build_photos  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _files(root: Path) -> dict[str, bytes]:
    """The shards, their indices and the store's segments (named by content order, not their unique names)."""
    shards = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "shards").rglob("*"))}
    segments = sorted((root / "stages" / "samples").rglob("*.bin"), key=lambda p: p.name.split("-")[:2])
    return {**shards, **{f"segment {i}": p.read_bytes() for i, p in enumerate(segments)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="prepares per way and corpus, in turn")
    ap.add_argument("--photos", type=int, default=240, help="photo corpus samples")
    args = ap.parse_args()

    import omnipack.executors.local as local
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import get_profile

    cpus = local.available_cpus()
    real = local.available_cpus
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="omnipack-bench-write-threads-") as tmp:
        root = Path(tmp)
        corpora = {}
        tok = build_demo_tokenizer(root / "tok-vl", profile="qwen2_5_vl")
        manifest, media = build_photos(root / "photos", args.photos)
        corpora["photos (qwen2_5_vl, W=16384)"] = ("qwen2_5_vl", tok, manifest, media, 16384)
        tok = build_demo_tokenizer(root / "tok-omni", profile="qwen3_omni")
        manifest, media = build_demo_corpus(root / "omni", kinds=get_profile("qwen3_omni").kinds)
        corpora["demo omni mix (qwen3_omni, W=8192)"] = ("qwen3_omni", tok, manifest, media, 8192)
        for name, (profile, tok, manifest, media, width) in corpora.items():
            times: dict[str, list[tuple[float, float]]] = {"one thread": [], f"{cpus} CPUs": []}
            files: dict[str, dict[str, bytes]] = {}
            ways = list(times)
            for k in range(2 * args.repeats + 2):  # the first two warm the process (imports, page cache)
                way = ways[(k + k // 2) % 2]
                local.available_cpus = (lambda: 1) if way == "one thread" else real
                out = root / "out"
                shutil.rmtree(out, ignore_errors=True)
                cfg = PrepareConfig(
                    manifest=[str(manifest)], media_root=str(media), tokenizer=str(tok), output=str(out),
                    profile=profile, seq_length=width, progress=False, max_reject_fraction=1.0,
                )  # fmt: skip
                t, c = time.perf_counter(), _cpu()
                run_prepare(cfg)
                if k >= 2:
                    times[way].append((time.perf_counter() - t, _cpu() - c))
                files[way] = _files(out)
            local.available_cpus = real
            base = statistics.median(w for w, _ in times["one thread"])
            for way, runs in times.items():
                wall = statistics.median(w for w, _ in runs)
                cpu = statistics.median(c for _, c in runs)
                rows.append((name, way, wall, cpu, base / wall, files[way] == files["one thread"]))
    print(f"\n{cpus} CPUs; load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; medians of {args.repeats}\n")
    print("| corpus | write unit's rows built on | wall s | CPU s | speed-up (wall) | shards and store = one thread's |")
    print("|---|---|---:|---:|---:|---|")
    for name, way, wall, cpu, speedup, same in rows:
        print(f"| {name} | {way} | {wall:.2f} | {cpu:.2f} | x{speedup:.2f} | {same} |")


if __name__ == "__main__":
    main()
