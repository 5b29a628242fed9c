"""Repack against a first prepare and against ``cp -r`` of the same shard bytes, on a photo corpus.

Corpus: distinct JPEG photos at camera sizes (``bench_loader``'s photo generator: smooth content plus
sensor-like noise, quality 90), one or two per sample with short texts, profile qwen2_5_vl, one worker.

1. first prepare at ``--seq-length`` (measure, pack, write: decode + HF-exact resize of every photo; the write
   stage keeps each payload in the run's sample store, ``stages/samples``);
2. ``--repeats`` repacks of the same output (``--from-stage pack``), to ``--repack-seq-length`` and half of it
   in turn: pack and write again, the payloads copied from the store; the media folder is moved away
   meanwhile, so no photo can be read;
3. after each repack, ``cp -r`` of its shard folder to a new folder (the same bytes, written once more), then
   ``cp -rT`` of it over that copy (cp truncates each file it replaces, freeing its pages, as a repack frees
   the previous shards it replaces: the like-for-like baseline for a repack in place);
4. with ``--check``: a fresh prepare at the last repack's seq length without a store, whose shards must equal
   the repack's byte for byte.

Timings are wall seconds of each whole ``run_prepare`` (tokenizer load, stages, finalize), and CPU seconds
(user + system, every thread; for ``cp`` its own): on a shared machine the wall clock mostly measures the
other jobs, the CPU time what the step itself costs. Files are in the page cache for every step alike
(nothing is dropped on a shared machine). The first prepare runs in this process; the repacks run in a
warm server process (imports done, one repack before the clock), which ``--baseline DIR`` (a checkout of
another revision) doubles: that revision's repacks take turns with this one's (A B B A ...) on the same
output, each followed by its ``cp``, so both meet the same load.

    PYTHONPATH=. python benchmarks/bench_repack.py --quick --check    # 64 samples, ~2 min
    PYTHONPATH=. python benchmarks/bench_repack.py --check            # 240 samples, ~5 min
    git archive REV | tar -x -C /tmp/before
    PYTHONPATH=. python benchmarks/bench_repack.py --check --repeats 6 --cold 2 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

# the omnipack tree to import: this checkout, or a server's (``--serve --tree DIR``)
_TREE = sys.argv[sys.argv.index("--tree") + 1] if "--tree" in sys.argv else str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _TREE)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import PHOTO_SIZES, WORDS, _smooth  # noqa: E402


def build_photos(root: Path, samples: int, seed: int = 0) -> tuple[Path, Path]:
    """One distinct photo per sample (every third sample a second one), and the manifest."""
    rng = np.random.default_rng(seed)
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(samples):
        names = []
        for j in range(1 + (i % 3 == 0)):
            h, w = PHOTO_SIZES[int(rng.integers(len(PHOTO_SIZES)))]
            name = f"photo{i:05d}-{j}.jpg"
            Image.fromarray(_smooth(rng, h, w, 6)).save(media / name, quality=90)
            names.append(name)
        words = " ".join(rng.choice(WORDS, size=int(rng.integers(10, 60))))
        answer = " ".join(rng.choice(WORDS, size=int(rng.integers(20, 150))))
        user = [{"type": "image", "image": n} for n in names] + [{"type": "text", "text": words}]
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        lines.append(json.dumps({"id": f"s{i:05d}", "messages": msgs}) + "\n")
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(lines))
    return manifest, media


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _prepare(out: Path, tok: Path, manifest: Path, media: Path, seq_length: int, **kw) -> tuple[float, float]:
    """(wall s, CPU s) of one whole ``run_prepare``."""
    from omnipack.pipeline import PrepareConfig, run_prepare

    cfg = PrepareConfig(
        manifest=[str(manifest)], media_root=str(media), tokenizer=str(tok), output=str(out),
        profile="qwen2_5_vl", seq_length=seq_length, progress=False, **kw,
    )  # fmt: skip
    t, c = time.perf_counter(), _cpu()
    run_prepare(cfg)
    return time.perf_counter() - t, _cpu() - c


def serve() -> None:
    """A repack server: one JSON request a line on stdin (``_prepare``'s arguments), (wall, CPU) a line back."""
    reply = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # the runs' own messages stay off the reply channel
    for line in sys.stdin:
        r = json.loads(line)
        media, store = Path(r["media"]), r["store"]
        if r.get("new"):  # a second packing into a new folder: measured again, payloads from the shared store
            res = _prepare(Path(r["out"]), Path(r["tok"]), Path(r["manifest"]), media, r["seq_length"], sample_store=store)
            reply.write(json.dumps(res) + "\n")
            reply.flush()
            continue
        hidden = media.with_name("media-away")
        media.rename(hidden)  # the repack must not read a photo
        try:
            res = _prepare(
                Path(r["out"]), Path(r["tok"]), Path(r["manifest"]), media, r["seq_length"], from_stage="pack",
                sample_store=store,
            )  # fmt: skip
        finally:
            hidden.rename(media)
        reply.write(json.dumps(res) + "\n")
        reply.flush()


class Repacker:
    """A warm server process repacking with the omnipack of ``tree``."""

    def __init__(self, tree: str, name: str) -> None:
        self.name = name
        cmd = [sys.executable, __file__, "--serve", "--tree", tree]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(
        self, out: Path, tok: Path, manifest: Path, media: Path, seq_length: int, new: bool = False
    ) -> tuple[float, float]:
        """A repack of ``out`` in place, or with ``new`` a second packing into the new folder ``out``."""
        req = {
            "out": str(out), "tok": str(tok), "manifest": str(manifest), "media": str(media),
            "seq_length": seq_length, "store": str(out.parent / "store"), "new": new,
        }  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} repack server failed")
        wall, cpu = json.loads(line)
        return wall, cpu

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def cold_repack(tree: str, out: Path, tok: Path, manifest: Path, media: Path, seq_length: int) -> tuple[float, float]:
    """(wall s, CPU s) of a repack as a user runs it: ``python -m omnipack prepare --from-stage pack`` in a
    new process (interpreter start and imports counted), with the omnipack of ``tree``."""
    cmd = [
        sys.executable, "-m", "omnipack", "prepare", "--manifest", str(manifest), "--media-root", str(media),
        "--tokenizer", str(tok), "-o", str(out), "--profile", "qwen2_5_vl", "--seq-length", str(seq_length),
        "--from-stage", "pack", "--sample-store", str(out.parent / "store"), "--no-progress", "--max-reject-fraction", "1",  # as run_prepare: no exit code 3
    ]  # fmt: skip
    hidden = media.with_name("media-away")
    media.rename(hidden)
    try:
        t, c = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
        # in the tree's folder: ``-m`` imports from the working folder first
        run = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": tree}, stderr=subprocess.PIPE, text=True)
        if run.returncode:
            raise RuntimeError(f"{cmd} failed:\n{run.stderr}")
        return time.perf_counter() - t, _cpu(resource.RUSAGE_CHILDREN) - c
    finally:
        hidden.rename(media)


def _shard_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="64 samples")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seq-length", type=int, default=16384)
    ap.add_argument("--repack-seq-length", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3, help="repacks per revision (lengths in turn), each with a cp")
    ap.add_argument("--check", action="store_true", help="also a fresh prepare at the repack's length, compared")
    ap.add_argument("--baseline", help="a checkout of another revision: its repacks take turns with this one's")
    ap.add_argument("--cold", type=int, default=0, help="also this many repacks per revision as new CLI processes")
    ap.add_argument("--side", action="store_true", help="also a second packing into a new folder sharing the store")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve()
    samples = args.samples or (64 if args.quick else 240)

    from omnipack.demo.tokenizer import build_demo_tokenizer

    load0 = f"{os.getloadavg()[0]:.1f}"
    with tempfile.TemporaryDirectory(prefix="omnipack-bench-repack-") as tmp:
        root = Path(tmp)
        tok = build_demo_tokenizer(root / "tok", profile="qwen2_5_vl")
        t = time.perf_counter()
        manifest, media = build_photos(root / "src", samples)
        print(f"corpus: {samples} samples, {len(list(media.iterdir()))} photos ({time.perf_counter() - t:.1f} s)")
        out = root / "ds"
        first = _prepare(out, tok, manifest, media, args.seq_length, sample_store=str(root / "store"))
        lengths = [args.repack_seq_length, args.repack_seq_length // 2]  # each repack changes the length
        revisions = [Repacker(_TREE, "this")] + ([Repacker(args.baseline, "baseline")] if args.baseline else [])
        order = [revisions[(k + k // 2) % len(revisions)] for k in range(args.repeats * len(revisions))]  # A B B A
        times: dict[str, list[tuple[float, float]]] = {r.name: [] for r in revisions}
        sides: dict[str, list[tuple[float, float]]] = {r.name: [] for r in revisions}  # into a new folder
        cps: list[tuple[float, float]] = []
        cps_over: list[tuple[float, float]] = []  # cp over the previous copy (its files truncated)
        try:
            for r in revisions:  # warm: imports, the tokenizer, the first maps (not timed)
                r(out, tok, manifest, media, lengths[1])
                r(out, tok, manifest, media, lengths[0])
            for k, r in enumerate(order):
                times[r.name].append(r(out, tok, manifest, media, lengths[(k + 1) % 2]))
                shutil.rmtree(root / "copy", ignore_errors=True)
                t, c = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
                subprocess.run(["cp", "-r", str(out / "shards"), str(root / "copy")], check=True)
                cps.append((time.perf_counter() - t, _cpu(resource.RUSAGE_CHILDREN) - c))
                t, c = time.perf_counter(), _cpu(resource.RUSAGE_CHILDREN)
                subprocess.run(["cp", "-rT", str(out / "shards"), str(root / "copy")], check=True)
                cps_over.append((time.perf_counter() - t, _cpu(resource.RUSAGE_CHILDREN) - c))
                if args.side:
                    side = root / "side"
                    shutil.rmtree(side, ignore_errors=True)
                    sides[r.name].append(r(side, tok, manifest, media, lengths[(k + 1) % 2], new=True))
                    shutil.rmtree(side)  # the disk holds one more copy at a time
        finally:
            for r in revisions:
                r.close()
        trees = {"this": _TREE, **({"baseline": args.baseline} if args.baseline else {})}
        cold: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for k in range(args.cold * len(trees)):
            name = list(trees)[(k + k // 2) % len(trees)]
            cold[name].append(cold_repack(trees[name], out, tok, manifest, media, lengths[(k + len(order) + 1) % 2]))
        size = sum(p.stat().st_size for p in (out / "shards").rglob("*") if p.is_file())
        store = sum(p.stat().st_size for p in (root / "store").rglob("*") if p.is_file())

        def median(runs: list[tuple[float, float]]) -> tuple[float, float]:
            return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)

        cp, cp_over = median(cps), median(cps_over)
        rows = [(f"first prepare (W={args.seq_length}, store written)", first)]
        for r in revisions:
            label = "" if not args.baseline else f" ({r.name})"
            rows.append((f"repack{label} (W={' / '.join(map(str, lengths))} in turn), median of {len(times[r.name])}", median(times[r.name])))
        for r in revisions:
            if sides[r.name]:
                label = "" if not args.baseline else f" ({r.name})"
                rows.append((f"second packing{label} into a new folder, shared store (measure again), median of {len(sides[r.name])}", median(sides[r.name])))
        for name, runs in cold.items():
            if runs:
                label = "" if not args.baseline else f" ({name})"
                rows.append((f"repack{label}, a new `omnipack prepare` process, median of {len(runs)}", median(runs)))
        rows.append((f"cp -r of the repacked shards to a new folder, median of {len(cps)}", cp))
        rows.append((f"cp -rT of them over that copy (its files replaced), median of {len(cps_over)}", cp_over))
        if args.check:  # the last repack's length, fresh
            fresh = root / "fresh"
            w = lengths[(len(order) + args.cold * len(trees)) % 2]
            rows.append((f"fresh prepare (W={w}, `--sample-store off`)", _prepare(fresh, tok, manifest, media, w, sample_store="off")))
            same = _shard_bytes(fresh) == _shard_bytes(out)
        print(f"\nshards: {size / 2**20:.1f} MiB; sample store: {store / 2**20:.1f} MiB; load average before / after: {load0} / {os.getloadavg()[0]:.1f}")
        for r in revisions:
            print(f"repacks ({r.name}): " + ", ".join(f"{w:.2f} s ({c:.2f} CPU)" for w, c in times[r.name]))
            if sides[r.name]:
                print(f"new-folder packings ({r.name}): " + ", ".join(f"{w:.2f} s ({c:.2f} CPU)" for w, c in sides[r.name]))
        for name, runs in cold.items():
            if runs:
                print(f"cold repacks ({name}): " + ", ".join(f"{w:.2f} s ({c:.2f} CPU)" for w, c in runs))
        print("cp: " + ", ".join(f"{w:.2f} s ({c:.2f} CPU)" for w, c in cps))
        print("cp over the copy: " + ", ".join(f"{w:.2f} s ({c:.2f} CPU)" for w, c in cps_over) + "\n")
        print("| step | wall s | CPU s | first prepare / step (wall, CPU) | step / cp (wall, CPU) | step / cp over (wall, CPU) |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, (w, c) in rows:
            print(
                f"| {name} | {w:.2f} | {c:.2f} | x{first[0] / w:.1f}, x{first[1] / c:.1f} "
                f"| x{w / cp[0]:.2f}, x{c / cp[1]:.2f} | x{w / cp_over[0]:.2f}, x{c / cp_over[1]:.2f} |"
            )
        if args.check:
            print(f"\nrepacked shards byte-identical to the fresh prepare's: {same}")
        shutil.rmtree(root / "copy", ignore_errors=True)


if __name__ == "__main__":
    main()
