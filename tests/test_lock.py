"""One writer per output: a live run's lock refuses a second run (and --overwrite), stale locks are taken
over, and the pieces of a staged run share the folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from omnipack.cli import main
from omnipack.pipeline import run_prepare
from omnipack.stages.lock import LOCK_DIR, OutputLock, OutputLocked, _start_time
from tests.stage_outputs import cli_args, dataset_bytes, demo_config

HOLDER = """
import sys, time
from pathlib import Path
from omnipack.stages.lock import OutputLock
with OutputLock(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding the lock of ``tmp_path / 'ds'`` (a real second writer)."""
    out = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        yield out, proc
    finally:
        proc.kill()
        proc.wait()


def test_a_second_run_is_refused_with_the_holder_named(holder, demo_tokenizer, demo_corpus, capsys):
    out, proc = holder
    cfg = demo_config(out, demo_tokenizer, demo_corpus)
    assert main(cli_args(cfg)) == 2
    err = capsys.readouterr().err
    assert f"pid {proc.pid} on {socket.gethostname()}" in err and "being written by another run" in err
    assert not (out / "stages").exists()  # nothing written
    assert main([*cli_args(cfg), "--stage", "measure"]) == 2  # nor a piece of a staged run


def test_overwrite_never_deletes_a_dataset_a_live_run_holds(tmp_path, demo_tokenizer, demo_corpus):
    out = tmp_path / "ds"
    cfg = demo_config(out, demo_tokenizer, demo_corpus)
    run_prepare(cfg)
    before = dataset_bytes(out)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLocked):
            run_prepare(demo_config(out, demo_tokenizer, demo_corpus, overwrite=True))
        assert dataset_bytes(out) == before
    finally:
        proc.kill()
        proc.wait()
    # its holder was killed (-9: no cleanup): the lock is stale now and the overwrite goes ahead
    assert (out / LOCK_DIR / "run.lock").exists()
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus, overwrite=True, seed=1))
    assert dataset_bytes(out) != before and not (out / LOCK_DIR).exists()


def _write_lock(folder, name, **holder):
    (folder / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    (folder / LOCK_DIR / f"{name}.lock").write_text(json.dumps(holder))


def test_stale_locks_are_taken_over_and_other_hosts_respected(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    _write_lock(tmp_path, "run", pid=dead.pid, hostname=host, start_time="1", since=time.time())
    with OutputLock(tmp_path):  # its process is gone
        pass
    # a live pid that is not the process that took the lock (pid reused): stale too
    _write_lock(tmp_path, "run", pid=os.getppid(), hostname=host, start_time="-1", since=time.time())
    with OutputLock(tmp_path):
        pass
    # the same pid and start time: live
    me = os.getppid()
    _write_lock(tmp_path, "run", pid=me, hostname=host, start_time=_start_time(me), since=time.time())
    with pytest.raises(OutputLocked, match=f"pid {me}"):
        OutputLock(tmp_path).acquire()
    # another machine's lock can not be checked: never taken over
    _write_lock(tmp_path, "run", pid=dead.pid, hostname=host + "-elsewhere", since=time.time())
    with pytest.raises(OutputLocked, match="-elsewhere"):
        OutputLock(tmp_path).acquire()


def test_staged_pieces_share_the_folder_but_exclude_a_whole_run(tmp_path):
    with OutputLock(tmp_path, "measure-0-of-2"), OutputLock(tmp_path, "measure-1-of-2"):
        with pytest.raises(OutputLocked, match="'measure-0-of-2'"):
            OutputLock(tmp_path).acquire()
        with pytest.raises(OutputLocked, match="'measure-1-of-2'"):
            OutputLock(tmp_path, "measure-1-of-2").acquire()
    with OutputLock(tmp_path), pytest.raises(OutputLocked, match="'run'"):
        OutputLock(tmp_path, "pack").acquire()
    assert not (tmp_path / LOCK_DIR).exists()
