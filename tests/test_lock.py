"""One writer per output: a live run's lease refuses a second run (and --overwrite), stale leases (a dead
process here, an expired lease of another host) are taken over with their holder named, SIGTERM releases a
lease, and the pieces of a staged run of one world size share the folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from omnipack.cli import main
from omnipack.pipeline import run_prepare
from omnipack.stages.lock import (
    DEFAULT_EXPIRY_S,
    EXPIRY_ENV,
    HOST_ENV,
    LOCK_DIR,
    OutputLock,
    OutputLocked,
    _start_time,
)
from tests.stage_outputs import cli_args, dataset_bytes, demo_config, prepare_in_subprocess

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
    # another machine's process can not be checked: its lease is live until it expires
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


def _age_lease(folder, name, seconds):
    """Move a lease's last renewal back by ``seconds``: what that much time passing does to it."""
    path = folder / LOCK_DIR / f"{name}.lock"
    lease = json.loads(path.read_text())
    lease["renewed"] -= seconds
    path.write_text(json.dumps(lease))
    return lease


def test_a_rank_lost_on_another_host_is_taken_over_once_its_lease_expires(
    tmp_path, demo_tokenizer, demo_corpus, capsys
):
    """The README's promise: rerun the same command after a lost node. Rank 0 of a staged measure dies
    (SIGKILL) on "nodeB"; the same command on this host is refused while nodeB's lease could still be
    renewed, and takes it over, naming its holder, once it expired; the run then ends as a whole run."""
    out = tmp_path / "ds"
    cfg = demo_config(out, demo_tokenizer, demo_corpus)
    rank0 = ("--stage", "measure", "--rank", "0", "--world-size", "2")
    res = prepare_in_subprocess(cfg, "measure:0", args=rank0, env={HOST_ENV: "nodeB"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    lease = json.loads((out / LOCK_DIR / "measure-0-of-2.lock").read_text())
    assert lease["hostname"] == "nodeB" and lease["expires_after_s"] == DEFAULT_EXPIRY_S
    assert main([*cli_args(cfg), *rank0]) == 2  # nodeB may be alive, just slow: not yet
    assert f"pid {lease['pid']} on nodeB" in capsys.readouterr().err
    # another rank (same world size) runs beside it meanwhile
    assert main([*cli_args(cfg), "--stage", "measure", "--rank", "1", "--world-size", "2"]) == 0
    _age_lease(out, "measure-0-of-2", DEFAULT_EXPIRY_S + 1)
    assert main([*cli_args(cfg), *rank0]) == 0
    err = capsys.readouterr().err
    assert f"taking over 'measure-0-of-2' held by pid {lease['pid']} on nodeB" in err and "expired" in err
    for stage in ("pack", "write", "finalize"):
        assert main([*cli_args(cfg), "--stage", stage]) == 0
    assert not (out / LOCK_DIR).exists()
    whole = tmp_path / "whole"
    run_prepare(demo_config(whole, demo_tokenizer, demo_corpus))
    assert dataset_bytes(out) == dataset_bytes(whole)


def test_a_lease_is_renewed_while_its_holder_runs(tmp_path, monkeypatch, capsys):
    """Judged from another host (only the lease's renewals can be seen), a running holder's lease stays live
    past its expiry; once the holder is killed it expires and is taken over."""
    out = tmp_path / "ds"
    env = {**os.environ, EXPIRY_ENV: "1"}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "locked"
        monkeypatch.setenv(HOST_ENV, "another-host")
        time.sleep(2.5)  # more than twice the expiry
        with pytest.raises(OutputLocked, match=f"pid {proc.pid} on {socket.gethostname()}"):
            OutputLock(out).acquire()
    finally:
        proc.kill()
        proc.wait()
    time.sleep(1.5)
    with OutputLock(out):
        pass
    assert f"taking over 'run' held by pid {proc.pid}" in capsys.readouterr().err


def test_sigterm_releases_the_lease(tmp_path):
    """A scheduler's preemption (SIGTERM) ends the holder through its normal exit: no lease left behind."""
    out = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        assert (out / LOCK_DIR / "run.lock").exists()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert not (out / LOCK_DIR).exists()


def test_a_stale_local_lease_is_taken_over_with_a_message(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(tmp_path, "run", pid=dead.pid, hostname=socket.gethostname(), start_time="1", since=time.time())
    with OutputLock(tmp_path):
        pass
    err = capsys.readouterr().err
    assert f"taking over 'run' held by pid {dead.pid}" in err and "its process is gone" in err


def test_ranks_of_another_world_size_are_refused(tmp_path):
    """Ranks 0-of-2 and 1-of-3 would measure some parts twice: refused while the other's lease lives."""
    with OutputLock(tmp_path, "measure-0-of-2"):
        with pytest.raises(OutputLocked, match="'measure-0-of-2'"):
            OutputLock(tmp_path, "measure-1-of-3").acquire()
        with OutputLock(tmp_path, "measure-1-of-2"), OutputLock(tmp_path, "write-0-of-3"):
            pass  # the same world size, or another stage
    with OutputLock(tmp_path, "measure-1-of-3"):  # one after the other: the records say what is done
        pass
