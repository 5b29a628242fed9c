"""Pool workers' start: the demo corpus prepared with ``--workers 2``, pool workers spawned (a fresh
interpreter each, importing the prepare stack) against forked from the preloaded fork server (the default,
``omnipack/executors/local.py``), taking turns in the same run.

Each run is a fresh process (``run_prepare`` on the 60-sample demo corpus, W=2048, cp=2, 16-line parts,
3-row shards: the tests' ``--workers 2`` configuration), timed from its start to its exit: wall seconds and
CPU seconds of its whole process tree (the run, the fork server, the pool workers). This process is the
tree's child subreaper (``PR_SET_CHILD_SUBREAPER``), so the fork server, which outlives the run by a moment
and is no child of this process, is reaped here and its CPU (with its workers') counts in
``RUSAGE_CHILDREN``. Both modes' datasets must be byte-identical (checked).

    PYTHONPATH=. python benchmarks/bench_pool_start.py --rounds 3
    # any command's wall and process-tree CPU seconds (e.g. test files before and after):
    PYTHONPATH=. python benchmarks/bench_pool_start.py --tree python -m pytest -q -p no:cacheprovider tests/test_cli.py
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import sys
from omnipack.pipeline import PrepareConfig, run_prepare
import omnipack.executors.local as local

if __name__ == "__main__":
    out, manifest, media, tokenizer, mode = sys.argv[1:]
    if mode == "spawn":  # the executor's start before the fork server: a fresh interpreter per worker
        import multiprocessing as mp

        local.pool_context = lambda: mp.get_context("spawn")
    run_prepare(PrepareConfig(
        manifest=[manifest], media_root=media, tokenizer=tokenizer, output=out, seq_length=2048, cp=2,
        shard_max_rows=3, part_lines=16, progress=False, workers=2, max_reject_fraction=0.2,
    ))
"""


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _reap_all() -> None:
    """Wait for every descendant re-parented to this process (the fork server after the run's exit)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def run_once(script: Path, out: Path, corpus: tuple[Path, Path], tokenizer: Path, mode: str) -> tuple[float, float]:
    """(wall s, process-tree CPU s) of one prepare run in ``mode``."""
    manifest, media = corpus
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t, c = time.perf_counter(), _cpu_children()
    done = subprocess.run(
        [sys.executable, str(script), str(out), str(manifest), str(media), str(tokenizer), mode],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    _reap_all()
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - t, _cpu_children() - c


def run_tree(command: list[str]) -> int:
    """Run ``command``; print its wall seconds and the CPU seconds of its whole process tree."""
    t = time.perf_counter()
    rc = subprocess.call(command)
    _reap_all()
    print(f"tree: wall {time.perf_counter() - t:.1f} s, CPU {_cpu_children():.1f} s, exit {rc}", file=sys.stderr)
    return rc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each mode, taking turns")
    parser.add_argument("--tree", nargs=argparse.REMAINDER, help="instead: time this command's process tree")
    args = parser.parse_args()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    if args.tree:
        raise SystemExit(run_tree(args.tree))
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from tests.stage_outputs import dataset_bytes

    tmp = Path(tempfile.mkdtemp(prefix="omnipack-bench-pool-"))
    tokenizer = build_demo_tokenizer(tmp / "tokenizer")
    corpus = build_demo_corpus(tmp / "corpus", num_samples=60)
    script = tmp / "child.py"
    script.write_text(CHILD)
    modes = ("spawn", "forkserver")
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    outputs: dict[str, dict[str, bytes]] = {}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            out = tmp / f"{mode}-{r}"
            times[mode].append(run_once(script, out, corpus, tokenizer, mode))
            outputs.setdefault(mode, dataset_bytes(out))
    same = outputs["spawn"] == outputs["forkserver"]
    print(f"load average {os.getloadavg()[0]:.1f}, {args.rounds} rounds, medians")
    print(f"{'pool start':<12}{'wall s':>9}{'CPU s':>9}{'wall x':>9}{'CPU x':>9}")
    base_wall = statistics.median(w for w, _ in times["spawn"])
    base_cpu = statistics.median(c for _, c in times["spawn"])
    for mode in modes:
        wall = statistics.median(w for w, _ in times[mode])
        cpu = statistics.median(c for _, c in times[mode])
        print(f"{mode:<12}{wall:>9.2f}{cpu:>9.2f}{wall / base_wall:>9.2f}{cpu / base_cpu:>9.2f}")
    print(f"same bytes: {same}")
    if not same:
        raise SystemExit("the two modes' datasets differ")


if __name__ == "__main__":
    main()
