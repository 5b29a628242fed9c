"""Scale-out: samples/s of the measure and write stages on 1 and 2 local workers and on Ray (2 CPUs), for
text, image and video corpora, as ratios against 1 local worker measured in the same run; Ray's overhead
over the local pool; a simulated two-node Ray cluster's output against the local run's; and the pack
step's memory per sample.

Corpora (synthetic, built once into a cache folder): text conversations (~150 tokens), conversations with
one photo each (a pool of 48 distinct PNGs, 240x320 to 720x960), and conversations with one video each (a
pool of 8 mp4 clips, 24 frames at 160x120 to 320x240). Qwen2.5-VL rules, W=4096, the demo tokenizer.
Each configuration runs measure -> pack -> write -> finalize into its own folder; a stage's time includes
starting its workers (pool processes or Ray actors) and loading the tokenizer there. The input is split
into 16 parts and the plan into about 16 shards, so two workers always have work. The configurations take
turns, twice, and each one's best time per stage counts (the machine is shared with other jobs). Every configuration's dataset must be
byte-identical to the 1-worker one (checked; "same bytes" column).

Pack memory: the pack stage alone, in a fresh process, on synthetic measured parts of ``--pack-samples``
samples (realistic id/source strings and length columns): peak RSS above the process's baseline, per
sample.

Ray's overhead, start-up counted (``--ray-overhead N``): whole runs of 20k text chats (``--overhead-samples``)
with 2 workers, local and Ray in turn, N pairs, each run a fresh process timed from its start to its exit
(interpreter, imports, the Ray cluster's and the actors' start, shutdown); the median of the pairs' ratios
per phase and for the whole run.

    PYTHONPATH=. python benchmarks/bench_scale.py            # a few minutes on a 2-core machine
    PYTHONPATH=. python benchmarks/bench_scale.py --ray-overhead 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["TOKENIZERS_PARALLELISM"] = "false"

CACHE = Path(tempfile.gettempdir()) / "omnipack_bench_scale"
REPEATS = 2  # each configuration's best run per stage: the machine is shared, so single runs are noisy
WORDS = [
    "the",
    "a",
    "red",
    "blue",
    "green",
    "small",
    "large",
    "picture",
    "video",
    "shows",
    "moves",
    "left",
    "right",
    "over",
    "under",
    "near",
    "far",
]


def _text(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n)).capitalize() + "."


def build_corpus(kind: str, n: int) -> tuple[Path, Path]:
    """``CACHE/kind-n/manifest.jsonl`` and its media folder, built once."""
    root = CACHE / f"{kind}-{n}"
    manifest, media = root / "manifest.jsonl", root / "media"
    if manifest.exists():
        return manifest, media
    from PIL import Image

    from omnipack.demo.media import write_video

    rng = np.random.default_rng(0)
    media.mkdir(parents=True, exist_ok=True)
    refs: list[dict] = []
    if kind == "image":
        for i in range(48):
            h, w = int(rng.integers(240, 721)), int(rng.integers(320, 961))
            y, x = np.mgrid[0:h, 0:w]
            img = np.stack([x * 255 // w, y * 255 // h, ((x // 16 + y // 16) % 2) * (40 + i)], axis=-1)
            Image.fromarray(img.astype(np.uint8)).save(media / f"img{i}.png")
            refs.append({"type": "image", "image": f"img{i}.png"})
    elif kind == "video":
        for i, (w, h) in enumerate([(160, 120), (224, 160), (320, 240), (192, 144)] * 2):
            write_video(media / f"clip{i}.mp4", n=24, fps=8, w=w, h=h)
            refs.append({"type": "video", "video": f"clip{i}.mp4"})
    tmp = manifest.with_suffix(".partial")
    with open(tmp, "w") as f:
        for i in range(n):
            user = ([refs[i % len(refs)]] if refs else []) + [
                {"type": "text", "text": _text(rng, int(rng.integers(10, 80)))}
            ]
            messages = [
                {"role": "user", "content": user},
                {"role": "assistant", "content": _text(rng, int(rng.integers(10, 120)))},
            ]
            f.write(json.dumps({"id": f"{kind}-{i}", "messages": messages}) + "\n")
    os.replace(tmp, manifest)
    return manifest, media


def tokenizer() -> Path:
    from omnipack.demo.tokenizer import build_demo_tokenizer

    path = CACHE / "tokenizer"
    if not (path / "tokenizer.json").exists():
        build_demo_tokenizer(path)
    return path


def run_config(
    corpus: tuple[Path, Path], out: Path, executor: str, workers: int, n: int, shard_mb: float
) -> dict:
    """One whole run, stage by stage, timing measure and write (worker start included)."""
    from omnipack.pipeline import PrepareConfig

    cfg = PrepareConfig(
        manifest=[str(corpus[0])],
        media_root=str(corpus[1]),
        tokenizer=str(tokenizer()),
        output=str(out),
        seq_length=4096,
        executor=executor,
        workers=workers,
        part_lines=max(1, -(-n // 16)),
        shard_size_mb=shard_mb,
        mrope=False,  # the recorded numbers' workload (mRoPE ids are on by default now)
        progress=False,
    )
    summary, seconds = timed_stages(cfg, executor, workers, warm_worker)
    shard_bytes = sum(s["num_bytes"] for s in summary["shards"])
    measure_bytes = sum(p.stat().st_size for p in (out / "stages" / "measure").glob("part-*.*"))
    return {
        **seconds,
        "input": summary["counts"]["input"],
        "packed": summary["counts"]["packed"],
        "shards": len(summary["shards"]),
        "shard_bytes": shard_bytes,
        "measure_bytes": measure_bytes,
    }


def timed_stages(cfg: Any, executor: str, workers: int, warm: Any = None) -> tuple[dict, dict[str, float]]:
    """``cfg`` run stage by stage into its output (removed first), under its lock: the run summary (as
    omnipack.json records it) and the seconds the executor took to start (``warm``: run once on each of its
    workers first, so the stages start warm), then measure, pack and write."""
    from omnipack.executors import make_executor
    from omnipack.pipeline import build_spec, run_mapped
    from omnipack.stages.finalize import finalize
    from omnipack.stages.lock import OutputLock
    from omnipack.stages.measure import MEASURE
    from omnipack.stages.pack import run_pack_stage
    from omnipack.stages.write import WRITE

    shutil.rmtree(cfg.output, ignore_errors=True)
    with OutputLock(Path(cfg.output)):
        spec = build_spec(cfg)
        ts = time.perf_counter()
        with make_executor(executor, workers) as ex:
            if warm is not None:
                assert len(set(ex.map(warm, spec, list(range(workers))))) == workers
            t0 = time.perf_counter()
            run_mapped(MEASURE, spec, None, ex)
            t1 = time.perf_counter()
            plan, _ = run_pack_stage(spec)
            t2 = time.perf_counter()
            run_mapped(WRITE, spec, plan, ex)
            t3 = time.perf_counter()
        summary = finalize(spec, plan).to_json()
    return summary, {"start_s": t0 - ts, "measure_s": t1 - t0, "pack_s": t2 - t1, "write_s": t3 - t2}


def warm_worker(spec, unit: int, context) -> int:
    """Start a worker: import the stages and media decoders, load the tokenizer (as its first unit would), and hold it a moment
    so each worker gets one of these; returns the worker's pid."""
    import omnipack.media.image  # noqa: F401
    import omnipack.media.video  # noqa: F401
    import omnipack.stages.write  # noqa: F401
    from omnipack.stages.measure import worker_measurer

    worker_measurer(context, spec.measure, spec.model, spec.model_options)  # the one measure_part reuses
    time.sleep(1.0)
    return os.getpid()


def dataset_bytes(root: Path) -> dict[str, bytes]:
    files = [*root.glob("shards/*"), *root.glob(".nv-meta/*"), root / "rejects.jsonl"]
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _cost_model() -> Any:
    """The cost model the synthetic samples are costed with (``PACK_PROFILE``, default qwen2_5_vl; empty:
    none), as the measure stage would have costed them."""
    from omnipack.profiles import get_profile

    name = os.environ.get("PACK_PROFILE", "qwen2_5_vl")
    return get_profile(name).cost_model({}) if name else None


def synthetic_parts(n: int, folder: str) -> None:
    """Measured parts of ``n`` synthetic samples (length and cost columns, realistic ids and sources)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from omnipack.inputs import InputPart
    from omnipack.stages.measure import SAMPLES_PARQUET_SCHEMA, part_files
    from omnipack.stages.records import PartRecord, write_json_atomic

    measure_dir = Path(folder) / "stages" / "measure"
    measure_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    model = _cost_model()
    per_part = 100_000
    for k in range(-(-n // per_part)):
        m = min(per_part, n - k * per_part)
        tokens = rng.lognormal(6.0, 1.0, size=m).clip(16, 4000).astype(np.int32)
        cols = {f.name: pa.nulls(m, f.type) for f in SAMPLES_PARQUET_SCHEMA}
        cols.update(
            sample_index=pa.array(np.arange(m, dtype=np.int64)),
            sample_id=pa.array([f"conversation-{k * per_part + i:012d}" for i in range(m)]),
            source=pa.array([f"train-{k:05d}.jsonl:{i + 1}" for i in range(m)]),
            num_tokens=pa.array(tokens),
            padded_length=pa.array(tokens),
            num_media=pa.array(np.zeros(m, np.int16)),
            vision_patches=pa.array(np.zeros(m, np.int64)),
            audio_frames=pa.array(np.zeros(m, np.int64)),
            media_bytes=pa.array(np.zeros(m, np.int64)),
            media_json=pa.array(["[]"] * m),
        )
        if model is not None:
            cols.update(encoder_flops=pa.array(np.zeros(m)), sample_cost=pa.array(model.sample_costs(tokens)))
        files = part_files(measure_dir, k)
        pq.write_table(pa.table(cols, schema=SAMPLES_PARQUET_SCHEMA), files["samples"])
        pq.write_table(
            pa.table(
                {
                    "sample_index": pa.array([], pa.int64()),
                    "sample_id": pa.array([], pa.string()),
                    "source": pa.array([], pa.string()),
                    "stage": pa.array([], pa.string()),
                    "reason": pa.array([], pa.string()),
                }
            ),
            files["rejects"],
        )
        part = InputPart(k, f"train-{k:05d}.jsonl", 0, 1, m, "")
        cost = None if model is None else model.describe()
        write_json_atomic(files["record"], PartRecord("synthetic", k, part, m, m, 0, {}, cost).to_json())


def pack_memory_child(n: int, folder: str) -> None:
    """The pack stage on the synthetic parts under ``folder``; prints its peak RSS above the baseline."""
    import pyarrow as pa

    from omnipack.stages.measure import InputPart
    from omnipack.stages.pack import run_pack_stage
    from omnipack.stages.pack_planner import PackConfig
    from omnipack.stages.spec import MeasureConfig, RunSpec, ShardLayout, WriteSettings

    out, per_part = Path(folder), 100_000
    model = _cost_model()
    parts = [
        InputPart(k, f"train-{k:05d}.jsonl", 0, 1, min(per_part, n - k * per_part), "")
        for k in range(-(-n // per_part))
    ]
    spec = RunSpec(
        output=str(out),
        manifests=(),
        measure=MeasureConfig("qwen2_5_vl", "", ""),
        max_line_bytes=1 << 24,
        part_lines=per_part,
        pack=PackConfig(seq_length=8192, cost_model=None if model is None else model.describe()),
        layout=ShardLayout(),
        write=WriteSettings("", 8192, 1, 0),
        parts=tuple(parts),
    )
    import gc

    gc.collect()
    pa.default_memory_pool().release_unused()
    base = _rss_mb()
    t0 = time.perf_counter()
    plan, _ = run_pack_stage(spec, reuse_measure=True)
    seconds = time.perf_counter() - t0
    peak = _rss_mb("VmHWM:")  # this process's own high-water mark (ru_maxrss would include its parent's)
    plan_file = (out / "stages" / "plan.parquet").stat().st_size + (
        out / "stages" / "layout.parquet"
    ).stat().st_size
    print(
        json.dumps(
            {
                "samples": n,
                "rows": plan.num_rows,
                "seconds": seconds,
                "peak_above_base_mb": peak - base,
                "plan_file_bytes": plan_file,
            }
        )
    )


def _rss_mb(field: str = "VmRSS:") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return 0.0


def pack_memory(n: int) -> dict:
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        synthetic_parts(n, tmp)
        res = subprocess.run(
            [sys.executable, __file__, "--pack-child", str(n), tmp],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-4000:])
        return json.loads(res.stdout.strip().splitlines()[-1])


def two_node(corpus: tuple[Path, Path], out: Path, n: int, shard_mb: float) -> float:
    """The corpus on a simulated two-node Ray cluster (1 CPU each, one actor per node); returns seconds."""
    import ray
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": {"worker_niceness": 0}}  # as a run's own
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        t0 = time.perf_counter()
        run_config(corpus, out, "ray", 2, n, shard_mb)
        return time.perf_counter() - t0
    finally:
        ray.shutdown()
        cluster.shutdown()


PHASES = ("setup", "measure", "pack", "write", "finalize", "close")


def timed_run_child(executor: str, out: str, n: int) -> None:
    """One whole ``run_prepare`` of the text corpus with 2 workers (this process is the run: started by the
    parent, so interpreter start, imports and the executor's start-up are inside the parent's clock); prints
    the wall-clock times (``time.time()``) at which the stages began and finalize ended."""
    import omnipack.pipeline as pl

    stamps: dict[str, float] = {}

    def stamped(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            stamps.setdefault(name, time.time())
            return fn(*args, **kwargs)

        return run

    run_units = pl._run_units

    def stage_units(ex: Any, fn: Any, *rest: Any) -> Any:
        stamps.setdefault({"measure_part": "measure", "write_shard": "write"}[fn.__name__], time.time())
        return run_units(ex, fn, *rest)

    pl._run_units, pl.run_pack_stage = stage_units, stamped("pack", pl.run_pack_stage)
    finalize = pl.finalize

    def timed_finalize(*args: Any, **kwargs: Any) -> Any:
        stamps["finalize"] = time.time()
        try:
            return finalize(*args, **kwargs)
        finally:
            stamps["finalize_end"] = time.time()

    pl.finalize = timed_finalize
    manifest, media = build_corpus("text", n)
    shutil.rmtree(out, ignore_errors=True)
    cfg = pl.PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tokenizer()),
        output=out,
        seq_length=4096,
        executor=executor,
        workers=2,
        part_lines=max(1, -(-n // 16)),
        shard_size_mb=2.0,
        mrope=False,
        progress=False,
    )
    pl.run_prepare(cfg)
    print(json.dumps(stamps), flush=True)


def timed_run(executor: str, out: Path, n: int) -> dict[str, float]:
    """A whole run in a fresh process: seconds per phase, from the process's start to its exit."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("RAY_ADDRESS", None)  # Ray starts a cluster of its own, as a CLI run without --ray-address does
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, __file__, "--run-child", executor, str(out), str(n)],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    t1 = time.time()
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-4000:])
    stamps = json.loads(res.stdout.strip().splitlines()[-1])
    edges = [t0, stamps["measure"], stamps["pack"], stamps["write"], stamps["finalize"], stamps["finalize_end"], t1]
    times = {name: edges[i + 1] - edges[i] for i, name in enumerate(PHASES)}
    times["whole"] = t1 - t0
    return times


def ray_overhead(n: int, pairs: int) -> None:
    """Ray x2 against local x2 on the text corpus: whole runs, each in a fresh process (start-up counted:
    interpreter, imports, the Ray cluster's start and its actors'), ``pairs`` times in turn (the machine is
    shared); the median per phase and whole run of the pairs' ratios, the load average before and after."""
    work = CACHE / "runs"
    build_corpus("text", n)
    tokenizer()
    load_before = os.getloadavg()
    ratios: dict[str, list[float]] = {k: [] for k in (*PHASES, "whole")}
    seconds: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    for i in range(pairs):
        runs = {}
        for executor in ("local", "ray") if i % 2 == 0 else ("ray", "local"):
            runs[executor] = timed_run(executor, work / f"text-o-{executor}", n)
            seconds[executor].append(runs[executor])
        lo, ra = runs["local"], runs["ray"]
        for k in ratios:
            ratios[k].append(ra[k] / lo[k] if lo[k] > 0 else float("nan"))
        print(
            f"pair {i}: local " + " ".join(f"{k} {lo[k]:.2f}" for k in ratios)
            + " | ray " + " ".join(f"{k} {ra[k]:.2f}" for k in ratios)
            + f" | ray/local {ratios['whole'][-1]:.3f}x",
            flush=True,
        )  # fmt: skip
    same = dataset_bytes(work / "text-o-ray") == dataset_bytes(work / "text-o-local")
    print(
        f"\ntext corpus ({n:,} samples), Ray x2 over local x2, {pairs} alternating pairs, each run a fresh "
        f"process; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; "
        # without byte-code caches every Python process of the run compiles its imports again: Ray's ~8
        # (GCS client, dashboard head, agents, workers) against the local pool's 2, so Ray's start doubles
        f"byte-code caches: {'OFF (PYTHONDONTWRITEBYTECODE is set)' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'on'}; "
        f"same bytes: {'yes' if same else 'NO'}\n"
    )
    print("| phase | local s (median) | ray s (median) | ray/local (median of pairs) | min | max |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, r in ratios.items():
        lo_s = float(np.median([s[k] for s in seconds["local"]]))
        ra_s = float(np.median([s[k] for s in seconds["ray"]]))
        print(f"| {k} | {lo_s:.2f} | {ra_s:.2f} | {float(np.median(r)):.2f}x | {min(r):.2f}x | {max(r):.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", type=int, default=16000, help="text samples")
    ap.add_argument("--image", type=int, default=960, help="image samples")
    ap.add_argument("--video", type=int, default=320, help="video samples")
    ap.add_argument("--pack-samples", type=int, default=1_000_000)
    ap.add_argument("--pack-child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--run-child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument(
        "--ray-overhead",
        type=int,
        metavar="N",
        help="only Ray over the local pool (2 workers each): whole runs of --overhead-samples text chats, each "
        "in a fresh process (start-up counted), N alternating pairs",
    )
    ap.add_argument("--overhead-samples", type=int, default=20000, help="text samples of --ray-overhead")
    args = ap.parse_args()
    if args.pack_child:
        pack_memory_child(int(args.pack_child[0]), args.pack_child[1])
        return
    if args.run_child:
        timed_run_child(args.run_child[0], args.run_child[1], int(args.run_child[2]))
        return
    if args.ray_overhead:
        ray_overhead(args.overhead_samples, args.ray_overhead)
        return
    import ray

    from omnipack.executors.ray import own_cluster_options

    CACHE.mkdir(parents=True, exist_ok=True)
    corpora = {"text": (args.text, 2.0), "image": (args.image, 24.0), "video": (args.video, 24.0)}
    results: dict[str, dict[str, dict]] = {}
    same: dict[str, dict[str, bool]] = {}
    work = CACHE / "runs"
    configs = (("local x1", "local", 1, "x1"), ("local x2", "local", 2, "x2"), ("ray x2", "ray", 2, "ray"))
    ray.init(address="local", include_dashboard=False, **own_cluster_options(2))  # as a run's own cluster
    # the configurations take turns, so a change in the machine's load falls on all of them alike
    for kind, (n, shard_mb) in corpora.items():
        corpus = build_corpus(kind, n)
        results[kind], same[kind] = {}, {}
        for _ in range(REPEATS):
            for name, executor, workers, tag in configs:
                run = run_config(corpus, work / f"{kind}-{tag}", executor, workers, n, shard_mb)
                print(kind, name, run, flush=True)
                best = results[kind].setdefault(name, run)
                for key in ("start_s", "measure_s", "pack_s", "write_s"):
                    best[key] = min(best[key], run[key])
    ray.shutdown()
    for kind in corpora:
        base = dataset_bytes(work / f"{kind}-x1")
        same[kind] = {
            "local x2": dataset_bytes(work / f"{kind}-x2") == base,
            "ray x2": dataset_bytes(work / f"{kind}-ray") == base,
        }
    n_img, mb_img = corpora["image"]
    two_s = two_node(build_corpus("image", n_img), work / "image-2node", n_img, mb_img)
    two_same = dataset_bytes(work / "image-2node") == dataset_bytes(work / "image-x1")
    small, pack = pack_memory(args.pack_samples // 10), pack_memory(args.pack_samples)

    print(
        "\n| corpus | samples | run | measure samples/s | vs 1 local | write samples/s | vs 1 local | same bytes |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for kind, runs in results.items():
        base = runs["local x1"]
        for name, r in runs.items():
            m, w = r["input"] / r["measure_s"], r["packed"] / r["write_s"]
            m0, w0 = base["input"] / base["measure_s"], base["packed"] / base["write_s"]
            ok = "(baseline)" if name == "local x1" else ("yes" if same[kind][name] else "NO")
            print(
                f"| {kind} | {r['input']} | {name} | {m:,.0f} | {m / m0:.2f}x | {w:,.0f} | {w / w0:.2f}x | {ok} |"
            )
    print(
        "\nRay over the local pool (2 workers each; time ratio; the cluster is started once before, the whole "
        "run with its start is --ray-overhead's):"
    )
    print("| corpus | measure | write | worker start+measure+write |")
    print("|---|---:|---:|---:|")
    for kind, runs in results.items():
        lo, ra = runs["local x2"], runs["ray x2"]
        total = (ra["start_s"] + ra["measure_s"] + ra["write_s"]) / (lo["start_s"] + lo["measure_s"] + lo["write_s"])
        print(
            f"| {kind} | {ra['measure_s'] / lo['measure_s']:.2f}x | {ra['write_s'] / lo['write_s']:.2f}x | {total:.2f}x |"
        )
    print(
        f"\nTwo-node Ray cluster (1 CPU + 1 CPU), image corpus: {two_s:.1f} s, output identical to 1 local "
        f"worker: {'yes' if two_same else 'NO'}"
    )
    print("\nPer-core rates (1 local worker) and bytes per sample:")
    print(
        "| corpus | measure samples/core-s | write samples/core-s | shard bytes/sample | measure-table bytes/sample |"
    )
    print("|---|---:|---:|---:|---:|")
    for kind, runs in results.items():
        b = runs["local x1"]
        print(
            f"| {kind} | {b['input'] / b['measure_s']:,.0f} | {b['packed'] / b['write_s']:,.0f} | "
            f"{b['shard_bytes'] / b['packed']:,.0f} | {b['measure_bytes'] / b['input']:,.0f} |"
        )
    marginal = (
        (pack["peak_above_base_mb"] - small["peak_above_base_mb"])
        * 2**20
        / (pack["samples"] - small["samples"])
    )
    print(
        f"\nPack stage (plan + shard layout), {pack['samples']:,} synthetic samples -> {pack['rows']:,} rows: "
        f"{pack['seconds']:.1f} s ({small['samples']:,}: {small['seconds']:.1f} s); peak above baseline "
        f"{pack['peak_above_base_mb']:.0f} MiB ({small['peak_above_base_mb']:.0f} MiB for {small['samples']:,}): "
        f"{marginal:.0f} bytes per extra sample; plan files {pack['plan_file_bytes'] / pack['samples']:.1f} bytes/sample"
    )


if __name__ == "__main__":
    main()
