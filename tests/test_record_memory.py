"""Memory per record: one huge manifest line costs prepare a small multiple of its size, not gigabytes.

Each run is a process of its own (``workers=1``: measured in that process), forked from the tests' warm server
(``tests/prepare_child.py``: the prepare stack imported once, not once per run) with its peak RSS (``VmHWM``)
reset to its resident size at its start, so the peak is its own run's; growth is measured against the same corpus without the huge line. A line's text is held a few times at
once while it is measured (the line's bytes, its decoded text, the parsed record, the rendered conversation,
the reserved-token scan's joined texts), plus a fixed window of the tokenizer's memory (``text/token_count``),
so the bound is 8x the line's size: room for allocator slack, and far below what tokenizing it whole costs
(~300 bytes a token; 2.7 GB for the 10 MB line). A line over the byte limit is rejected unread, with its size.

A watcher in the child stops a run that passes twice the bound, so a regression fails the test instead of
exhausting the machine (tokenizing the 100 MB line whole would take ~30 GB)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from omnipack.tools.verify import run_verify
from tests.prepare_child import run_python

REPO = Path(__file__).resolve().parents[1]
SEQ_LENGTH = 1_000_000  # a long-context run: the demo tokenizer's character bound alone lets a 10 MB text through
MB = 1_000_000
GROWTH_PER_BYTE = 8

CHILD = r"""
import json, os, sys, threading, time
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here: this run's, not the fork server's
from omnipack.pipeline import PrepareConfig, run_prepare
args = json.loads(sys.argv[1])
cap_mb = args.pop("cap_mb")

def status_mb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) // 1024

def watch():
    while True:
        if status_mb("VmRSS:") > cap_mb:
            print(json.dumps({"over_cap_mb": cap_mb}), flush=True)
            os._exit(3)
        time.sleep(0.005)

threading.Thread(target=watch, daemon=True).start()
summary = run_prepare(PrepareConfig(progress=False, workers=1, **args))
print(json.dumps({"peak_mb": status_mb("VmHWM:"), "counts": summary["counts"]}))
"""


def _prepare(out: Path, manifest: Path, media: Path, tokenizer: Path, cap_mb: int, **kw) -> dict:
    args = {
        "manifest": [str(manifest)], "media_root": str(media), "tokenizer": str(tokenizer), "output": str(out),
        "seq_length": SEQ_LENGTH, "cap_mb": cap_mb, **kw,
    }  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = run_python(CHILD, [json.dumps(args)], env, timeout=600)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    result = json.loads(last)
    assert "over_cap_mb" not in result, f"peak RSS passed {cap_mb} MB (stopped)"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result


def _with_line(tmp: Path, manifest: Path, line: str) -> Path:
    lines = manifest.read_text().splitlines()
    lines.insert(3, line)
    out = tmp / "manifest.jsonl"
    with out.open("w") as f:
        for text in lines:
            f.write(text + "\n")
    return out


def _text_line(size: int) -> str:
    """A chat whose user turn is ``size`` bytes of words (the demo tokenizer makes ~one token per 2 bytes)."""
    qa = [{"role": "user", "content": "w " * (size // 2)}, {"role": "assistant", "content": "ok"}]
    return json.dumps({"id": "huge", "messages": qa})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, demo_tokenizer):
    from omnipack.demo.corpus import build_demo_corpus

    manifest, media = build_demo_corpus(tmp_path_factory.mktemp("corpus"), num_samples=20)
    base = _prepare(tmp_path_factory.mktemp("base") / "ds", manifest, media, demo_tokenizer, cap_mb=4000)
    return manifest, media, base["peak_mb"]


def _check_accounted(root: Path, counts: dict, manifest: Path) -> dict[str, dict]:
    rejects = {r["sample_id"]: r for r in map(json.loads, (root / "rejects.jsonl").read_text().splitlines())}
    assert counts["input"] == sum(1 for _ in manifest.open()) == counts["packed"] + counts["rejected"]
    assert all(r.status == "pass" for r in run_verify(root, progress=False, payloads=False))
    return rejects


@pytest.mark.parametrize("size", [10 * MB, 100 * MB], ids=["10MB", "100MB"])
def test_a_huge_text_line_costs_a_small_multiple_of_its_size(tmp_path, demo_tokenizer, corpus, size):
    manifest, media, base_mb = corpus
    big = _with_line(tmp_path, manifest, _text_line(size))
    bound_mb = GROWTH_PER_BYTE * size // (1 << 20)
    run = _prepare(
        tmp_path / "ds", big, media, demo_tokenizer, cap_mb=base_mb + 2 * bound_mb, max_line_bytes=2 * size
    )
    growth = run["peak_mb"] - base_mb
    print(f"{size // MB} MB text line: peak RSS {run['peak_mb']} MB, {growth} MB over {base_mb} MB without it")
    assert growth < bound_mb, f"peak RSS grew {growth} MB over the run without the line (bound {bound_mb} MB)"
    rejects = _check_accounted(tmp_path / "ds", run["counts"], big)
    assert rejects["huge"]["stage"] == "measure"
    assert "over-length" in rejects["huge"]["reason"] and "rejected before tokenizing" in rejects["huge"]["reason"]


def test_a_line_over_the_byte_limit_is_rejected_unread_with_its_size(tmp_path, demo_tokenizer, corpus):
    manifest, media, base_mb = corpus
    line = _text_line(100 * MB)
    big = _with_line(tmp_path, manifest, line)
    limit = 16 << 20
    run = _prepare(tmp_path / "ds", big, media, demo_tokenizer, cap_mb=base_mb + 1000, max_line_bytes=limit)
    growth = run["peak_mb"] - base_mb
    print(f"100 MB line over a 16 MiB limit: peak RSS {run['peak_mb']} MB, {growth} MB over {base_mb} MB")
    assert growth < GROWTH_PER_BYTE * limit // (1 << 20), f"peak RSS grew {growth} MB reading past the line"
    rejects = _check_accounted(tmp_path / "ds", run["counts"], big)
    reject = rejects["manifest.jsonl:4"]  # unread: no id, the line's place names it
    assert reject["stage"] == "read"
    assert reject["reason"] == (
        f"line of {len(line) + 1} bytes is over the {limit}-byte limit (max_line_bytes); not read"
    )
