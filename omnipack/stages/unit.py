"""A stage's shape, and the one way a unit of work runs once.

A stage is a list of units (input parts, shards), each with a key (a digest of everything its output
depends on) and a record (``records.py``) saying the unit is done: ``run_once`` reuses a unit whose record
carries its current key and whose outputs are intact, and otherwise makes them (under temporary names,
renamed into place) and writes its record last, atomically, so a rerun redoes exactly what is unfinished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from .records import PlanRecord, crash_point, read_record, write_json_atomic
from .spec import RunSpec
from .storage import make_dirs
from .worker import WorkerContext


class UnitRecord(Protocol):
    key: str

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=UnitRecord)


def run_once(
    stage: str,
    unit: int,
    path: Path,
    key: str,
    load: Callable[[dict[str, Any]], R],
    intact: Callable[[R], bool],
    make: Callable[[], R],
) -> tuple[R, bool]:
    """The unit's record at ``path`` when it was made with ``key`` and its outputs are ``intact`` (and True:
    kept); else ``make()``'s record (``make`` writes and publishes the unit's outputs), written last, once
    the outputs are in place (and False)."""
    raw = read_record(path, key)
    if raw is not None:
        kept = load(raw)
        if intact(kept):
            return kept, True
    record = make()
    record.key = key
    crash_point(stage, unit)
    make_dirs(path.parent)
    write_json_atomic(path, record.to_json())
    return record, False


@dataclass(frozen=True)
class Stage(Generic[R]):
    """A stage an executor maps over its units (measure: the input's parts; write: the plan's shards).

    ``run`` is a module-level ``fn(spec, unit, context) -> record`` (executors ship it to other processes;
    ``context``: the running worker's ``WorkerContext``); the other members let the driver say what a rerun
    keeps before running anything."""

    name: str
    units: Callable[[RunSpec, PlanRecord | None], list[int]]
    key: Callable[[RunSpec, PlanRecord | None, int], str]
    record_path: Callable[[RunSpec, int], Path]
    load: Callable[[dict[str, Any]], R]
    run: Callable[[RunSpec, int, WorkerContext], R]
    size: Callable[[RunSpec, PlanRecord | None, int], int]  # the unit's work: input records, or rows
    item: str  # what ``size`` counts
    bar_item: str  # what the progress bar counts
    describe: Callable[[RunSpec, list[int], int], str]  # the units and their total size, in words
    # the local files a unit replaces when it runs (a write unit's shard and index), or none
    outputs: Callable[[RunSpec, PlanRecord | None, int], list[Path]] = lambda spec, plan, unit: []

    def current(self, spec: RunSpec, plan: PlanRecord | None, unit: int) -> R | None:
        """The unit's record when it was made with its current key; None when it is to be (re)done."""
        raw = read_record(self.record_path(spec, unit), self.key(spec, plan, unit))
        return None if raw is None else self.load(raw)
