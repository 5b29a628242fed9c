"""The Ray executor: the same unit functions on a Ray cluster, one actor per worker.

An actor is a long-lived worker process: what a unit loads there (the tokenizer, the mapped measure
tables) stays loaded for the next unit it runs. Units go to free actors (``ActorPool.map_unordered``) and
results are handed back in unit order; nothing depends on which actor ran what. Inputs and outputs live on a path
every node sees (a shared filesystem). Imported only when ``--executor ray`` is chosen.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .base import Executor, UnitFn

try:
    import ray
    from ray.util import ActorPool
except ImportError as e:  # pragma: no cover - depends on the optional extra
    raise ImportError("--executor ray needs Ray: omnipack's ray extra, pip install '.[ray]' in the omnipack repository") from e


@ray.remote(num_cpus=1)
class _UnitWorker:
    def __init__(self) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one CPU per actor
        self._spec: tuple[str, Any] | None = None

    def run(self, fn: UnitFn, spec_box: list, unit: Any) -> tuple[Any, Any]:
        # The reference comes boxed, so Ray does not fetch and deserialize the spec (every input part:
        # megabytes for a large input) for each unit: the actor gets it once and keeps it.
        ref = spec_box[0]
        if self._spec is None or self._spec[0] != ref.hex():
            self._spec = (ref.hex(), ray.get(ref))
        return unit, fn(self._spec[1], unit)


class RayExecutor(Executor):
    """``workers`` actors on the cluster at ``address`` (None: the running or a new local Ray)."""

    def __init__(self, workers: int = 1, address: str | None = None) -> None:
        self.workers = max(1, int(workers))
        self._started = False
        if not ray.is_initialized():
            # the driver's import path goes to the workers, so they import the same omnipack
            env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
            ray.init(address=address, include_dashboard=False, runtime_env={"env_vars": env} if env else None)
            self._started = True
        self._actors = [_UnitWorker.remote() for _ in range(self.workers)]
        self._pool = ActorPool(self._actors)

    def map(self, fn: UnitFn, spec: Any, units: list[Any]) -> Iterator[Any]:
        spec_ref = ray.put(spec)
        # Units go to whichever actor is free (in order, an actor would wait for a slower one's result to
        # be taken); results come back in unit order.
        done: dict[int, Any] = {}
        position = {unit: k for k, unit in enumerate(units)}
        next_k = 0
        for unit, result in self._pool.map_unordered(
            lambda actor, unit: actor.run.remote(fn, [spec_ref], unit), units
        ):
            done[position[unit]] = result
            while next_k in done:
                yield done.pop(next_k)
                next_k += 1

    def close(self, *, abort: bool = False) -> None:
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
        if self._started:
            ray.shutdown()
            self._started = False
