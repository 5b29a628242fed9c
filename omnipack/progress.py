"""Live progress of a stage: counts reported from inside its units (samples measured, rows written),
wherever the units run, shown as one bar per stage with the rate and the time left.

A unit function calls ``advance(stage, unit, n)`` as it goes. Run in this process, that moves the bar at
once; in a local pool's worker processes the counts go to the parent through a queue (attached by the
pool's initializer, ``attach_queue``), sent at most every ``REPORT_S`` seconds. Executors without that
channel (Ray) move the bar by a unit's whole count when it finishes; so does every finished unit, whatever
it reported, which keeps the bar exact.
"""

from __future__ import annotations

import queue as queue_mod
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

REPORT_S = 0.2  # a worker sends its counts at most this often

_sink: Callable[[str, int, int], None] | None = None  # where this process's counts go


def advance(stage: str, unit: int, n: int) -> None:
    """``n`` more items (samples, rows) of ``unit`` of ``stage`` done."""
    if _sink is not None and n:
        _sink(stage, unit, n)


def say(message: str, enabled: bool = True) -> None:
    """One status line on stderr (where the bars go), printed at once."""
    if enabled:
        print(message, file=sys.stderr, flush=True)


class _QueueSink:
    """A worker's counts, summed per unit and sent to the parent's queue at most every ``REPORT_S``."""

    def __init__(self, q: Any) -> None:
        self._queue = q
        self._pending: dict[tuple[str, int], int] = {}
        self._sent = time.monotonic()

    def __call__(self, stage: str, unit: int, n: int) -> None:
        key = (stage, unit)
        self._pending[key] = self._pending.get(key, 0) + n
        now = time.monotonic()
        if now - self._sent >= REPORT_S:
            for (s, u), count in self._pending.items():
                self._queue.put((s, u, count))
            self._pending.clear()
            self._sent = now


def attach_queue(q: Any) -> None:
    """In a worker process: send this process's counts to the parent through ``q``."""
    global _sink
    _sink = _QueueSink(q)


class StageProgress:
    """The bar of one stage over its units, each with a known total (``totals[unit]``).

    Units listed in ``done`` (finished by an earlier run) count from the start. Counts beyond a unit's
    total, or arriving after it finished, are dropped: ``finish(unit)`` sets the unit to its total.
    """

    def __init__(
        self,
        stage: str,
        totals: dict[int, int],
        item: str,
        *,
        enabled: bool = True,
        done: set[int] | frozenset[int] = frozenset(),
        reports: Any = None,
    ) -> None:
        from tqdm import tqdm

        self.stage, self._totals = stage, totals
        self._count = {u: (t if u in done else 0) for u, t in totals.items()}
        self._finished = set(done) & set(totals)
        self._lock = threading.Lock()
        self._reports, self._stop = reports, threading.Event()
        self.bar = tqdm(
            total=sum(totals.values()),
            initial=sum(self._count.values()),
            desc=stage,
            unit=f" {item}",
            unit_scale=False,
            disable=not enabled,
            file=sys.stderr,
            mininterval=0.5,
        )
        self._thread: threading.Thread | None = None

    @property
    def count(self) -> int:
        """Items done so far (the bar's position, also when the bar is not shown)."""
        return sum(self._count.values())

    @property
    def total(self) -> int:
        return sum(self._totals.values())

    def advance(self, stage: str, unit: int, n: int) -> None:
        if stage != self.stage:
            return  # a late report of an earlier stage
        with self._lock:
            if unit in self._finished or unit not in self._totals:
                return
            new = min(self._totals[unit], self._count[unit] + n)
            self.bar.update(new - self._count[unit])
            self._count[unit] = new

    def finish(self, unit: int) -> None:
        with self._lock:
            if unit in self._finished:
                return
            self.bar.update(self._totals.get(unit, 0) - self._count.get(unit, 0))
            self._count[unit] = self._totals.get(unit, 0)
            self._finished.add(unit)

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                stage, unit, n = self._reports.get(timeout=0.1)
            except queue_mod.Empty:
                continue
            except (EOFError, OSError):  # the pool went away (interrupted)
                return
            self.advance(stage, unit, n)

    def __enter__(self) -> StageProgress:
        global _sink
        self._previous, _sink = _sink, self.advance  # units run in this process report directly
        if self._reports is not None:
            self._thread = threading.Thread(target=self._drain, name="omnipack-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        global _sink
        _sink = self._previous
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.bar.close()
