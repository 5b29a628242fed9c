"""Outputs a rerun replaces (a repack's earlier shards) are moved out of the way with a rename and deleted on a
thread of their own while the new ones are written: deleting a file written seconds ago waits for the disk."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

import omnipack.stages.write as write_stage
from omnipack.stages.storage import REPLACED_DIR, BackgroundRemoval, _remove_folder, remove_partials
from omnipack.tools.verify import run_verify
from tests.test_sample_store import _prepare, corpus  # noqa: F401 - the fixture


def test_moved_files_leave_at_once_and_are_deleted_by_close(tmp_path, monkeypatch):
    files = [tmp_path / f"shard-{i}.tar" for i in range(3)]
    for f in files:
        f.write_bytes(b"x" * 1000)
    folder = tmp_path / "stages" / REPLACED_DIR
    gate = threading.Event()  # holds the deleting thread until the moves are checked
    real_unlink = Path.unlink

    def held_unlink(self: Path, *args, **kwargs) -> None:
        gate.wait(10)
        real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", held_unlink)
    with BackgroundRemoval(folder) as removal:
        assert [removal.move(f) for f in files] == [True] * 3
        assert removal.move(tmp_path / "absent.tar") is False
        assert not any(f.exists() for f in files)  # gone from their places before any is deleted
        assert len(list(folder.iterdir())) == 3
        gate.set()
    assert not folder.exists()  # every file deleted, the folder with them


def test_a_failing_run_does_not_wait_for_its_deletions(tmp_path, monkeypatch):
    """An exception (a SIGTERM's included) leaves the rest to the thread and then to the next run: a preempted
    run must not spend its grace period deleting terabytes with its lease held."""
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(b"x")
    gate = threading.Event()
    real_unlink = Path.unlink

    def held_unlink(self: Path, *args, **kwargs) -> None:
        gate.wait(10)
        real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", held_unlink)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt), BackgroundRemoval(tmp_path / REPLACED_DIR) as removal:
        assert removal.move(shard)
        raise KeyboardInterrupt
    assert time.monotonic() - start < 5
    gate.set()  # the thread deletes it once let go


def test_a_symbolic_link_is_not_moved(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "shards").symlink_to(target)
    with BackgroundRemoval(tmp_path / REPLACED_DIR) as removal:
        assert removal.move(tmp_path / "shards") is False
    assert (tmp_path / "shards").is_symlink() and target.is_dir()


def test_a_folder_another_process_deletes_too_is_deleted_whole(tmp_path, monkeypatch):
    folder = tmp_path / "1-0-shards"
    folder.mkdir()
    for i in range(5):
        (folder / f"shard-{i:06d}.tar").write_bytes(b"x")
    real_unlink = os.unlink

    def racing(path, *args, **kwargs):  # another deleter takes every file first
        for f in list(folder.iterdir()):
            real_unlink(f)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", racing)
    _remove_folder(folder)
    assert not folder.exists()


def test_half_built_files_are_looked_for_around_the_folder_being_deleted(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "shard-000000.tar.partial").write_bytes(b"x")
    moved = tmp_path / "stages" / REPLACED_DIR / "1-0-shards"
    moved.mkdir(parents=True)
    (moved / "shard-000001.tar.partial").write_bytes(b"x")
    assert remove_partials(tmp_path) == 1
    assert not (tmp_path / "shards" / "shard-000000.tar.partial").exists()
    assert (moved / "shard-000001.tar.partial").exists()  # the removal thread's, not this walk's


def test_a_killed_runs_leftovers_are_deleted_by_the_next_run(tmp_path):
    folder = tmp_path / REPLACED_DIR
    (folder / "4321-0-shard-000000.tar").parent.mkdir(parents=True)
    (folder / "4321-0-shard-000000.tar").write_bytes(b"left by a killed run")
    (folder / "4321-1-sub").mkdir()
    (folder / "4321-1-sub" / "x").write_bytes(b"y")
    with BackgroundRemoval(folder):
        pass
    assert not folder.exists()


def test_a_file_on_another_file_system_stays_for_its_replacement(tmp_path):
    """A rename can not cross file systems: the file stays where it is (its replacement deletes it then)."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        shard = Path(other) / "shard-000000.tar"
        shard.write_bytes(b"x")
        with BackgroundRemoval(tmp_path / REPLACED_DIR) as removal:
            assert removal.move(shard) is False
        assert shard.read_bytes() == b"x"


def test_a_repack_moves_the_shards_it_replaces_before_their_units_run(
    tmp_path, demo_tokenizer, corpus, monkeypatch  # noqa: F811 - the fixture
):
    out = tmp_path / "ds"
    _prepare(out, demo_tokenizer, corpus, seq_length=4096)
    before = {p.name: p.stat().st_ino for p in (out / "shards").glob("*")}
    assert any(name.endswith(".tar") for name in before)
    at_start: list[tuple[str, bool, bool]] = []  # each unit: its shard, whether its tar / index are still there
    real = write_stage._write_rows

    def watching(spec, view, number, local_root, *rest):
        tar = out / view.record.shards[number].path
        at_start.append((tar.name, tar.exists(), tar.with_name(f"{tar.name}.idx").exists()))
        return real(spec, view, number, local_root, *rest)

    monkeypatch.setattr(write_stage, "_write_rows", watching)
    _prepare(out, demo_tokenizer, corpus, seq_length=2048, cp=2, from_stage="pack")
    assert {name for name, _, _ in at_start} & set(before)  # units that replace a shard of the first plan
    assert [(name, tar, idx) for name, tar, idx in at_start if tar or idx] == []
    assert not (out / "stages" / REPLACED_DIR).exists()  # all deleted by the end of the run
    repacked = {p.name: p.stat().st_ino for p in (out / "shards").glob("*")}
    at_start.clear()
    # the same repack again: every unit is kept, and so are its files (not moved, not rewritten)
    _prepare(out, demo_tokenizer, corpus, seq_length=2048, cp=2, from_stage="pack")
    assert at_start == []
    assert {p.name: p.stat().st_ino for p in (out / "shards").glob("*")} == repacked


def test_shards_of_an_earlier_plan_beyond_the_new_ones_go_the_same_way(
    tmp_path, demo_tokenizer, corpus, monkeypatch  # noqa: F811 - the fixture
):
    out = tmp_path / "ds"
    _prepare(out, demo_tokenizer, corpus, seq_length=4096, shard_max_rows=1)
    before = sorted(p.name for p in (out / "shards").glob("*.tar"))
    assert len(before) > 1
    moved: list[str] = []
    real_move = BackgroundRemoval.move

    def recording(self: BackgroundRemoval, path: Path) -> bool:
        done = real_move(self, path)
        if done:
            moved.append(path.name)
        return done

    monkeypatch.setattr(BackgroundRemoval, "move", recording)
    _prepare(out, demo_tokenizer, corpus, seq_length=4096, from_stage="pack")  # a shard of any size: fewer
    after = sorted(p.name for p in (out / "shards").glob("*.tar"))
    assert len(after) < len(before)
    # the replaced shards before their units ran, the strays at finalize: every earlier file, none twice
    assert sorted(moved) == sorted(name + ext for name in before for ext in ("", ".idx"))
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(name + ext for name in after for ext in ("", ".idx"))
    assert not (out / "stages" / REPLACED_DIR).exists()


def test_an_overwrite_starts_while_the_earlier_run_is_deleted(
    tmp_path, demo_tokenizer, corpus, monkeypatch  # noqa: F811 - the fixture
):
    """``--overwrite`` of a finished dataset moves its shards and records aside and goes on at once: the new
    run splits its input while the earlier one's files are still being deleted, and leaves none of them."""
    import omnipack.pipeline as pipeline
    from tests.test_sample_store import dataset_bytes

    fresh = tmp_path / "fresh"
    _prepare(fresh, demo_tokenizer, corpus, seq_length=2048, sample_store="off")
    out = tmp_path / "ds"
    _prepare(out, demo_tokenizer, corpus, seq_length=4096)
    earlier = {p.name for p in (out / "stages").iterdir()}
    assert {"measure", "write"} <= earlier
    gate = threading.Event()  # holds the deletion of the moved folders until the new run has begun
    real_rmtree = shutil.rmtree

    def held_rmtree(path, *args, **kwargs):
        if REPLACED_DIR in Path(path).parts:
            gate.wait(120)  # a generous wait: on a loaded machine the run may take long to get going
        return real_rmtree(path, *args, **kwargs)

    pending: list[set[str]] = []  # what waited for deletion when the new run began
    real_build_spec = pipeline.build_spec

    def watching(cfg, executor=None):
        replaced = out / "stages" / REPLACED_DIR
        pending.append({p.name.split("-", 2)[2] for p in replaced.iterdir()} if replaced.is_dir() else set())
        gate.set()
        return real_build_spec(cfg, executor)

    monkeypatch.setattr(shutil, "rmtree", held_rmtree)
    monkeypatch.setattr(pipeline, "build_spec", watching)
    _prepare(out, demo_tokenizer, corpus, seq_length=2048, sample_store="off", overwrite=True)
    assert len(pending) == 1 and {"shards", "measure", "write"} <= pending[0]
    assert pending[0] <= earlier | {"shards"}
    assert not (out / "stages" / REPLACED_DIR).exists()
    want, got = dataset_bytes(fresh), dataset_bytes(out)
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


def test_verify_passes_a_dataset_whose_replaced_shards_are_still_being_deleted(
    tmp_path, demo_tokenizer, corpus  # noqa: F811 - the fixture
):
    """What ``stages/replaced`` holds (a killed run's leftovers, or shards a run deletes as verify reads) is
    no part of the dataset: not a stray tar to verify."""
    out = tmp_path / "ds"
    _prepare(out, demo_tokenizer, corpus, seq_length=4096)
    moved = out / "stages" / REPLACED_DIR / "1-0-shards"
    shutil.copytree(out / "shards", moved)
    assert list(moved.glob("*.tar"))
    failed = {r.name: r.failures for r in run_verify(out, progress=False) if r.status == "fail"}
    assert not failed, failed
    # the same tars anywhere else under the root are strays: the search still finds them
    shutil.copytree(moved, out / "old")
    failed = [f for r in run_verify(out, progress=False) for f in r.failures]
    assert any("tar files not named by any metadata" in f and "old/" in f for f in failed), failed
