"""One writer per output folder.

A run holds a lock file under ``OUTPUT/.omnipack-lock/`` for as long as it writes there. A whole run's lock
(``run``) excludes every other writer; the pieces of a staged run (``measure-R-of-N``, ``pack``, ...) exclude
a whole run and the same piece, so a scheduler's ranks can write side by side. A lock records its owner's
pid, hostname and process start time: a lock whose process is gone (or whose pid was reused by another
process) is stale and is taken over; a lock held on another host is respected, since it can not be checked.

On an object store (``s3://...``) there is no atomic mkdir or ``O_EXCL``: a lock is an object created only
if absent (a conditional PUT, ``If-None-Match: *``), which S3 itself, MinIO and moto decide atomically, so
two runs can not both create it. Taking over a stale lock (delete, then create-if-absent) is not atomic
with the staleness check; two runs doing so at once are still caught by the recheck after taking ours.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from .storage import create_exclusive, make_dirs, output_path, pid_alive, remove_dir_if_empty

LOCK_DIR = ".omnipack-lock"
WHOLE_RUN = "run"


class OutputLocked(RuntimeError):
    """Another live run writes to this output folder."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from its owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "pid": pid,
        "hostname": socket.gethostname(),
        "start_time": _start_time(pid),
        "since": time.time(),
    }


def _is_live(holder: dict[str, Any]) -> bool:
    if holder.get("hostname") != socket.gethostname():
        return True  # another machine's process: can not be checked, so never taken over
    pid = int(holder.get("pid", -1))
    if pid <= 0 or not pid_alive(pid):
        return False
    started = _start_time(pid)
    return started is None or holder.get("start_time") in (None, started)


def _describe(name: str, holder: dict[str, Any]) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
    return f"'{name}' held by pid {holder.get('pid')} on {holder.get('hostname')} since {since}"


class OutputLock:
    """``with OutputLock(folder, name):`` holds the folder for one writer (see the module docstring)."""

    def __init__(self, folder: Path | str, name: str = WHOLE_RUN) -> None:
        self.dir = (output_path(folder) if isinstance(folder, str) else folder) / LOCK_DIR
        self.name = name
        self.path = self.dir / f"{name}.lock"

    def _conflicts(self) -> list[str]:
        """Live locks other than ours that exclude us; stale ones are removed on the way."""
        found = []
        for path in sorted(self.dir.glob("*.lock")):
            other = path.name[: -len(".lock")]
            if path == self.path or not (self.name == WHOLE_RUN or other == WHOLE_RUN):
                continue
            try:
                holder = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # being written or removed right now; the recheck after taking ours settles it
            if _is_live(holder):
                found.append(_describe(other, holder))
            else:
                path.unlink(missing_ok=True)
        return found

    def _refuse(self, held: list[str]) -> OutputLocked:
        return OutputLocked(
            f"output {self.dir.parent} is being written by another run ({'; '.join(held)}). Wait for it to "
            f"finish; if that process is gone on a host this one can not check, remove {self.dir}"
        )

    def acquire(self) -> None:
        make_dirs(self.dir)
        if held := self._conflicts():
            raise self._refuse(held)
        for _ in range(2):
            if create_exclusive(self.path, json.dumps(_owner()).encode()):
                break
            try:
                holder = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError):
                holder = {}
            if holder and _is_live(holder):
                raise self._refuse([_describe(self.name, holder)]) from None
            self.path.unlink(missing_ok=True)  # stale: its process died without cleaning up
        else:
            raise self._refuse([f"'{self.name}' (taken while this run started)"])
        if held := self._conflicts():  # both took their lock at once: both back off, neither writes
            self.release()
            raise self._refuse(held)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        remove_dir_if_empty(self.dir)  # other pieces may still hold theirs

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# for other create-if-absent claims (the input split of a staged run): who holds one, and is it alive
owner = _owner
holder_live = _is_live
