"""The Ray executor: the same unit functions on a Ray cluster, one actor per worker.

An actor is a long-lived worker process: what a unit loads there (the tokenizer, the mapped measure
tables) stays loaded in the actor's worker context (``stages.worker``) for the next unit it runs.
Scheduling is dynamic: a unit goes to an actor only once that actor is placed and free, so an actor the
cluster cannot place (no free CPU) holds no unit, and a slow actor holds only the unit it runs. A unit whose
actor dies (``kill -9``, the OOM killer, a lost node) is queued again for the next free actor and a new
actor replaces the dead one; every unit writes its own files, so a rerun unit gives the same bytes.
Imported only when ``--executor ray`` is chosen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

# The stages load with this module (the tokenizer library, Arrow, the media decoders), so an actor pays their
# imports when it starts, while the driver still splits the input, not in its first unit.
from ..stages import measure as _measure  # noqa: F401
from ..stages.worker import WorkerContext
from .base import Executor, UnitFn, available_cpus

try:
    import ray
    from ray.exceptions import RayActorError
except ImportError as e:  # pragma: no cover - depends on the optional extra
    raise ImportError("--executor ray needs Ray: omnipack's ray extra, pip install '.[ray]' in the omnipack repository") from e

UNIT_TRIES = 3  # a unit whose worker died this many times fails the run (it may be what kills them)
STALL_S = 60.0  # no worker placed for this long while units wait: say so (and keep waiting)
REGISTRATION_POLL_S = 0.02  # how often a starting cluster's node is looked up while its raylet registers
# After this, Ray's own lookup runs; it asks again at once on a miss, each time after this wait: a raylet that
# never registers fails the start after Ray's 30 s, plus up to one such wait.
REGISTRATION_WAIT_S = 10.0


def _warn(message: str) -> None:
    print(f"omnipack prepare: ray: {message}", file=sys.stderr, flush=True)


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@ray.remote(num_cpus=1)
class _UnitWorker:
    def __init__(self) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one CPU per actor
        self._context = WorkerContext()  # what the actor's units load, kept for its lifetime

    def get_pid(self) -> int:
        """This actor's process id; its answer also says that the actor is placed and running."""
        return os.getpid()

    def run(self, fn: UnitFn, spec_box: list, offers: dict[tuple[str, str], Any], unit: Any) -> Any:
        # The reference comes boxed, so Ray does not fetch and deserialize the spec (every input part:
        # megabytes for a large input) for each unit: the actor gets it once and keeps it. So do the offers'
        # (inside a dict): each is fetched only by a unit that asks for it.
        for (kind, key), offer_ref in offers.items():
            self._context.offer(kind, key, lambda kind=kind, ref=offer_ref: _fetch_offer(kind, ref))
        ref = spec_box[0]
        return self._context.run(fn, ref.hex(), lambda: ray.get(ref), unit)


def _fetch_offer(kind: str, ref: Any) -> Any:
    """An offered object, or None (with a line saying why) where it cannot be fetched or unpickled here:
    the unit then loads its own, as without the offer."""
    try:
        return pickle.loads(ray.get(ref))
    except Exception as e:  # noqa: BLE001 - any failure: the unit loads the object itself (slower, same result)
        print(
            f"omnipack: the driver's {kind} did not arrive on this worker ({e!r}): loading it here", file=sys.stderr
        )
        return None


def _machine_cpus() -> int:
    """The CPUs Ray gives a local cluster by default (cgroup limits counted); ``available_cpus`` (the same
    limits) should Ray's internal helper move."""
    try:
        from ray._private.utils import get_num_cpus

        return max(1, int(get_num_cpus()))
    except (ImportError, AttributeError):
        return available_cpus()


def _end_autoscaler_monitor() -> None:
    """Kill the autoscaler monitor of a cluster this process started, before ``ray.shutdown``.

    ``ray.shutdown`` ends the cluster's processes one after another, each given a second to exit on SIGTERM;
    the monitor (a one-node cluster has nothing to scale) never exits in that second, so every run paid a
    1 s wait at its end (a 20k-chat run takes ~8 s). It keeps no state: killed at once. Best effort, through
    Ray's node object (not a public API): without it, the shutdown is only slower.
    """
    try:
        node = ray._private.worker._global_node
        monitors = node.all_processes.get(ray._private.ray_constants.PROCESS_TYPE_MONITOR, []) if node else []
        for info in monitors:
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - an internal of Ray's that moved: shutdown ends it, a second later
        pass


def _node_registered(gcs_address: str, node_id: str, timeout: float) -> bool:
    """Wait until the node ``node_id`` has registered with the cluster's GCS at ``gcs_address``, looking every
    20 ms; False at ``timeout`` or when the lookup itself fails (Ray's internal client API moved)."""
    end = time.monotonic() + timeout
    try:
        client = ray._raylet.GcsClient(address=gcs_address)
        while True:
            if any(key.hex().lower() == node_id.lower() for key in client.get_all_node_info(timeout=5)):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(REGISTRATION_POLL_S)
    except Exception:  # noqa: BLE001 - an internal of Ray's that moved: its own wait still runs
        return False


@contextlib.contextmanager
def _prompt_node_start() -> Iterator[None]:
    """While a local cluster starts: look the new node up only once its raylet has registered.

    ``ray.init`` starting a cluster asks the GCS for the new node 0.1 s after starting the raylet; the raylet
    registers only after its agent (a Python process) is up, later than that, and the lookup then sleeps a
    fixed second before it looks again. So the start took 2.2 or 3.2 s on an idle 2-core machine, ~1.8 s with
    this wait (a whole 20k-chat run is ~8 s). Best effort, through Ray's internals: without them, the start is
    only slower.
    """
    services = getattr(ray._private, "services", None)
    get_node = getattr(services, "get_node", None)
    if get_node is None:
        yield
        return

    def get_registered_node(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 2 and not kwargs and all(isinstance(a, str) for a in args):  # (gcs_address, node_id)
            _node_registered(args[0], args[1], REGISTRATION_WAIT_S)
        return get_node(*args, **kwargs)  # any other call (Ray's changed): as Ray made it

    services.get_node = get_registered_node
    try:
        yield
    finally:
        services.get_node = get_node


def own_cluster_options(workers: int) -> dict[str, Any]:
    """``ray.init`` options for a cluster the run starts for itself.

    A CPU per worker, not one per core: Ray starts a Python worker per CPU in advance (64 on a 64-core
    machine, for a run of 2 workers). Workers at the driver's priority: Ray lowers its workers' priority to
    nice 15 by default, so on a machine other work keeps busy the actors, which do all of the run's work,
    got ~4% of a core against a local pool's workers' full share (a 3 s demo run took 144 s beside a
    loaded test run).
    """
    return {"num_cpus": min(workers, _machine_cpus()), "_system_config": {"worker_niceness": 0}}


def cluster_line() -> str:
    """The Ray cluster this process is on: its address, CPUs and nodes."""
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    cpus = ray.cluster_resources().get("CPU", 0)
    return f"at {ray.get_runtime_context().gcs_address}: {cpus:g} CPUs on {nodes} node(s)"


class RayExecutor(Executor):
    """``workers`` actors on the Ray cluster at ``address``: ``"local"`` a new local cluster for this run only,
    ``"auto"`` the cluster running on this machine (``ray start``; an error if none), ``host:port`` or
    ``ray://host:port`` that one; ``None``: ``RAY_ADDRESS`` (set by ``ray job submit``) if set, else ``"local"``.
    A Ray this process already joined is used as it is. The run says which cluster it is on. More workers
    than the cluster's CPUs are capped, with a warning."""

    def __init__(self, workers: int = 1, address: str | None = None) -> None:
        self._started = False
        self._requested = max(1, int(workers))
        self._idle: list[Any] = []  # placed actors without a unit
        self._starting: dict[Any, Any] = {}  # get_pid reference -> actor not yet known to be placed
        self._pids: dict[Any, int] = {}  # placed actor -> its process id
        self._failed_starts = 0  # actors in a row that died before they were placed
        self._start_error: BaseException | None = None
        self._offers: dict[tuple[str, str], Any] = {}  # (kind, key) -> the pickled object, then its reference
        # The cluster (seconds: its processes, then the actors' imports) comes up in the background while the
        # driver splits the input and loads the tokenizer; the first use of the workers waits for it.
        self._ready = threading.Event()
        # The starting thread lives as long as the cluster: Ray starts its processes with PR_SET_PDEATHSIG,
        # which kills them when the thread that started them ends (not the process).
        self._release = threading.Event()
        self._start_thread = threading.Thread(
            target=self._start, args=(address,), name="omnipack-ray-start", daemon=True
        )
        self._start_thread.start()

    def _start(self, address: str | None) -> None:
        try:
            self._connect(address)
            for _ in range(self._workers):
                self._start_actor()
        except BaseException as e:  # raised in the caller's thread, at the first use of the workers
            self._start_error = e
        finally:
            self._ready.set()
        self._release.wait()

    def _connect(self, address: str | None) -> None:
        if address is None and not os.environ.get("RAY_ADDRESS"):
            # not ray.init's own default, which joins the cluster last started on this machine
            # (/tmp/ray/ray_current_cluster), still running or not
            address = "local"
        if not ray.is_initialized():
            # the driver's import path goes to the workers, so they import the same omnipack; a cluster this
            # process starts inherits its environment (a runtime_env would make each actor wait for a worker
            # started for it, seconds, instead of taking one the cluster started in advance)
            env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
            runtime_env = {"env_vars": env} if env and address != "local" else None
            own = own_cluster_options(self._requested) if address == "local" else {}
            # from this thread Ray leaves the SIGTERM handler as it is (the run's lease handles SIGTERM) and
            # warns that it does: not the user's concern
            worker_log = logging.getLogger("ray._private.worker")
            quiet = _DropMessage("SIGTERM handler is not set")
            worker_log.addFilter(quiet)
            start = _prompt_node_start() if address == "local" else contextlib.nullcontext()
            try:
                with start:
                    ray.init(address=address, include_dashboard=False, runtime_env=runtime_env, **own)
            finally:
                worker_log.removeFilter(quiet)
            self._started = True
            node = getattr(ray._private.worker, "_global_node", None)  # None for a Ray Client (ray://)
            started = node is not None and node.is_head()
            _warn(f"{'started a local Ray cluster' if started else 'joined the Ray cluster'} {cluster_line()}")
        else:
            _warn(f"using the Ray cluster this process is on, {cluster_line()}")
        requested = self._requested
        cpus = int(ray.cluster_resources().get("CPU", 0))
        self._workers = min(requested, cpus) if cpus >= 1 else requested
        if self._workers < requested:
            # an actor the cluster cannot place would wait for a CPU that never comes
            _warn(f"--workers {requested} is more than the cluster's {cpus} CPUs: running {self._workers} workers")

    def _wait_started(self) -> None:
        """Wait for the background start (the cluster, the actors' creation); raise what it raised."""
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error

    @property
    def workers(self) -> int:  # type: ignore[override]
        """How many actors run the units (``--workers``, capped at the cluster's CPUs)."""
        self._wait_started()
        return self._workers

    def _start_actor(self) -> None:
        actor = _UnitWorker.remote()
        self._starting[actor.get_pid.remote()] = actor

    def _placed(self, ref: Any) -> None:
        """A starting actor answered (placed: now idle) or died before it could (replaced)."""
        actor = self._starting.pop(ref)
        try:
            self._pids[actor] = ray.get(ref)
        except RayActorError as e:
            self._failed_starts += 1
            if self._failed_starts > self._workers + 3:  # not a lost node: no actor can start on this cluster
                raise RuntimeError(f"ray: {self._failed_starts} workers in a row died before they started: {e}") from e
            self._replace(actor)
        else:
            self._failed_starts = 0
            self._idle.append(actor)

    def _replace(self, actor: Any) -> None:
        self._pids.pop(actor, None)
        ray.kill(actor)
        self._start_actor()

    def worker_pids(self) -> list[int]:
        """The process ids of the placed actors."""
        self._wait_started()
        return list(self._pids.values())

    def wait_for_workers(self, timeout: float | None = None) -> int:
        """Wait until every actor is placed (or ``timeout`` seconds); returns how many are."""
        end = None if timeout is None else time.monotonic() + timeout
        self._wait_started()
        while self._starting:
            left = None if end is None else max(0.0, end - time.monotonic())
            ready, _ = ray.wait(list(self._starting), num_returns=1, timeout=left)
            if not ready:
                break
            self._placed(ready[0])
        return len(self._pids)

    def offer(self, kind: str, key: str, value: Any) -> None:
        """Send ``value`` to the actors as their ``kind`` object for ``key`` (``WorkerContext.offered``): the
        tokenizer the driver loaded, which an actor would otherwise load again, importing torch (for the demo
        tokenizer 1.6 s of CPU, against 0.5 s to unpickle it). Pickled now, a snapshot of the object as it
        is; one that does not pickle is not sent (the actors load their own)."""
        try:
            self._offers[(kind, key)] = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - any failure: the actors load it themselves (slower, same result)
            _warn(f"the {kind} does not pickle ({e!r}): each worker loads its own")

    def _offer_refs(self) -> dict[tuple[str, str], Any]:
        """The offers' references in the object store (each put once, at the first map after its offer)."""
        for offer, value in self._offers.items():
            if isinstance(value, bytes):
                self._offers[offer] = ray.put(value)
        return dict(self._offers)

    def map_unordered(self, fn: UnitFn, spec: Any, units: list[Any]) -> Iterator[tuple[Any, Any]]:
        self._wait_started()
        box = [ray.put(spec)]
        offers = self._offer_refs()
        todo = deque(units)
        tries: Counter = Counter()
        running: dict[Any, tuple[Any, Any]] = {}  # run reference -> (actor, unit)
        waited = 0.0
        while todo or running:
            while todo and self._idle:
                actor, unit = self._idle.pop(), todo.popleft()
                running[actor.run.remote(fn, box, offers, unit)] = (actor, unit)
            # with a unit running, wait for it however long it takes; with none, say when no actor is placed
            timeout = None if running else STALL_S
            ready, _ = ray.wait([*running, *self._starting], num_returns=1, timeout=timeout)
            if not ready:
                waited += STALL_S
                cpus = ray.available_resources().get("CPU", 0)
                _warn(
                    f"no worker placed after {waited:.0f} s ({len(todo)} units waiting, {cpus:g} CPUs free in the "
                    "cluster); still waiting"
                )
                continue
            waited = 0.0
            ref = ready[0]
            if ref in self._starting:
                self._placed(ref)
                continue
            actor, unit = running.pop(ref)
            try:
                record = ray.get(ref)
            except RayActorError as e:
                tries[unit] += 1
                pid = self._pids.get(actor, "?")
                if tries[unit] >= UNIT_TRIES:
                    raise RuntimeError(f"ray: unit {unit} lost its worker {tries[unit]} times; last: {e}") from e
                _warn(f"worker (pid {pid}) died running unit {unit}; it runs again on another worker")
                todo.appendleft(unit)
                self._replace(actor)
                continue
            self._idle.append(actor)
            yield unit, record

    def map(self, fn: UnitFn, spec: Any, units: list[Any]) -> Iterator[Any]:
        # results in unit order, each as soon as the units before it are done
        done: dict[Any, Any] = {}
        k = 0
        for unit, record in self.map_unordered(fn, spec, units):
            done[unit] = record
            while k < len(units) and units[k] in done:
                yield done.pop(units[k])
                k += 1

    def close(self, *, abort: bool = False) -> None:
        self._ready.wait()  # a start cannot be cut short: let it end, then undo it
        for actor in [*self._starting.values(), *self._pids]:  # placed ones: idle or running a unit
            ray.kill(actor)
        self._idle, self._starting, self._pids = [], {}, {}
        if self._started:
            _end_autoscaler_monitor()
            ray.shutdown()
            self._started = False
        self._release.set()
        self._start_thread.join()
