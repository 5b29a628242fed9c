"""One writer per output folder, held by leases that expire.

A run holds a lease file under ``OUTPUT/.omnipack-lock/`` for as long as it writes there. A whole run's
lease (``run``) excludes every other writer; the pieces of a staged run (``measure-R-of-N``, ``pack``, ...)
exclude a whole run, the same piece, and the ranks of a stage started with another world size (they would
measure or write the same units twice), so a scheduler's ranks of one world size write side by side.

A lease records its holder (host, pid, process start time) and when it was last renewed: a thread of the
holder renews it every ``expiry / 4`` seconds. A lease is live while its holder can be seen running (same
host: the pid exists and is the same process) or, for a holder on another host, which can not be checked,
while it was renewed within its expiry (``OMNIPACK_LEASE_S``, 120 s by default; the holders' clocks must
agree to well within it, as NTP keeps them). A lost node's or a preempted job's lease thus expires, and the
next run takes it over, saying whose it was. SIGTERM (a scheduler's preemption, ``scancel``) and SIGINT
end the run through its normal exit path, which releases the lease.

The host is ``socket.gethostname()`` (or ``OMNIPACK_HOST_ID``, where hostnames do not tell hosts or pid
namespaces apart, e.g. containers sharing one hostname) and, on Linux, its boot id: a lease of a machine that
merely shares the hostname, or of this one before a reboot, is judged by its expiry, never by a local pid.

On an object store (``s3://...``) there is no atomic mkdir or ``O_EXCL``: a lease is an object created only
if absent (a conditional PUT, ``If-None-Match: *``), which S3 itself, MinIO and moto decide atomically, so
two runs can not both create it; renewing it is a plain PUT. Taking over an expired lease (delete, then
create-if-absent) is not atomic with the expiry check; two runs doing so at once are still caught by the
recheck after taking ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .storage import (
    create_exclusive,
    make_dirs,
    output_path,
    pid_alive,
    remove_dir_if_empty,
    write_bytes_atomic,
)

LOCK_DIR = ".omnipack-lock"
WHOLE_RUN = "run"
HOST_ENV = "OMNIPACK_HOST_ID"  # this host's name in leases (default: the hostname)
EXPIRY_ENV = "OMNIPACK_LEASE_S"  # seconds a lease lives without renewal (default: DEFAULT_EXPIRY_S)
DEFAULT_EXPIRY_S = 120.0


class OutputLocked(RuntimeError):
    """Another live run writes to this output folder."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: stop as on Ctrl-C (workers stopped, the lease released): every finished unit is recorded."""


def host_id() -> str:
    return os.environ.get(HOST_ENV) or socket.gethostname()


def lease_expiry_s() -> float:
    return float(os.environ.get(EXPIRY_ENV) or DEFAULT_EXPIRY_S)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from its owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _boot_id() -> str | None:
    """This boot of this machine (Linux): tells apart machines that share a hostname, and a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _here(holder: dict[str, Any]) -> bool:
    """Whether a lease's holder ran on this machine since its last boot (so its pid can be checked)."""
    return holder.get("hostname") == host_id() and holder.get("boot_id") in (None, _boot_id())


def _owner() -> dict[str, Any]:
    pid = os.getpid()
    now = time.time()
    return {
        "pid": pid,
        "hostname": host_id(),
        "boot_id": _boot_id(),
        "start_time": _start_time(pid),
        "since": now,
        "renewed": now,
        "expires_after_s": lease_expiry_s(),
    }


def _expired(holder: dict[str, Any], now: float | None = None) -> bool:
    renewed = float(holder.get("renewed", holder.get("since", 0)))
    return (now or time.time()) - renewed > float(holder.get("expires_after_s", DEFAULT_EXPIRY_S))


def _is_live(holder: dict[str, Any]) -> bool:
    if not _here(holder):
        # another machine's process (or one from before a reboot) can not be checked: its lease lives while
        # it renews it
        return not _expired(holder)
    pid = int(holder.get("pid", -1))
    if pid <= 0 or not pid_alive(pid):
        return False
    started = _start_time(pid)
    return started is None or holder.get("start_time") in (None, started)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _describe(name: str, holder: dict[str, Any]) -> str:
    renewed = float(holder.get("renewed", holder.get("since", 0)))
    return (
        f"'{name}' held by pid {holder.get('pid')} on {holder.get('hostname')} since "
        f"{_when(holder.get('since', 0))}, renewed {time.time() - renewed:.0f} s ago"
    )


def _why_stale(holder: dict[str, Any]) -> str:
    if not _here(holder):
        return f"its lease expired ({holder.get('expires_after_s', DEFAULT_EXPIRY_S):g} s without renewal)"
    return "its process is gone"


def _take_over(name: str, holder: dict[str, Any], folder: Any) -> None:
    print(
        f"omnipack: taking over {_describe(name, holder)} in {folder}: {_why_stale(holder)}",
        file=sys.stderr,
    )


def _world_size(name: str) -> tuple[str, str] | None:
    """(stage, world size) of a staged rank's lease name ``STAGE-R-of-N``."""
    stage, _, rest = name.partition("-")
    _, of, n = rest.partition("-of-")
    return (stage, n) if of else None


def _excludes(ours: str, other: str) -> bool:
    if WHOLE_RUN in (ours, other):
        return True
    a, b = _world_size(ours), _world_size(other)
    return a is not None and b is not None and a[0] == b[0] and a[1] != b[1]


class _Heartbeat(threading.Thread):
    """Renews a lease file while its holder runs; stops when told (or when the lease was taken from us)."""

    def __init__(self, path: Any, holder: dict[str, Any]) -> None:
        super().__init__(name=f"omnipack-lease-{path.name}", daemon=True)
        self.path, self.holder = path, holder
        self.stopped = threading.Event()

    def run(self) -> None:
        interval = float(self.holder["expires_after_s"]) / 4
        while not self.stopped.wait(interval):
            try:
                current = json.loads(self.path.read_text())
            except Exception:  # noqa: BLE001 - a slow or failing store: try again at the next beat, within the expiry
                continue
            if (current.get("pid"), current.get("hostname")) != (self.holder["pid"], self.holder["hostname"]):
                print(f"omnipack: warning: another run took over the lease {self.path}", file=sys.stderr)
                return
            self.holder["renewed"] = time.time()
            try:
                write_bytes_atomic(self.path, json.dumps(self.holder).encode())
            except Exception as e:  # noqa: BLE001 - any store error: the thread goes on renewing
                print(f"omnipack: warning: could not renew the lease {self.path}: {e}", file=sys.stderr)

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join()


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


class OutputLock:
    """``with OutputLock(folder, name):`` holds the folder for one writer (see the module docstring)."""

    def __init__(self, folder: Path | str, name: str = WHOLE_RUN) -> None:
        self.dir = (output_path(folder) if isinstance(folder, str) else folder) / LOCK_DIR
        self.name = name
        self.path = self.dir / f"{name}.lock"
        self._heartbeat: _Heartbeat | None = None
        self._sigterm: Any = None

    def _conflicts(self) -> list[str]:
        """Live leases other than ours that exclude us; stale ones are taken away on the way."""
        found = []
        for path in sorted(self.dir.glob("*.lock")):
            other = path.name[: -len(".lock")]
            if path == self.path or not _excludes(self.name, other):
                continue
            try:
                holder = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # being written or removed right now; the recheck after taking ours settles it
            if _is_live(holder):
                found.append(_describe(other, holder))
            else:
                _take_over(other, holder, self.dir.parent)
                path.unlink(missing_ok=True)
        return found

    def _refuse(self, held: list[str]) -> OutputLocked:
        return OutputLocked(
            f"output {self.dir.parent} is being written by another run ({'; '.join(held)}). Wait for it to "
            f"finish: a lease of a process that is gone is taken over once its process is seen gone (this "
            f"host) or it has not been renewed for its expiry (another host)"
        )

    def acquire(self) -> None:
        make_dirs(self.dir)
        if held := self._conflicts():
            raise self._refuse(held)
        for _ in range(2):
            mine = _owner()
            if create_exclusive(self.path, json.dumps(mine).encode()):
                break
            try:
                holder = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                holder = {}
            if holder and _is_live(holder):
                raise self._refuse([_describe(self.name, holder)]) from None
            if holder:
                _take_over(self.name, holder, self.dir.parent)
            self.path.unlink(missing_ok=True)
        else:
            raise self._refuse([f"'{self.name}' (taken while this run started)"])
        if held := self._conflicts():  # both took their lease at once: both back off, neither writes
            self.path.unlink(missing_ok=True)
            raise self._refuse(held)
        self._heartbeat = _Heartbeat(self.path, mine)
        self._heartbeat.start()
        if threading.current_thread() is threading.main_thread():
            # SIGTERM's default ends the process on the spot, leaving the lease; as an exception it unwinds
            previous = signal.signal(signal.SIGTERM, _raise_terminated)
            self._sigterm = signal.SIG_DFL if previous is None else previous

    def release(self) -> None:
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        try:
            holder = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            holder = None
        if holder is None or (holder.get("pid"), holder.get("hostname")) == (os.getpid(), host_id()):
            self.path.unlink(missing_ok=True)  # not one another run took over after ours expired
        remove_dir_if_empty(self.dir)  # other pieces may still hold theirs

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def renewed(path: Any, holder: dict[str, Any]) -> Iterator[None]:
    """Renew the lease-like claim ``path`` (created holding ``holder``) while the block runs."""
    beat = _Heartbeat(path, holder)
    beat.start()
    try:
        yield
    finally:
        beat.stop()


# for other create-if-absent claims (the input split of a staged run): who holds one, and is it alive
owner = _owner
holder_live = _is_live
