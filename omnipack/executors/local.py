"""The embedded executor: stage units on a local process pool (nothing to start), or in this process.

``LocalExecutor.map`` runs a stage's unit function over its units (parts, shards) on pool processes; each
process keeps what it loads (a tokenizer, the mapped measure tables) in its worker context (``stages.worker``)
for all the units it runs; units run inline get the executor's own context.

Pool processes start warm: forked from multiprocessing's fork server, a single-threaded process started by
the first pool of a process and kept for the process's lifetime (a fresh interpreter, not a fork of the run;
one per process, so later runs in the same process reuse it) that imports the stage code (``WARM_MODULES``: torch,
transformers, pyarrow, omnipack's stages) once. A spawned process pays that import anew, ~4 s of CPU each
(benchmarks/README.md, "Warm pool workers"). Forked from the server, a worker is the server's child: it
ends with the server, and the server ends with the run (its end of the server's pipe closes). What a
spawned worker inherits from the run when the pool starts (environment, working folder, ``sys.path``) the
initializer sets from the run's values, as the server was started with the values of its own time. What the
preloaded modules read once at import (torch's OpenMP/MKL thread counts, huggingface_hub's ``HF_*``
constants) stays as it was when the server started: a process that runs prepare twice with other such
variables between the runs gets the first run's (a CLI run is one process, one run).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import util as mp_util
from typing import Any

from ..progress import attach_queue
from ..stages.storage import staging_dir
from ..stages.worker import WorkerContext
from .base import Executor, UnitFn, available_cpus

PARENT_POLL_S = 1.0  # how often a worker looks whether its parent is still there (where no signal says so)

# What a pool worker's units import, imported once by the fork server (each worker forks from it); "__main__"
# is the run's main script, as a spawned worker imports it (unit functions defined there). Imports only: none
# may run torch work at import (a process forked after torch's OpenMP pool ran hangs on its first parallel op;
# importing starts one idle OpenMP thread, which forks cleanly: test_pool_workers_run_torch_thread_pools).
WARM_MODULES = (
    "__main__",
    "torch",
    "pyarrow",
    "pandas",  # pyarrow imports it (where installed) at a worker's first array from a list: 0.23 s a worker
    "transformers.tokenization_utils_fast",
    "omnipack.pipeline",
    "omnipack.stages.measure",
    "omnipack.stages.pack",
    "omnipack.stages.write",
    "omnipack.stages.finalize",
)


def pool_context() -> Any:
    """The multiprocessing context of the pool's workers: the fork server, with ``WARM_MODULES`` preloaded,
    where the platform has one; spawn elsewhere (no fork: Windows). Never plain fork: the run holds threads
    (progress bars, tokenizers' and torch's thread pools) that a fork does not copy in a usable state.
    Spawn too where the fork server's socket path would not fit (``_forkserver_address_fits``)."""
    if "forkserver" not in mp.get_all_start_methods() or not _forkserver_address_fits():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    # the preload list is multiprocessing's (one server per process); it counts when the server starts
    context.set_forkserver_preload(list(WARM_MODULES))
    return context


UNIX_PATH_MAX = 107  # bytes of an AF_UNIX socket path on Linux (sun_path, less its NUL); macOS: 103


def _forkserver_address_fits() -> bool:
    """Whether the fork server's listening socket (``listener-XXXXXXXX`` in multiprocessing's temp folder,
    under ``TMPDIR``) has a path short enough to bind: a deep ``TMPDIR`` (a batch scheduler's per-job
    folder) fails the pool's first unit with "AF_UNIX path too long", so such runs spawn their workers."""
    limit = UNIX_PATH_MAX if sys.platform.startswith("linux") else 103
    return len(os.fsencode(os.path.join(mp_util.get_temp_dir(), "listener-XXXXXXXX"))) <= limit


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, but another user's: the pid was reused, the run is gone
        return False
    return True


def exit_with_parent(run_pid: int) -> None:
    """End this pool worker when the run dies (``kill -9``, the OOM killer): an orphaned worker holds its
    memory (a tokenizer, mapped tables: hundreds of MB each) for as long as it waits for work that never
    comes. The worker's parent is the run (spawned) or the fork server, which ends with the run. On Linux
    the kernel kills the worker when its parent ends (``PR_SET_PDEATHSIG``); elsewhere, and should the
    signal be missed, a thread sees the parent or the run gone within ``PARENT_POLL_S``."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # no libc prctl (e.g. a static interpreter): the thread below still watches

    def parents_there() -> bool:
        return os.getppid() == parent and (parent == run_pid or _process_alive(run_pid))

    if not parents_there():  # the parent died before the signal was set up
        os._exit(1)

    def watch() -> None:
        while parents_there():
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="omnipack-parent-watch", daemon=True).start()


# A pool process's worker context: the process is the worker, and the pool's initializer (``_worker_init``,
# the worker's constructor) makes it; a task reaches its process only through the modules it imports.
_POOL_WORKER: WorkerContext | None = None


def _load_spec(path: str) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)


def _run_unit(fn: UnitFn, spec_path: str, unit: Any) -> Any:
    if _POOL_WORKER is None:
        raise AssertionError("a pool task ran in a process the pool's initializer did not start")
    return _POOL_WORKER.run(fn, spec_path, lambda: _load_spec(spec_path), unit)


def _inherit(environ: Mapping[str, str], cwd: str, path: list[str]) -> None:
    """This process's environment, working folder and import path: the run's when its pool started (a
    forked worker has the fork server's, from when the server started: a test's or a library caller's
    later ``os.environ`` changes, S3 endpoints and credentials among them, would be missed)."""
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
    os.chdir(cwd)
    sys.path[:] = path


def _worker_init(
    progress_queue: Any, run_pid: int, environ: Mapping[str, str], cwd: str, path: list[str], cpus: int
) -> None:
    """A pool worker takes the run's environment, leaves Ctrl-C to the run (which stops the pool and says
    how to resume: a worker handling it too would print its own traceback), reports its progress counts to
    the run, ends when the run dies, and keeps its worker context (its share of the CPUs) for its lifetime."""
    global _POOL_WORKER
    exit_with_parent(run_pid)
    _inherit(environ, cwd, path)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    attach_queue(progress_queue)
    _POOL_WORKER = WorkerContext(cpus)


class LocalExecutor(Executor):
    """Units on ``workers`` pool processes (inline with one worker); results in unit order.

    A worker killed mid-unit (``kill -9``, the OOM killer) fails the run with ``BrokenProcessPool`` rather
    than hanging it; a rerun then redoes only the unfinished units.
    """

    def __init__(self, workers: int = 1) -> None:
        self.workers = max(1, int(workers))
        self._pool: Any = None
        # this process's, for units run inline (one worker, or one unit): the CPUs are all its own
        self._inline = WorkerContext(available_cpus())
        # made now, not with the pool: a stage's progress bar takes the queue before the first unit starts
        self.progress_queue = self._new_queue() if self.workers > 1 else None

    @staticmethod
    def _new_queue() -> Any:
        return pool_context().Queue()

    def map(self, fn: UnitFn, spec: Any, units: list[Any]) -> Iterator[Any]:
        if self.workers <= 1 or len(units) <= 1:
            for unit in units:
                yield fn(spec, unit, self._inline)
            return
        if self._pool is None:
            context = pool_context()
            if self.progress_queue is None:  # closed before: a new run of units
                self.progress_queue = self._new_queue()

            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                initializer=_worker_init,
                initargs=(
                    self.progress_queue,
                    os.getpid(),
                    dict(os.environ),
                    os.getcwd(),
                    list(sys.path),
                    max(1, available_cpus() // self.workers),  # each worker's share
                ),
            )
        # The spec (with every input part: megabytes for a large input) goes to each worker once, through a
        # file; a unit carries only its number. Pickled per unit it would cost O(units x parts). The file is
        # in this process's staging folder: if the run is killed (kill -9), the next run removes it.
        fd, spec_path = tempfile.mkstemp(prefix="omnipack-spec-", suffix=".pkl", dir=staging_dir())
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(spec, f, protocol=pickle.HIGHEST_PROTOCOL)
            n = len(units)
            yield from self._pool.map(_run_unit, [fn] * n, [spec_path] * n, units)
        finally:
            os.unlink(spec_path)

    def close(self, *, abort: bool = False) -> None:
        if self._pool is not None:
            if abort:  # Ctrl-C or an error: stop the running units now (a rerun redoes them)
                processes = list((getattr(self._pool, "_processes", None) or {}).values())
                self._pool.shutdown(wait=False, cancel_futures=True)
                for p in processes:
                    p.terminate()
                for p in processes:
                    p.join()
            else:
                self._pool.shutdown(cancel_futures=True)
            self._pool = None
        if self.progress_queue is not None:
            self.progress_queue.close()
            self.progress_queue.cancel_join_thread()  # nothing more to read: do not wait on its feeder
            self.progress_queue = None
