"""Prepare at scale: time and peak memory per sample over a sweep of corpus sizes, and measure speed
against the tokenizer's own batch encode.

Corpus: synthetic text conversations (system prompt, user/assistant exchanges with lognormal lengths)
over a Zipf-distributed synthetic vocabulary: ~170 tokens a sample for the scale sweep (so 1M samples
run in reach of a 2-core machine), ~720 for the measure-speed check. Tokenizer: a byte-level BPE with a
real-size vocabulary (``--vocab``, default 65,536) trained offline on that text, with omnipack's ChatML
demo template, built once into the cache folder.

Each size runs ``omnipack prepare`` (1 worker, W=4096, bfd, shuffled) in a fresh subprocess, so its peak
RSS (``ru_maxrss`` of the run and its children) belongs to that size alone. Ratios are against the
``--base`` size (default 100,000) measured in the same run; the target is 1M within 1.3x of 100k for both
time per sample and peak RSS.

Measure speed: the measure stage alone (manifest read, schema check, chat template, tokenization with
offsets, labels, table write) on one core, against the tokenizer's batch encode (``tokenizer(texts)``,
``TOKENIZERS_PARALLELISM=false``, so one core as well) of the same rendered conversations, in tokens/s.

    PYTHONPATH=. python benchmarks/bench_prepare.py --sizes 10000,100000        # a few minutes
    PYTHONPATH=. nice python benchmarks/bench_prepare.py --sizes 10000,100000,1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["TOKENIZERS_PARALLELISM"] = "false"

CACHE = Path(tempfile.gettempdir()) / "omnipack_bench_prepare"
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def _words(rng: np.random.Generator, n: int) -> list[str]:
    """A synthetic vocabulary of ``n`` words of 1-4 syllables."""
    out: set[str] = set()
    while len(out) < n:
        k = int(rng.integers(1, 5))
        out.add("".join(rng.choice(SYLLABLES, size=k)))
    return sorted(out)


class TextSource:
    """Zipf-distributed words with punctuation: enough structure for BPE merges of a real-size vocabulary."""

    def __init__(self, seed: int = 0, num_words: int = 60000) -> None:
        self.rng = np.random.default_rng(seed)
        self.words = np.asarray(_words(self.rng, num_words))
        p = 1.0 / np.arange(1, num_words + 1) ** 1.05
        self.cdf = np.cumsum(p / p.sum())

    def text(self, n_words: int) -> str:
        idx = np.minimum(np.searchsorted(self.cdf, self.rng.random(n_words)), len(self.words) - 1)
        words = self.words[idx].tolist()
        for i in range(7, len(words), 9):  # sentences
            words[i] += "."
        for i in range(3, len(words), 13):
            words[i] = words[i].capitalize()
        return " ".join(words)


def build_tokenizer(vocab: int) -> Path:
    """The demo tokenizer (ChatML template) trained on the synthetic text with a ``vocab``-size BPE."""
    out = CACHE / f"tokenizer_{vocab}"
    if (out / "tokenizer.json").exists():
        return out
    from omnipack.demo.tokenizer import build_demo_tokenizer

    src = TextSource(seed=1)
    return build_demo_tokenizer(out, vocab_size=vocab, training_text=(src.text(500) for _ in range(20000)))


# (exchanges low/high, question words lognormal mu/sigma, answer words lognormal mu/sigma)
SHAPES = {
    "long": ((1, 4), (3.5, 0.8), (4.4, 0.9)),  # ~720 tokens a sample: the measure-speed check
    "short": ((1, 3), (2.8, 0.7), (3.6, 0.8)),  # ~170 tokens a sample: the scale sweep (1M in reach)
}


def build_corpus(n: int, shape: str = "long", seed: int = 0) -> Path:
    """``n`` text conversations as a JSONL manifest (cached per size and shape)."""
    path = CACHE / (f"corpus_{n}.jsonl" if shape == "long" else f"corpus_{shape}_{n}.jsonl")
    if path.exists():
        return path
    base = 100_000
    if n > base and n % base == 0:  # the base corpus repeated with fresh ids: same length distribution
        tmp = path.with_suffix(".partial")
        lines = build_corpus(base, shape, seed).read_bytes().splitlines(keepends=True)
        with open(tmp, "wb") as f:
            for r in range(n // base):
                f.writelines(line.replace(b'{"id": "s', b'{"id": "r%d-s' % r, 1) for line in lines)
        os.replace(tmp, path)
        return path
    (lo, hi), (qm, qs), (am, as_) = SHAPES[shape]
    src = TextSource(seed=seed)
    rng = np.random.default_rng(seed + 1)
    tmp = path.with_suffix(".partial")
    with open(tmp, "w") as f:
        for i in range(n):
            messages = [{"role": "system", "content": "You are a helpful assistant."}]
            for _ in range(int(rng.integers(lo, hi))):
                q = int(np.clip(rng.lognormal(qm, qs), 3, 2000))
                a = int(np.clip(rng.lognormal(am, as_), 3, 2500))
                messages.append({"role": "user", "content": src.text(q)})
                messages.append({"role": "assistant", "content": src.text(a)})
            f.write(json.dumps({"id": f"s{i}", "messages": messages}) + "\n")
    os.replace(tmp, path)
    return path


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def run_prepare_child(manifest: str, tokenizer: str, out: str, workers: int) -> None:
    """One prepare in this (fresh) process; prints a JSON line with its timings and peak RSS."""
    from omnipack.pipeline import PrepareConfig, run_prepare

    t0 = time.perf_counter()
    c0 = time.process_time()
    cfg = PrepareConfig(
        manifest=[manifest],
        media_root=str(CACHE),
        tokenizer=tokenizer,
        output=out,
        seq_length=4096,
        workers=workers,
        overwrite=True,
        mrope=False,  # the recorded numbers' workload (mRoPE ids are on by default now)
        progress=False,
    )
    summary = run_prepare(cfg)
    dt = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "seconds": dt,
                "cpu_seconds": time.process_time() - c0 + children.ru_utime + children.ru_stime,
                "peak_rss_mb": _peak_rss_mb(),
                "input": summary["counts"]["input"],
                "packed": summary["counts"]["packed"],
                "rows": summary["counts"]["rows"],
            }
        )
    )


def prepare_at(n: int, tokenizer: Path, workers: int) -> dict:
    manifest = build_corpus(n, "short")
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        cmd = [sys.executable, __file__, "--child", str(manifest), str(tokenizer), tmp, str(workers)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"prepare of {n} samples failed:\n{res.stderr[-4000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1])


def measure_speed(n: int, tokenizer: Path, repeats: int, chunk: int = 250) -> dict:
    """Tokens/s of the measure stage vs the tokenizer's batch encode of the same rendered text (one core).

    The measure stage runs whole (manifest read and schema check, template, tokenization, labels, table
    write) with its worker built beforehand: start-up (tokenizer load and setup checks, once per worker)
    is timed separately. CPU time of this process (both sides run on one thread).

    Two estimates, both sides treated alike: the whole corpus, best of ``repeats`` (a neighbour's burst
    slows whichever run it lands on), and the corpus cut into chunks of ``chunk`` samples, each chunk timed
    on both sides back to back in every repeat, summing each chunk's best time (so one burst spoils one
    chunk's time in one repeat, not a whole run)."""
    from transformers import AutoTokenizer

    from omnipack.manifest import read_manifest
    from omnipack.stages.measure import measure_part, split_input, worker_measurer
    from omnipack.stages.pack_planner import PackConfig
    from omnipack.stages.spec import MeasureConfig, RunSpec, ShardLayout, WriteSettings
    from omnipack.stages.worker import WorkerContext
    from omnipack.text.chat import template_messages

    manifest = build_corpus(n)
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    texts = [
        tok.apply_chat_template(template_messages(r.messages), tokenize=False)
        for r in read_manifest([manifest])
    ]
    cfg = MeasureConfig("qwen2_5_vl", str(tokenizer), str(CACHE), max_tokens=4096)
    t0 = time.perf_counter()
    worker = WorkerContext()
    worker_measurer(worker, cfg)  # this worker's Measurer (tokenizer load, setup probes), which measure_part reuses
    startup = time.perf_counter() - t0

    def encode(batch: list[str]) -> tuple[float, int]:
        t0 = time.process_time()
        ids = tok(batch, add_special_tokens=False)["input_ids"]
        return time.process_time() - t0, sum(map(len, ids))

    def run(path: Path) -> float:
        """The measure stage's unit on the whole file as one part (parts are split outside the timing, as
        a run splits its input once): read, check, render, tokenize, Parquet + Arrow outputs, record."""
        parts = tuple(split_input([path], part_lines=1 << 40))
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            spec = RunSpec(
                output=tmp,
                manifests=(str(path),),
                measure=cfg,
                max_line_bytes=1 << 24,
                part_lines=1 << 40,
                pack=PackConfig(seq_length=4096),
                layout=ShardLayout(),
                write=WriteSettings("", 4096, 1, 0),
                parts=parts,
            )
            t0 = time.process_time()
            measure_part(spec, 0, worker)
            return time.process_time() - t0

    lines = manifest.read_bytes().splitlines(keepends=True)
    bounds = list(range(0, n, chunk))
    whole_enc: list[float] = []
    whole_measure: list[float] = []
    chunk_enc = [float("inf")] * len(bounds)
    chunk_measure = [float("inf")] * len(bounds)
    tokens = 0
    with tempfile.TemporaryDirectory(dir=CACHE) as parts:
        paths = []
        for k, a in enumerate(bounds):
            paths.append(Path(parts) / f"chunk{k}.jsonl")
            paths[-1].write_bytes(b"".join(lines[a : a + chunk]))
        for _ in range(repeats):
            dt, tokens = encode(texts)
            whole_enc.append(dt)
            whole_measure.append(run(manifest))
            for k, a in enumerate(bounds):
                chunk_enc[k] = min(chunk_enc[k], encode(texts[a : a + chunk])[0])
                chunk_measure[k] = min(chunk_measure[k], run(paths[k]))
    return {
        "samples": n,
        "tokens": tokens,
        "startup_s": startup,
        "encode_tok_s": tokens / min(whole_enc),
        "measure_tok_s": tokens / min(whole_measure),
        "whole_encode_s": whole_enc,
        "whole_measure_s": whole_measure,
        "chunks": len(bounds),
        "chunk_encode_tok_s": tokens / sum(chunk_enc),
        "chunk_measure_tok_s": tokens / sum(chunk_measure),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated corpus sizes")
    ap.add_argument("--base", type=int, default=100000, help="size the ratios are taken against")
    ap.add_argument("--vocab", type=int, default=65536)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--speed-samples", type=int, default=5000, help="corpus size of the measure-speed check")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many measure-speed runs")
    ap.add_argument(
        "--speed-chunk", type=int, default=250, help="samples per chunk of the per-chunk estimate"
    )
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        manifest, tokenizer, out, workers = args.child
        run_prepare_child(manifest, tokenizer, out, int(workers))
        return

    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tokenizer = build_tokenizer(args.vocab)
    from transformers import AutoTokenizer

    print(
        f"tokenizer: {len(AutoTokenizer.from_pretrained(str(tokenizer)))} tokens ({time.perf_counter() - t0:.0f} s)"
    )

    if not args.skip_speed:
        s = measure_speed(args.speed_samples, tokenizer, args.repeats, args.speed_chunk)
        print(
            f"\nmeasure speed, {s['samples']} samples, {s['tokens']} tokens, one core, best of {args.repeats} "
            f"(worker start-up {s['startup_s']:.1f} s once, not included)"
        )
        print(
            "| what                           | whole corpus tokens/s | ratio | per-chunk best tokens/s | ratio |"
        )
        print(
            "|--------------------------------|-----------------------|-------|-------------------------|-------|"
        )
        print(
            f"| tokenizer batch encode         | {s['encode_tok_s']:21.0f} | 1.00  "
            f"| {s['chunk_encode_tok_s']:23.0f} | 1.00  |"
        )
        ratio = s["measure_tok_s"] / s["encode_tok_s"]
        chunk_ratio = s["chunk_measure_tok_s"] / s["chunk_encode_tok_s"]
        print(
            f"| omnipack measure stage         | {s['measure_tok_s']:21.0f} | {ratio:.2f}  "
            f"| {s['chunk_measure_tok_s']:23.0f} | {chunk_ratio:.2f}  |"
        )
        print(f"({s['chunks']} chunks of {args.speed_chunk} samples)")
        print(
            "whole-corpus runs, CPU s, in turn: tokenizer "
            + ", ".join(f"{x:.2f}" for x in s["whole_encode_s"])
            + "; measure stage "
            + ", ".join(f"{x:.2f}" for x in s["whole_measure_s"])
        )

    if not args.skip_sweep:
        sizes = [int(x) for x in args.sizes.split(",")]
        results = {}
        for n in sizes:
            build_corpus(n, "short")
            results[n] = prepare_at(n, tokenizer, args.workers)
            r = results[n]
            print(
                f"  {n}: {r['seconds']:.1f} s wall, {r['cpu_seconds']:.1f} s CPU, {r['peak_rss_mb']:.0f} MB peak, "
                f"{r['rows']} rows",
                flush=True,
            )
        base = results.get(args.base)
        print(f"\nprepare scale sweep, {args.workers} worker(s), W=4096")
        print("| samples   | rows     | wall s  | CPU s   | CPU ms/sample | x base | peak RSS MB | x base |")
        print("|-----------|----------|---------|---------|---------------|--------|-------------|--------|")
        for n, r in results.items():
            per = r["cpu_seconds"] / n * 1e3
            t_ratio = f"{per / (base['cpu_seconds'] / args.base * 1e3):.2f}" if base else "-"
            m_ratio = f"{r['peak_rss_mb'] / base['peak_rss_mb']:.2f}" if base else "-"
            print(
                f"| {n:9d} | {r['rows']:8d} | {r['seconds']:7.1f} | {r['cpu_seconds']:7.1f} | {per:13.3f} "
                f"| {t_ratio:>6} | {r['peak_rss_mb']:11.0f} | {m_ratio:>6} |"
            )


if __name__ == "__main__":
    main()
