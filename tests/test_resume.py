"""Resume: a run killed with SIGKILL in measure, pack, write or finalize, rerun with the same command, redoes only
the unfinished units and ends byte-identical to an uninterrupted run; changed inputs are redone."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from omnipack.pipeline import run_prepare
from tests.stage_outputs import dataset_bytes, demo_config, prepare_in_subprocess


@pytest.fixture(scope="module")
def reference(demo_reference):
    return dataset_bytes(demo_reference)




def _mtimes(root: Path, pattern: str) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.glob(pattern))}


def _killed(res: subprocess.CompletedProcess) -> bool:
    return res.returncode == -signal.SIGKILL


def test_kill_in_measure_redoes_only_unfinished_parts(tmp_path, reference, demo_tokenizer, demo_corpus):
    cfg = demo_config(tmp_path / "ds", demo_tokenizer, demo_corpus)
    res = prepare_in_subprocess(cfg, "measure:2")
    assert _killed(res), res.stderr
    measure = tmp_path / "ds" / "stages" / "measure"
    assert (measure / "part-000002.parquet").exists() and not (measure / "part-000002.json").exists()
    assert not (tmp_path / "ds" / ".nv-meta").exists()
    done = _mtimes(measure, "part-00000[01].*")
    assert len(done) == 8  # parts 0 and 1: samples, rejects, Arrow copy, record
    res = prepare_in_subprocess(cfg)  # the same command again
    assert res.returncode == 0, res.stderr
    assert _mtimes(measure, "part-00000[01].*") == done  # finished parts are not measured again
    assert dataset_bytes(tmp_path / "ds") == reference


def test_kill_of_a_pool_worker_then_rerun(tmp_path, reference, demo_tokenizer, demo_corpus):
    cfg = demo_config(tmp_path / "ds", demo_tokenizer, demo_corpus, workers=2)
    res = prepare_in_subprocess(cfg, "measure:1")  # a worker dies: the run fails (it does not hang)
    assert res.returncode != 0 and "BrokenProcessPool" in res.stderr, res.stderr
    res = prepare_in_subprocess(cfg)
    assert res.returncode == 0, res.stderr
    assert dataset_bytes(tmp_path / "ds") == reference


def test_kill_in_write_redoes_only_unfinished_shards(tmp_path, reference, demo_tokenizer, demo_corpus):
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "write:2"))
    assert (root / "shards" / "shard-000002.tar").exists()  # written, but not recorded: not done
    assert not (root / "stages" / "write" / "shard-000002.json").exists()
    assert not (root / ".nv-meta").exists()
    before = _mtimes(root, "shards/shard-00000[01].tar") | _mtimes(root, "stages/measure/*")
    assert prepare_in_subprocess(cfg).returncode == 0
    assert _mtimes(root, "shards/shard-00000[01].tar") | _mtimes(root, "stages/measure/*") == before
    assert dataset_bytes(root) == reference


def test_half_written_files_of_a_killed_run_are_removed(tmp_path, reference, demo_tokenizer, demo_corpus):
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "write:2"))
    # what a kill mid-write leaves: files built under temporary names, never renamed into place
    left = [
        root / "shards" / "shard-000003.tar.partial",
        root / "stages" / "measure" / "part-000001.parquet.4242.partial",
        root / "rejects.jsonl.4242.partial",
    ]
    for path in left:
        path.write_bytes(b"half")
    res = prepare_in_subprocess(cfg)
    assert res.returncode == 0, res.stderr
    assert "removed 3 half-written file(s)" in res.stderr
    assert not any(p.exists() for p in left) and not list(root.rglob("*.partial"))
    assert dataset_bytes(root) == reference


def _damage(path: Path, at: int) -> None:
    """Flip one byte in place: same size, same mtime (only the bytes say it changed)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def test_resume_redoes_a_recorded_shard_damaged_at_the_same_size(
    tmp_path, reference, demo_tokenizer, demo_corpus
):
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "write:2"))
    shards = root / "shards"
    assert (root / "stages" / "write" / "shard-000001.json").exists()  # shards 0 and 1 are recorded
    _damage(shards / "shard-000000.tar", 700)  # inside the first member's data
    _damage(shards / "shard-000001.tar.idx", 9)  # an offset of the index
    assert prepare_in_subprocess(cfg).returncode == 0
    assert dataset_bytes(root) == reference  # both damaged files were written again


def test_kill_in_pack_then_rerun(tmp_path, reference, demo_tokenizer, demo_corpus):
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "pack:0"))
    assert (root / "stages" / "plan.parquet").exists() and not (root / "stages" / "plan.json").exists()
    measured = _mtimes(root, "stages/measure/part-*")
    assert prepare_in_subprocess(cfg).returncode == 0
    assert _mtimes(root, "stages/measure/part-*") == measured
    assert dataset_bytes(root) == reference


def test_kill_in_finalize_leaves_no_dataset_then_completes(tmp_path, reference, demo_tokenizer, demo_corpus):
    from omnipack.cli import main

    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "finalize:0"))
    assert (root / "rejects.jsonl").exists() and not (root / ".nv-meta").exists()
    assert main(["verify", str(root)]) != 0  # an unfinished run is not a dataset
    shards = _mtimes(root, "shards/*")
    assert prepare_in_subprocess(cfg).returncode == 0
    assert _mtimes(root, "shards/*") == shards  # nothing rewritten
    assert dataset_bytes(root) == reference
    assert main(["verify", str(root)]) == 0


def test_kill_after_the_dataset_appeared_then_the_same_command_is_done(
    tmp_path, reference, demo_tokenizer, demo_corpus
):
    """Killed once the dataset is whole but before its lock was released: the same command sees its run
    finished and exits 0 without writing; another command into the finished dataset is still refused."""
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "finalize:done"))
    assert dataset_bytes(root) == reference and (root / ".omnipack-lock" / "run.lock").exists()
    files = {k: v for k, v in _mtimes(root, "**/*").items() if not k.startswith(".omnipack-lock")}
    res = prepare_in_subprocess(cfg)
    assert res.returncode == 0, res.stderr
    assert "finished dataset of this run: nothing to do" in res.stderr
    assert not (root / ".omnipack-lock").exists()  # the dead run's lock taken over, then released
    assert _mtimes(root, "**/*") == files  # nothing written
    other = prepare_in_subprocess(demo_config(root, demo_tokenizer, demo_corpus, shard_max_rows=5))
    assert other.returncode == 2 and "already holds a dataset" in other.stderr
    # an input edited since: not this run's dataset any more
    manifest, media = demo_corpus
    edited = tmp_path / "m.jsonl"
    edited.write_bytes(manifest.read_bytes())
    moved = tmp_path / "moved"
    cfg = demo_config(moved, demo_tokenizer, (edited, media))
    assert prepare_in_subprocess(cfg).returncode == 0
    os.utime(edited, ns=(0, edited.stat().st_mtime_ns + 10**9))
    changed = prepare_in_subprocess(cfg)
    assert changed.returncode == 2 and "already holds a dataset" in changed.stderr


def test_changed_input_redoes_its_part_only(tmp_path, demo_tokenizer, demo_corpus):
    manifest, media = demo_corpus
    lines = manifest.read_text().splitlines()
    edited = tmp_path / "m.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, (edited, media))
    assert _killed(prepare_in_subprocess(cfg, "write:0"))
    measure = root / "stages" / "measure"
    first_parts = _mtimes(measure, "part-00000[0-2].parquet")
    last = sorted(measure.glob("part-*.parquet"))[-1].name
    last_before = (measure / last).stat().st_mtime_ns
    lines[-1] = lines[-1].replace('"content": "', '"content": "edited ', 1)
    assert lines[-1] != edited.read_text().splitlines()[-1]
    edited.write_text("\n".join(lines) + "\n")
    assert prepare_in_subprocess(cfg).returncode == 0
    assert _mtimes(measure, "part-00000[0-2].parquet") == first_parts
    assert (measure / last).stat().st_mtime_ns != last_before  # its bytes changed: measured again
    fresh = tmp_path / "fresh"
    run_prepare(demo_config(fresh, demo_tokenizer, (edited, media)))
    assert dataset_bytes(root) == dataset_bytes(fresh)


def test_a_rerun_says_what_it_keeps_and_how_it_checks_it(tmp_path, demo_tokenizer, demo_corpus):
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "write:2"))
    parts = sorted((root / "stages" / "measure").glob("part-*.json"))
    measure = root / "stages" / "measure"
    measured = sum(p.stat().st_size for p in measure.glob("part-*") if p.suffix != ".json")
    shards = sum(p.stat().st_size for p in (root / "shards").glob("shard-00000[01].tar"))
    res = prepare_in_subprocess(cfg)  # --no-progress: said all the same, for a batch job's log
    assert res.returncode == 0, res.stderr
    assert f"resuming: {len(parts)} of {len(parts)} measure units done" in res.stderr
    assert f"kept: {measured / 2**20:,.1f} MiB of files, trusted by their recorded stamps" in res.stderr
    assert "resuming: 2 of " in res.stderr and f"{shards / 2**20:,.1f} MiB" in res.stderr
    assert "resuming: the plan of the earlier run is current: kept" in res.stderr


def test_kept_files_are_trusted_by_their_stamps_without_being_read(
    tmp_path, reference, demo_tokenizer, demo_corpus, monkeypatch
):
    """Resume's check of what it keeps costs a stat per file, not a read of every finished byte (hours at
    tens of TB); a file whose stamp changed (copied elsewhere: another inode, the same bytes) is read to
    check its checksum, and kept when it matches."""
    import shutil

    from omnipack.stages import records

    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    assert _killed(prepare_in_subprocess(cfg, "write:2"))
    copied = root / "shards" / "shard-000000.tar"
    shutil.copy2(copied, tmp_path / "copy.tar")  # content and mtime kept, as rsync -a or cp -p would
    os.replace(tmp_path / "copy.tar", copied)
    kept = {*root.glob("stages/measure/part-*[!n]"), *root.glob("shards/shard-00000[01].tar*")}
    assert len(kept) > 6
    before = _mtimes(root, "shards/shard-00000[01].tar*")
    hashed = []
    real = records.file_xxh3
    monkeypatch.setattr(records, "file_xxh3", lambda path: hashed.append(path) or real(path))
    run_prepare(cfg)  # workers=1: the units run in this process
    assert dataset_bytes(root) == reference
    assert _mtimes(root, "shards/shard-00000[01].tar*") == before  # both kept, none rewritten
    assert {p for p in hashed if p in kept} == {copied}


def test_a_staged_rank_removes_the_half_written_files_of_its_own_units(tmp_path, demo_tokenizer, demo_corpus):
    """A rank's units are its own (one lease per rank, one world size): their leftovers are removed when the
    unit runs again, while another rank's, which may be being written right now, stay."""
    root = tmp_path / "ds"
    cfg = demo_config(root, demo_tokenizer, demo_corpus)
    rank1 = ("--stage", "measure", "--rank", "1", "--world-size", "2")
    assert _killed(prepare_in_subprocess(cfg, "measure:1", args=rank1))
    measure = root / "stages" / "measure"
    own = [measure / "part-000001.arrow.4242.partial", measure / "part-000003.parquet.4242.partial"]
    other = measure / "part-000000.parquet.4242.partial"  # rank 0's unit
    for path in [*own, other]:
        path.write_bytes(b"half")
    res = prepare_in_subprocess(cfg, args=rank1)
    assert res.returncode == 0, res.stderr
    assert not any(p.exists() for p in own) and other.exists()
