"""What an executor is: something that runs a stage's unit function over its units, results in unit order
(``map``) or as they finish (``map_unordered``).

A unit function is a module-level ``fn(spec, unit, context) -> record`` of plain data (``spec``: the run's
settings and paths; ``unit``: a part or shard number; ``context``: the ``WorkerContext`` of the worker
running it, which the executor keeps for the worker's lifetime), so any executor can ship it to any process
or machine. Output never depends on the executor: every unit writes its own files, named by the unit.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..stages.worker import WorkerContext

UnitFn = Callable[[Any, Any, WorkerContext], Any]


CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may keep busy: its affinity mask (a Slurm or taskset allocation, not the
    machine's count), within its container's CPU quota (cgroup v2 ``cpu.max``, or v1's CFS quota), as
    Ray counts a node's CPUs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup_root)
    return max(1, min(cpus, quota) if quota else cpus)


def _cgroup_cpu_quota(root: Path) -> int | None:
    """The container's CPU quota rounded up to whole CPUs; None where there is none (or no cgroup files)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "QUOTA PERIOD" or "max PERIOD"
        return None if quota == "max" else -(-int(quota) // int(period))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())  # v1; -1: none
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return -(-quota_us // period_us) if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


class Executor:
    workers: int = 1
    # where units running in other processes send their progress counts (``omnipack.progress``); None:
    # the bar moves by whole units as they finish
    progress_queue: Any = None

    def map(self, fn: UnitFn, spec: Any, units: list[Any]) -> Iterator[Any]:
        raise NotImplementedError

    def map_unordered(self, fn: UnitFn, spec: Any, units: list[Any]) -> Iterator[tuple[Any, Any]]:
        """``(unit, record)`` pairs as the units finish (an executor that can tell: in the order they finish,
        so a stage's bar counts each unit when it is done, not when the units before it are)."""
        yield from zip(units, self.map(fn, spec, units), strict=True)

    def offer(self, kind: str, key: str, value: Any) -> None:
        """Offer the workers ``value``, an object this process loaded, as their ``kind`` object for ``key``
        (``WorkerContext.offered``). An executor whose workers start in fresh processes sends it, where that
        costs less than loading it again; this one sends nothing and its workers load their own (the local
        pool's fork from a server that has torch and transformers imported: a tokenizer's load there costs
        a fraction of a fresh process's)."""

    def close(self, *, abort: bool = False) -> None:
        """Release workers (the executor may be used for several stages first); ``abort`` (an error or
        Ctrl-C in the caller): stop the units still running instead of waiting for them."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(abort=exc_type is not None)
