"""The stages as units: a staged run (ranks per stage, as a Slurm array runs them) and any split of the
input into parts give the same bytes as one local run; stages refuse to run ahead of their inputs."""

from __future__ import annotations

import json

import pytest

from omnipack.cli import main
from omnipack.inputs import InputSpec
from omnipack.pipeline import run_prepare
from omnipack.stages.finalize import RunSummary
from omnipack.stages.measure import split_input
from tests.stage_outputs import cli_args, dataset_bytes, demo_config


@pytest.fixture(scope="module")
def reference(demo_reference):
    """One local run with one worker: the bytes every other way of running must reproduce."""
    return (dataset_bytes(demo_reference),)


def test_parts_cover_every_line_once_with_their_line_numbers(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [f'{{"n": {i}}}' for i in range(23)]
    path.write_bytes(("\n".join(lines) + "\n").encode())
    no_newline = tmp_path / "last.jsonl"
    no_newline.write_bytes(b"{\"a\": 1}\n{\"b\": 2}\n{\"c\": 3}")  # the last line whole, without its newline
    for chunk in (1 << 24, 7):  # a chunk boundary inside lines and parts
        import omnipack.inputs.jsonl as jsonl_reader

        saved, jsonl_reader._CHUNK = jsonl_reader._CHUNK, chunk
        try:
            parts = split_input([path, no_newline], part_lines=5)
        finally:
            jsonl_reader._CHUNK = saved
        assert [(p.path.endswith("m.jsonl"), p.first_line, p.num_lines) for p in parts] == [
            (True, 1, 5),
            (True, 6, 5),
            (True, 11, 5),
            (True, 16, 5),
            (True, 21, 3),
            (False, 1, 3),
        ]
        data = path.read_bytes()
        for p in parts[:5]:
            assert data[p.start_byte :].split(b"\n")[0] == lines[p.first_line - 1].encode()
        assert len({p.xxh3 for p in parts}) == len(parts)


def test_run_summary_is_omnipack_json_and_reads_back_whole(reference):
    """The typed run summary is what omnipack.json records (with the root stamped in afterwards), and the file
    reads back into it: the same JSON, the counts and shards typed."""
    (files,) = reference
    text = files[".nv-meta/omnipack.json"].decode()
    summary = json.loads(text)
    assert summary["root"]["sha256"]
    typed = RunSummary.from_json(summary)
    assert typed.to_json() == summary  # every key, in the file's order
    assert list(typed.to_json()) == list(summary)
    assert typed.counts.input == typed.counts.packed + typed.counts.rejected > 0
    assert [s.path for s in typed.shards] == [s["path"] for s in summary["shards"]]
    assert json.dumps(typed.to_json(), indent=2) + "\n" == text
    assert "processor_cache" not in typed.to_json() and typed.processor_cache is None


def test_staged_cli_ranks_give_the_bytes_of_one_local_run(tmp_path, reference, demo_tokenizer, demo_corpus):
    cfg = demo_config(tmp_path / "staged", demo_tokenizer, demo_corpus)
    args = cli_args(cfg)
    assert main([*args, "--stage", "pack"]) == 2  # nothing measured yet: refused, clearly
    assert main([*args, "--stage", "measure", "--overwrite"]) == 2  # ranks must not delete each other's work
    for rank in range(3):
        assert main([*args, "--stage", "measure", "--rank", str(rank), "--world-size", "3"]) == 0
    assert main([*args, "--stage", "pack"]) == 0
    assert main([*args, "--stage", "finalize"]) == 2  # no shard written yet
    plan = json.loads((tmp_path / "staged" / "stages" / "plan.json").read_text())
    assert len(plan["shards"]) > 2 and len(plan["parts"]) > 2  # every rank had work
    assert main([*args, "--stage", "write", "--rank", "1", "--world-size", "2"]) == 0
    assert not (tmp_path / "staged" / ".nv-meta").exists()
    assert main([*args, "--stage", "finalize"]) == 2  # rank 0's shards are missing
    assert main([*args, "--stage", "write", "--rank", "0", "--world-size", "2"]) == 0
    assert main([*args, "--stage", "finalize"]) == 0
    assert dataset_bytes(tmp_path / "staged") == reference[0]


def test_local_workers_and_part_sizes_give_the_same_bytes(tmp_path, reference, demo_tokenizer, demo_corpus):
    two = tmp_path / "two"
    run_prepare(demo_config(two, demo_tokenizer, demo_corpus, workers=2))
    assert dataset_bytes(two) == reference[0]
    whole = tmp_path / "one-part"
    run_prepare(demo_config(whole, demo_tokenizer, demo_corpus, part_lines=4096))
    assert dataset_bytes(whole) == reference[0]


def test_duplicate_ids_are_found_across_parts(tmp_path, demo_tokenizer, demo_corpus):
    manifest, media = demo_corpus
    lines = manifest.read_text().splitlines()
    first = json.loads(lines[0])["id"]
    edited = tmp_path / "dup.jsonl"
    edited.write_text("\n".join([*lines, lines[0], lines[2]]) + "\n")  # two ids again, in the last part
    outputs = []
    for part_lines in (16, 4096):  # across parts, and within the one part
        out = tmp_path / f"p{part_lines}"
        summary = run_prepare(demo_config(out, demo_tokenizer, (edited, media), part_lines=part_lines))
        rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
        dups = [r for r in rejects if r["reason"].startswith("duplicate sample id")]
        assert [(r["sample_id"], r["stage"], r["sample_index"]) for r in dups] == [
            (first, "read", len(lines)),
            (json.loads(lines[2])["id"], "read", len(lines) + 1),
        ]
        assert summary["counts"]["input"] == len(lines) + 2
        outputs.append(dataset_bytes(out))
        assert main(["verify", str(out)]) == 0  # the ledger closes: each index packed or rejected once
    assert outputs[0] == outputs[1]


def test_an_unfinished_run_resumes_only_with_its_own_settings(tmp_path, demo_tokenizer, demo_corpus):
    out = tmp_path / "ds"
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus), stage="measure")  # an unfinished run
    other = demo_config(out, demo_tokenizer, demo_corpus, seq_length=1024, shard_max_rows=5)
    with pytest.raises(
        FileExistsError, match=r"unfinished run with other settings \(seq_length, shard_max_rows\)"
    ):
        run_prepare(other)
    with pytest.raises(FileExistsError, match="other settings"):  # nor a piece of it
        run_prepare(other, stage="pack")
    goes_on = demo_config(out, demo_tokenizer, demo_corpus, seq_length=1024, shard_max_rows=5, overwrite=True)
    run_prepare(goes_on)
    fresh = tmp_path / "fresh"
    run_prepare(demo_config(fresh, demo_tokenizer, demo_corpus, seq_length=1024, shard_max_rows=5))
    assert dataset_bytes(out) == dataset_bytes(fresh)


def test_ranks_starting_together_split_the_input_once(tmp_path, monkeypatch):
    """Staged ranks all need the parts: one reads the input, the others wait for its parts.json."""
    import threading
    import time

    import omnipack.stages.measure as measure_stage

    path = tmp_path / "m.jsonl"
    path.write_text("".join(f'{{"n": {i}}}\n' for i in range(40)))
    calls = []
    real_split = measure_stage.split_input

    def slow_split(manifests, part_lines, spec):
        calls.append(part_lines)
        time.sleep(0.5)  # a large input: the other ranks arrive while it is being read
        return real_split(manifests, part_lines, spec)

    monkeypatch.setattr(measure_stage, "split_input", slow_split)
    results: list = [None] * 4

    def rank(i: int) -> None:
        results[i] = measure_stage.load_parts(tmp_path / "stages", [path], InputSpec(), 7, poll_s=0.02)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # one rank read the input
    assert results[0] == real_split([path], 7) and all(r == results[0] for r in results)
    assert not list((tmp_path / "stages").glob("*.claim"))


def test_a_dead_splitters_claim_is_taken_over(tmp_path):
    import socket

    from omnipack.stages.measure import load_parts
    from omnipack.stages.records import digest

    path = tmp_path / "m.jsonl"
    path.write_text("".join(f'{{"n": {i}}}\n' for i in range(10)))
    files = [[str(path), path.stat().st_size, path.stat().st_mtime_ns]]
    key = digest({"files": files, "part_lines": 4})
    stages = tmp_path / "stages"
    stages.mkdir()
    dead = {"pid": 2**22 + 17, "hostname": socket.gethostname(), "start_time": None, "since": 0}
    (stages / f"parts-{key[:16]}.claim").write_text(json.dumps(dead))
    assert [p.num_lines for p in load_parts(stages, [path], InputSpec(), 4, poll_s=0.01)] == [4, 4, 2]


def test_finalize_streams_rejects_to_disk(tmp_path, demo_tokenizer, demo_corpus):
    """Tens of thousands of rejects: finalize writes them one line at a time (Python memory bounded by a
    part's rejects, not the run's), and the file holds them all, in input order."""
    import tracemalloc

    from omnipack.pipeline import build_spec
    from omnipack.stages.finalize import finalize
    from omnipack.stages.records import PlanRecord

    manifest, media = demo_corpus
    n_broken = 40000
    mixed = tmp_path / "mixed.jsonl"
    good = manifest.read_text().splitlines()[:8]
    broken = [f'{{"id": "broken-{i}", "messages": "not a list {i:06d}' for i in range(n_broken)]
    mixed.write_text("\n".join(good + broken) + "\n")
    cfg = demo_config(tmp_path / "ds", demo_tokenizer, (mixed, media), part_lines=4096, max_reject_fraction=1.0)
    summary = run_prepare(cfg)
    spec = build_spec(cfg)
    plan = PlanRecord.read(spec.plan_record)
    tracemalloc.start()
    try:
        again = finalize(spec, plan)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert again.to_json() == summary
    lines = (tmp_path / "ds" / "rejects.jsonl").read_text().splitlines()
    rejects = [json.loads(line) for line in lines]
    assert len(rejects) == summary["counts"]["rejected"] >= n_broken
    assert [r["sample_index"] for r in rejects] == sorted(r["sample_index"] for r in rejects)
    # held whole, each reject cost ~545 B of Python objects here (40k: 21 MB); streamed: ~35 B (an index,
    # and a thousand rejects at a time)
    assert peak < 100 * n_broken, f"finalize peaked at {peak / 2**20:.1f} MiB of Python memory"


def test_stage_records_read_back_as_their_types(tmp_path, demo_tokenizer, demo_corpus):
    """Every stage record on disk is its typed record's JSON, key for key and in order: the types lose
    nothing, and the records of runs made before they existed (the same keys) read back for a resume."""
    from omnipack.dataset.shards import ShardInfo
    from omnipack.errors import Reject
    from omnipack.inputs import InputPart
    from omnipack.stages.records import PartRecord, PlanRecord, ShardRecord

    run_prepare(demo_config(tmp_path, demo_tokenizer, demo_corpus))
    stages = tmp_path / "stages"
    kinds = {
        PartRecord: sorted((stages / "measure").glob("part-*.json")),
        PlanRecord: [stages / "plan.json"],
        ShardRecord: sorted((stages / "write").glob("shard-*.json")),
    }
    typed = {}
    for cls, paths in kinds.items():
        assert paths, cls
        typed[cls] = []
        for path in paths:
            text = path.read_text()
            record = cls.from_json(json.loads(text))
            assert json.dumps(record.to_json(), indent=1) + "\n" == text, path
            typed[cls].append(record)
    assert all(isinstance(p.part, InputPart) for p in typed[PartRecord])
    assert all(isinstance(s.shard, ShardInfo) for s in typed[ShardRecord])
    plan = typed[PlanRecord][0]
    assert [s.number for s in plan.shards] == list(range(len(typed[ShardRecord])))
    rejects = plan.rejects + [r for s in typed[ShardRecord] for r in s.rejects]
    assert all(isinstance(r, Reject) for r in rejects)
    assert sum(p.records for p in typed[PartRecord]) == plan.input == plan.offsets[-1]
