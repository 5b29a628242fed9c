"""What a worker keeps for its lifetime, handed to every unit it runs.

A worker is whatever runs units of work one after another: a local pool process, a Ray actor, or the driver
running units inline. Its executor (``omnipack.executors``) makes one ``WorkerContext`` per worker, keeps it
as long as the worker lives, and passes it to each unit function (``fn(spec, unit, context)``). What is
costly to load and the same for many units (the run's spec, the tokenizer's ``Measurer``, the plan's mapped
token files, the profile's media store, an opened dataset) a unit takes from the context: loaded by the
worker's first unit that needs it, reused by the rest, and gone with the worker (no module-level caches).
An executor may also *offer* a worker an object its driver already loaded (``offer``, ``offered``): a
worker in a fresh process then fetches it instead of loading it again (a tokenizer's load imports torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class WorkerContext:
    """One worker's loaded objects, by kind and key (a digest of what the object depends on, so units of
    different runs or settings on one worker never share one), and ``cpus``: the CPUs the worker may keep
    busy, its share of the machine (the threads a unit starts stay within it: the write stage's row
    builders). 1 unless its executor says more."""

    def __init__(self, cpus: int = 1) -> None:
        self._kept: dict[str, dict[str, Any]] = {}
        self._offers: dict[tuple[str, str], Callable[[], Any]] = {}
        self.cpus = max(1, int(cpus))

    def kept(self, kind: str, key: str, make: Callable[[], T], *, latest_only: bool = False) -> T:
        """This worker's ``kind`` object for ``key``, made by ``make()`` the first time it is asked for.
        ``latest_only``: the worker keeps one object of the kind (a new key drops the old one: a replanned
        run's mappings, an earlier stage's spec)."""
        held = self._kept.setdefault(kind, {})
        if key not in held:
            if latest_only:
                held.clear()
            held[key] = make()
        return held[key]

    def offer(self, kind: str, key: str, fetch: Callable[[], Any]) -> None:
        """``fetch()`` gives this worker the ``kind`` object for ``key`` ready-made (one its executor's driver
        loaded), for a unit that asks with ``offered``; it may return None (then the unit loads its own)."""
        self._offers.setdefault((kind, key), fetch)

    def offered(self, kind: str, key: str) -> Any | None:
        """The ``kind`` object for ``key`` offered to this worker, fetched the first time it is asked for; None
        when none was offered or it could not be fetched."""
        fetch = self._offers.get((kind, key))
        return None if fetch is None else self.kept(f"offered {kind}", key, fetch)

    def run(
        self, fn: Callable[[Any, Any, WorkerContext], T], spec_key: str, load_spec: Callable[[], Any], unit: Any
    ) -> T:
        """``fn`` on ``unit`` in this worker, the spec shipped to it (``load_spec()``, the spec ``spec_key``
        names) loaded once per worker, not with every unit (it holds every input part: megabytes)."""
        return fn(self.kept("spec", spec_key, load_spec, latest_only=True), unit, self)
