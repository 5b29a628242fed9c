"""Where a run's outputs live: a local folder, or an object store URL (``s3://bucket/prefix``, ``gs://...``).

Stages name their outputs as paths under ``output_path(output)``: a ``pathlib.Path`` for a folder, a
``UPath`` (universal-pathlib over fsspec, the ``remote`` extra) for a URL, with the same API (``/``,
``exists``, ``read_text``, ``glob``, ``stat``, ``open``). What differs is how a file appears whole: in a
folder it is written under a temporary name and renamed; on an object store one PUT is atomic (an object
appears whole or not at all, and there is no rename), so a file is built in a local staging file and
uploaded in one put (``publish``). Readers take only the bytes they need (``read_range``, ranged reads of
Parquet footers and row groups): a write unit reads its shard's samples, not whole measured parts. The
store's client resolves credentials and endpoints from its standard environment and config files
(``AWS_*`` variables, ``~/.aws``), never from the manifest or the settings.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import os
import queue
import shutil
import sys
import tempfile
import threading
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from ..media.sources import is_remote, local_location

STAGES_DIR = "stages"  # the run's scratch folder under the output (records, parts, the shipped model)

AnyPath = Any  # pathlib.Path or upath.UPath: the same pathlib API


def output_path(location: str | os.PathLike) -> AnyPath:
    """The output root as a path object: ``Path`` for a folder, ``UPath`` for an object store URL."""
    text = str(location)
    if not is_remote(text):
        return Path(local_location(text))
    try:
        from upath import UPath
    except ImportError as e:  # pragma: no cover - depends on the optional extra
        raise ImportError(f"output {text} needs omnipack's remote extra: pip install '.[remote]' in the omnipack repository") from e
    return UPath(text.rstrip("/"))


def is_local(path: AnyPath) -> bool:
    return isinstance(path, Path)


_STAGING_PREFIX = "omnipack-staging-"


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def staging_dir() -> Path:
    """This process's local folder for files on their way to and from an object store, and for files its
    worker processes read (the local executor's spec); removed at exit, and the folders of processes that
    were killed are removed by the next process that makes one."""
    folder = Path(tempfile.gettempdir()) / f"{_STAGING_PREFIX}{os.getpid()}"
    if not folder.is_dir():
        for stale in Path(tempfile.gettempdir()).glob(f"{_STAGING_PREFIX}*"):
            pid = stale.name[len(_STAGING_PREFIX) :]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def staging_file(dest: AnyPath) -> Path:
    """A local path to build ``dest`` in before ``publish``: beside it in a folder (so the rename is
    atomic), in a local staging folder for an object store."""
    if is_local(dest):
        return dest.with_name(f"{dest.name}.{os.getpid()}{PARTIAL_SUFFIX}")
    return staging_dir() / f"{xxhash.xxh3_64_hexdigest(str(dest).encode())}-{dest.name}"


PARTIAL_SUFFIX = ".partial"  # a file being built: renamed into place when whole (see ``staging_file``)
REPLACED_DIR = "replaced"  # under stages/: outputs a rerun replaces, removed in the background


def remove_partials(root: AnyPath, pattern: str = "**/*") -> int:
    """Remove the half-built files (``PATTERN.partial``) killed processes left under a local folder; only
    where no other process builds them (under a whole run's lock; a unit's own files). Object stores have
    none: files are built locally. ``**/`` walks every folder below but ``REPLACED_DIR``s, whose files a
    thread may be deleting meanwhile (``BackgroundRemoval``)."""
    if not is_local(root) or not root.is_dir():
        return 0
    if pattern.startswith("**/"):
        found = local_files(root, f"{pattern[3:]}{PARTIAL_SUFFIX}", lambda folder: folder.name == REPLACED_DIR)
    else:
        found = list(root.glob(f"{pattern}{PARTIAL_SUFFIX}"))
    removed = 0
    for path in found:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def local_files(root: Path, name: str, leave_out: Callable[[Path], bool]) -> list[Path]:
    """The files under the local folder ``root`` whose names match ``name`` (``fnmatch``), at any depth, but
    in the folders ``leave_out`` (given each folder's path relative to ``root``) names; a folder deleted
    while it is walked (``BackgroundRemoval``'s) is skipped, not an error."""
    found = []
    for folder, subfolders, files in os.walk(root):
        here = Path(folder).relative_to(root)
        subfolders[:] = [d for d in subfolders if not leave_out(here / d)]
        found += [Path(folder, f) for f in fnmatch.filter(files, name)]
    return found


class BackgroundRemoval:
    """Files a run replaces, moved out of its way (a rename) and deleted on a thread of their own.

    Deleting a large file written seconds ago waits for the disk: the kernel frees pages still under
    writeback only once they are written (a repack replacing 1 GB of shards written a second earlier waited
    0.7 s in ``os.replace``, ~5x the CPU the freeing costs). Moved into ``folder`` (under the output: the same
    file system, so a rename), they are deleted while the run writes their replacements; ``close`` waits for
    the last. What a killed run left in ``folder``, the next run deletes the same way."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.failures: list[str] = []  # files the thread could not delete, with the reason
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._moved = 0
        self._token = uuid.uuid4().hex

    def __enter__(self) -> BackgroundRemoval:
        if self.folder.is_dir():  # a killed run's leftovers
            for path in sorted(self.folder.iterdir()):
                self._remove(path)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # a failing or interrupted run (SIGTERM: a preemption's grace period) does not wait for terabytes of
        # deletion with its lease held: the daemon thread stops with the process, the next run goes on
        self.close(wait=exc_type is None)

    def move(self, path: Path) -> bool:
        """Move ``path`` out of the way and delete it in the background; False when there is no such file, it
        is a symbolic link (the folder it points to stays, as a replacement keeps it) or it cannot be moved
        (another file system: its replacement then deletes it as before)."""
        if path.is_symlink() or not path.exists():
            return False
        # unique across the processes and hosts that share the output (staged ranks; equal pids in containers)
        dest = self.folder / f"{self._token}-{self._moved}-{path.name}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            os.rename(path, dest)
        except OSError:
            return False
        self._moved += 1
        self._remove(dest)
        return True

    def _remove(self, path: Path) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="omnipack-removal", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def _drain(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                if path.is_dir() and not path.is_symlink():
                    _remove_folder(path)
                else:
                    path.unlink()
            except FileNotFoundError:  # another run's removal of its leftovers took it
                pass
            except OSError as e:
                self.failures.append(f"{path}: {e}")

    def close(self, wait: bool = True) -> None:
        """Wait until every moved file is deleted (with ``wait=False``, leave the rest to the thread while the
        process lives, then to the next run)."""
        if self._thread is not None:
            self._queue.put(None)
            if not wait:
                self._thread = None
                return
            self._thread.join()
            self._thread = None
        if self.failures:
            warnings.warn(
                f"omnipack: {len(self.failures)} replaced file(s) under {self.folder} could not be deleted "
                f"(the next run tries again): {self.failures[0]}",
                stacklevel=2,
            )
            self.failures = []
        with contextlib.suppress(OSError):
            self.folder.rmdir()  # empty: nothing left to delete


def _remove_folder(path: Path) -> None:
    """``shutil.rmtree``, going on past entries that another process deletes at the same time."""

    def gone_already(function: Any, name: str, error: Any) -> None:
        failure = error if isinstance(error, BaseException) else error[1]
        if not isinstance(failure, FileNotFoundError):
            raise failure

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=gone_already)
    else:
        shutil.rmtree(path, onerror=gone_already)


def publish(local: Path, dest: AnyPath) -> None:
    """Make the finished local file ``local`` appear at ``dest``, whole: a rename in a folder, one upload
    (an atomic PUT) on an object store; the local file is gone afterwards."""
    if is_local(dest):
        os.replace(local, dest)
        return
    dest.fs.put_file(str(local), dest.path)
    local.unlink()


def write_bytes_atomic(dest: AnyPath, data: bytes) -> None:
    """Write a whole file that readers see all or nothing of."""
    if is_local(dest):
        tmp = staging_file(dest)
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    else:
        dest.write_bytes(data)  # one PUT


def make_dirs(path: AnyPath) -> None:
    """A folder's parents (object stores have none: keys are names)."""
    if is_local(path):
        path.mkdir(parents=True, exist_ok=True)


def remove_tree(path: AnyPath) -> None:
    """Remove a folder (or every object under a prefix) if it is there."""
    if is_local(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        if path.fs.exists(path.path):
            path.fs.rm(path.path, recursive=True)


def remove_dir_if_empty(path: AnyPath) -> None:
    if is_local(path):
        with contextlib.suppress(OSError):
            path.rmdir()


def create_exclusive(path: AnyPath, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; False when it did. Atomic in a local folder
    (``O_EXCL``) and on object stores with conditional writes (S3's ``If-None-Match: *``, which fsspec's
    ``mode="xb"`` sends: AWS S3, MinIO and moto honour it). A store whose client has no exclusive create
    refuses the run rather than pretending to lock it."""
    if is_local(path):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    try:
        with path.fs.open(path.path, "xb") as f:
            f.write(data)
    except FileExistsError:
        return False
    except (ValueError, NotImplementedError, TypeError) as e:
        raise RuntimeError(
            f"{path}: this store's client has no create-if-absent write (mode 'xb'), which the output lock "
            f"needs ({e})"
        ) from e
    return True


def read_parquet(path: AnyPath, columns: list[str] | None = None) -> Any:
    """A Parquet file's table (or some columns); from an object store by ranged reads of the footer and
    the wanted column chunks, not the whole object. (``ParquetFile``, not ``read_table``: that imports
    pyarrow.dataset, which a run needs nowhere else; pandas, which it imports too, pyarrow 26 imports anyway
    on the first ``pa.array``, ``pa.scalar`` or ``to_numpy``.)"""
    import pyarrow.parquet as pq

    if is_local(path):
        return pq.ParquetFile(path).read(columns=columns)
    with path.open("rb") as f:  # the column chunks' ranges read coalesced, as read_table reads them
        return pq.ParquetFile(f, pre_buffer=True).read(columns=columns)


def read_range(path: AnyPath, start: int, end: int) -> bytes:
    """Bytes ``start:end`` of a file (one ranged GET on an object store); an error when the file is shorter."""
    if is_local(path):
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
    else:
        data = path.fs.cat_file(path.path, start=start, end=end)
    if len(data) != end - start:
        raise OSError(f"{path}: {len(data)} bytes at {start}, not the {end - start} expected (a cut file?)")
    return data
