"""Reading inputs: records per second and peak memory of each reader, against omnipack's JSONL reader.

Corpus: ``--records`` LLaMA-Factory chat records (a user question with an ``<image>`` marker, an assistant
answer of a few hundred characters, one image path), written once as JSONL, as one JSON array, as Parquet (row groups of 10k) and as a
``save_to_disk``-style Arrow folder; plus a Parquet file of a fifth as many records whose image column embeds
``--image-kb`` KiB of random bytes per record (kept in the file; records get ``embedded:`` pointers). Each reader runs in a fresh
process that reads every record through ``omnipack.manifest.read_manifest`` (validation included); the
table shows the best of ``--repeat`` runs, the ratio of its throughput to JSONL's, and the peak resident
resident memory (sampled every 5 ms) over the process's baseline after imports, next to the input's size (streaming: the peak must not
grow with the input). The last columns read the same input as the measure stage does: split into parts of
``--part-records`` records (``omnipack.inputs.split_parts``), then each part on its own (``read_part``).

    PYTHONPATH=. python benchmarks/bench_inputs.py --quick   # 20k records, ~20 s
    PYTHONPATH=. python benchmarks/bench_inputs.py           # 100k records
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

CHILD = r"""
import json, sys, threading, time
from pathlib import Path
from omnipack.manifest import read_manifest
from omnipack.inputs import InputSpec, read_part, split_parts
import omnipack.inputs, pyarrow.parquet  # imports done before the baseline

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

peak, done = [0.0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_mb())
        time.sleep(0.005)
base = rss_mb()
threading.Thread(target=sample, daemon=True).start()
t = time.perf_counter()
n = bad = 0
if sys.argv[2] == "whole":
    samples = read_manifest([Path(sys.argv[1])])
else:  # as the measure stage reads: split into parts, then each part on its own
    parts = split_parts([Path(sys.argv[1])], InputSpec(), int(sys.argv[2]))
    samples = (s for part in parts for s in read_part(part, InputSpec()))
for s in samples:
    n += 1
    bad += s.error is not None
dt = time.perf_counter() - t
done.set()
print(json.dumps({"records": n, "errors": bad, "seconds": dt, "peak_mb": max(peak[0], rss_mb()) - base}))
"""


def _record(i: int) -> dict:
    """A LLaMA-Factory-style record (string contents: every format, Parquet included, can hold it)."""
    return {"id": f"r{i}", **_lf_record(i, f"imgs/{i % 997}.jpg")}


def _omnipack_record(i: int) -> dict:
    return {
        "id": f"r{i}",
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": f"imgs/{i % 997}.jpg"}, {"type": "text", "text": f"What is shown in picture {i}?"}]},
            {"role": "assistant", "content": ("A photograph of a quiet street with parked bicycles. " * 6) + str(i)},
        ],
    }  # fmt: skip


def _lf_record(i: int, image: object) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"<image>What is shown in picture {i}?"},
            {"role": "assistant", "content": ("A photograph of a quiet street with parked bicycles. " * 6) + str(i)},
        ],
        "images": [image if isinstance(image, str) else {"bytes": image, "path": None}],
    }  # fmt: skip


def build(folder: Path, n: int, image_kb: int) -> dict[str, Path]:
    recs = [_record(i) for i in range(n)]
    paths = {"jsonl": folder / "m.jsonl", "json array": folder / "m.json", "parquet": folder / "m.parquet"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in recs))
    omni = folder / "omnipack.jsonl"  # omnipack's own layout: content parts, no conversion
    omni.write_text("".join(json.dumps(_omnipack_record(i)) + "\n" for i in range(n)))
    with open(paths["json array"], "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(r) for r in recs) + "\n]\n")
    table = pa.Table.from_pylist(recs)
    pq.write_table(table, paths["parquet"], row_group_size=10_000)
    arrow = folder / "saved"
    arrow.mkdir()
    with (
        pa.OSFile(str(arrow / "data-00000-of-00001.arrow"), "wb") as f,
        pa.ipc.new_stream(f, table.schema) as w,
    ):
        for batch in table.to_batches(max_chunksize=1000):
            w.write_batch(batch)
    (arrow / "state.json").write_text(
        json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]})
    )
    paths["arrow (save_to_disk)"] = arrow
    pool = random.Random(0).randbytes(1 << 20)  # incompressible, and different for every record

    def image(i: int) -> bytes:
        k = (i * 7919) % ((1 << 20) - image_kb * 1024)
        return pool[k : k + image_kb * 1024]

    emb = folder / "embedded.parquet"
    n_emb = n // 5
    with pq.ParquetWriter(emb, pa.Table.from_pylist([_lf_record(0, image(0))]).schema) as w:
        for lo in range(0, n_emb, 1000):  # written in parts: the writer must not hold the corpus either
            w.write_table(
                pa.Table.from_pylist([_lf_record(i, image(i)) for i in range(lo, min(n_emb, lo + 1000))])
            )
    paths[f"parquet, {n_emb} records with a {image_kb} KiB embedded image each"] = emb
    paths["jsonl, omnipack layout"] = omni
    return paths


def size_mb(p: Path) -> float:
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--image-kb", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="20k records, one run each")
    ap.add_argument("--part-records", type=int, default=4096, help="records per measure part")
    args = ap.parse_args()
    if args.quick:
        args.records, args.repeat = 20_000, 1
    with tempfile.TemporaryDirectory() as tmp:
        paths = build(Path(tmp), args.records, args.image_kb)
        rows = []
        for name, path in paths.items():
            row, counts = [name, size_mb(path)], set()
            for mode in ("whole", str(args.part_records)):
                runs = []
                for _ in range(args.repeat):
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, str(path), mode],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    runs.append(json.loads(out.stdout))
                best = min(runs, key=lambda r: r["seconds"])
                assert best["errors"] == 0, best
                row += [best["records"] / best["seconds"], max(r["peak_mb"] for r in runs)]
                counts.add(best["records"])
            assert len(counts) == 1, (name, counts)  # the parts hold every record once
            rows.append(row)
    base = rows[0][2]
    print(f"{args.records} records, best of {args.repeat}; parts of {args.part_records} records\n")
    print(
        "| input | size MiB | records/s | vs JSONL | peak memory over baseline MiB "
        "| records/s in parts (split + read) | parts vs whole |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, mb, rate, peak, part_rate, _ in rows:
        print(
            f"| {name} | {mb:.0f} | {rate:,.0f} | {rate / base:.2f}x | {peak:.0f} "
            f"| {part_rate:,.0f} | {part_rate / rate:.2f}x |"
        )


if __name__ == "__main__":
    main()
