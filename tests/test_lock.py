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
import uuid
from pathlib import Path

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
from tests.prepare_child import run_omnipack
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
    tmp_path, demo_tokenizer, demo_corpus, demo_reference, capsys
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
    assert dataset_bytes(out) == dataset_bytes(demo_reference)  # a whole run's bytes


def test_a_lease_is_renewed_while_its_holder_runs(tmp_path, monkeypatch, capsys):
    """Judged from another host (only the lease's renewals can be seen), a running holder's lease stays live
    past its expiry; once the holder is killed it expires and is taken over."""
    out = tmp_path / "ds"
    env = {**os.environ, EXPIRY_ENV: "2"}  # renewed every 0.5 s: three may come late on a loaded machine
    cmd = [sys.executable, "-c", HOLDER, str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "locked"
        monkeypatch.setenv(HOST_ENV, "another-host")
        time.sleep(3.0)  # more than the expiry: only the renewals keep it
        with pytest.raises(OutputLocked, match=f"pid {proc.pid} on {socket.gethostname()}"):
            OutputLock(out).acquire()
    finally:
        proc.kill()
        proc.wait()
    time.sleep(2.5)  # past the expiry of its last renewal
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
    host = socket.gethostname()
    _write_lock(tmp_path, "run", pid=dead.pid, hostname=host, start_time="1", since=time.time())
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


def _processes_with(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``marker``: a run and every worker it spawned."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            ours = proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes()
            if ours and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:
            continue  # gone meanwhile, or not ours
    return found


@pytest.mark.parametrize("whole_group", [False, True], ids=["kill", "scancel"])
def test_sigterm_mid_run_releases_the_lease_and_the_rerun_completes(
    tmp_path, demo_tokenizer, demo_corpus, whole_group
):
    """Preemption: SIGTERM to the run (``kill``), or to its whole process group with the pool workers
    (``scancel``): the run stops, its lease is released and no worker is left; the same command resumes."""
    out = tmp_path / "ds"
    cfg = demo_config(out, demo_tokenizer, demo_corpus, workers=2, shard_max_rows=1, part_lines=8)
    marker = f"omnipack-test-{uuid.uuid4()}"
    env = {**os.environ, "OMNIPACK_TEST_MARK": marker}
    cmd = [sys.executable, "-m", "omnipack", *cli_args(cfg)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    first_shard = out / "stages" / "write" / "shard-000000.json"
    deadline = time.monotonic() + 300
    while not first_shard.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be stopped"
    if whole_group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if not whole_group:  # its workers were not signalled: the run stops them and says how to go on
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "terminated (SIGTERM); rerun the same command to resume" in err and "Traceback" not in err
    assert proc.returncode != 0 and not (out / LOCK_DIR).exists(), err
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(marker)
    res = run_omnipack(cli_args(cfg), dict(os.environ), timeout=600)  # the same command, in a warm child
    assert res.returncode == 0 and "taking over" not in res.stderr, res.stderr


def test_a_lease_of_another_machine_with_this_hostname_is_judged_by_its_expiry(tmp_path):
    """Clusters where every node has the same hostname (or a host rebooted): the holder's pid means nothing
    here, so a dead local pid does not free the lease; its expiry does."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    if not boot.exists():
        pytest.skip("no boot id on this system")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = {"pid": dead.pid, "hostname": socket.gethostname(), "boot_id": "another-machine",
             "since": time.time(), "renewed": time.time(), "expires_after_s": 120}  # fmt: skip
    _write_lock(tmp_path, "run", **lease)
    with pytest.raises(OutputLocked, match=f"pid {dead.pid}"):
        OutputLock(tmp_path).acquire()
    _write_lock(tmp_path, "run", **{**lease, "renewed": time.time() - 121})
    with OutputLock(tmp_path):
        pass
