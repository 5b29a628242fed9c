"""The Ray executor: the same units on Ray actors give the bytes of a local run, on one node (a local
Ray with 2 CPUs, started once for the module) and on a simulated cluster of two nodes; a killed actor's
unit runs again elsewhere, more workers than CPUs are capped, and a worker the cluster cannot place holds
no unit."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from omnipack.pipeline import run_prepare  # noqa: E402
from tests.prepare_child import run_omnipack  # noqa: E402
from tests.stage_outputs import cli_args, dataset_bytes, demo_config  # noqa: E402


def node_of(spec, unit, context):
    """A unit function that reports where it ran."""
    return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def reference(demo_reference):
    return dataset_bytes(demo_reference)


def pid_of(spec, unit, context):
    """A unit function that reports which process ran it (slowly enough for both actors to get units)."""
    time.sleep(0.2)
    return os.getpid()


def die_once(marker_dir, unit, context):
    """Unit 2 kills its worker (``kill -9``) the first time it runs; every unit returns its process id."""
    marker = os.path.join(marker_dir, f"died-{unit}")
    if unit == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return os.getpid()


def unit_1_kills_its_worker(spec, unit, context):
    if unit == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return unit


def niceness_of(spec, unit, context):
    return os.nice(0)


def last_to_finish(spec, unit, context):
    """Unit 0 returns only once ``spec = (folder, units_mark)``'s folder holds a file for each of units 1-4
    (the units run in actors, other processes): one each of those units leaves as it ends where
    ``units_mark``, else one the driver leaves as it counts the unit. A failure, not a hang, if they never
    come."""
    folder, units_mark = Path(spec[0]), spec[1]
    if unit != 0:
        if units_mark:
            (folder / f"done-{unit}").touch()
        return unit
    deadline = time.monotonic() + 60
    while len(list(folder.glob("done-*"))) < 4:
        assert time.monotonic() < deadline, "the other units did not finish while unit 0 ran"
        time.sleep(0.02)
    return unit


@ray.remote(num_cpus=1)
class CpuHolder:
    """Holds one of the cluster's CPUs while it lives (another job's actor)."""

    def ping(self) -> int:
        return os.getpid()


def finishes_within(seconds: float, fn):
    """``fn()``'s result, or a failure (not a hung test) when it takes longer than ``seconds``."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still running after {seconds} s"
    return result[0]


def start_local_ray() -> None:
    """A Ray cluster of this process's own with 2 CPUs ("local"), never whatever Ray already runs on the
    machine (``RAY_ADDRESS``, or the cluster ``ray start`` last left in ``ray_current_cluster``): joining one
    would fail, as num_cpus cannot be set when joining, or run the tests on another job's cluster."""
    from omnipack.executors.ray import own_cluster_options

    ray.init(address="local", include_dashboard=False, **own_cluster_options(2))


@pytest.fixture(scope="module")
def module_ray():
    start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture
def local_ray(module_ray):
    """The module's one-node Ray, started once (a test that shuts it down runs after every test using it)."""
    assert ray.is_initialized(), "an earlier test shut the module's Ray down: it belongs after the tests using it"


def test_the_fixture_starts_a_cluster_of_its_own_beside_one_already_running(local_ray):
    """With a cluster already running on the machine (the module's own, announced as ``ray start`` and
    ``ray job submit`` announce one: RAY_ADDRESS and RAY_TMPDIR's ``ray/ray_current_cluster``), the fixture's
    start in another process gives that process a new cluster with its own 2 CPUs, not the running one."""
    import subprocess
    import sys
    import tempfile

    running = ray.get_runtime_context().gcs_address
    code = (
        "import ray; from tests.test_ray import start_local_ray; start_local_ray(); "
        "print(ray.get_runtime_context().gcs_address, ray.cluster_resources()['CPU']); ray.shutdown()"
    )
    with tempfile.TemporaryDirectory(prefix="rt", dir="/tmp") as ray_tmp:  # short: Ray's socket paths go here
        os.makedirs(os.path.join(ray_tmp, "ray"))
        with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
            f.write(running)
        env = {**os.environ, "RAY_ADDRESS": running, "RAY_TMPDIR": ray_tmp}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    address, cpus = run.stdout.strip().splitlines()[-1].split()
    assert address != running and float(cpus) == 2


def recorded_offers(monkeypatch) -> list[str]:
    """The kinds of what Ray executors offer their actors from now on (offered as before, and listed)."""
    from omnipack.executors.ray import RayExecutor

    offered: list[str] = []
    real_offer = RayExecutor.offer

    def recording(self, kind, key, value):
        offered.append(kind)
        real_offer(self, kind, key, value)

    monkeypatch.setattr(RayExecutor, "offer", recording)
    return offered


def test_ray_actors_give_the_bytes_of_a_local_run(
    local_ray, tmp_path, reference, demo_tokenizer, demo_corpus, capfd, monkeypatch
):
    offered = recorded_offers(monkeypatch)  # what the run offers its actors: the tokenizer it loaded for the facts
    out = tmp_path / "ray"
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=2))
    assert dataset_bytes(out) == reference
    assert offered == ["tokenizer"]
    assert ray.is_initialized()  # a Ray the caller started stays up
    # the run says which cluster it runs on
    address = ray.get_runtime_context().gcs_address
    assert f"using the Ray cluster this process is on, at {address}: 2 CPUs on 1 node(s)" in capfd.readouterr().err


def test_a_run_whose_actor_is_killed_mid_measure_gives_the_same_bytes(
    local_ray, tmp_path, reference, demo_tokenizer, demo_corpus, monkeypatch, capfd
):
    """``kill -9`` of one actor while it runs a unit, once in the measure stage and once in the write stage:
    the unit runs again on another worker (a new actor replaces the dead one) and the run finishes with the
    bytes of an uninterrupted run."""
    import omnipack.pipeline
    from omnipack.executors.ray import RayExecutor

    killed: dict[str, int] = {}  # stage function -> the pid killed in it

    class KillsAnActor(RayExecutor):
        def map_unordered(self, fn, spec, units):
            self.wait_for_workers(120)  # both actors (the replacement of one killed before too) get a unit
            for unit, record in super().map_unordered(fn, spec, units):
                if fn.__name__ not in killed:  # the first unit done: the other actor still runs one
                    running = [pid for actor, pid in self._pids.items() if actor not in self._idle]
                    assert running, f"no other unit running when the first of {fn.__name__} finished"
                    killed[fn.__name__] = running[0]
                    os.kill(running[0], signal.SIGKILL)
                yield unit, record

    monkeypatch.setattr(omnipack.pipeline, "make_executor", lambda name, workers, address: KillsAnActor(workers))
    out = tmp_path / "killed"
    # part_lines 4: 17 measure units, so the kill comes with units still to run
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=2, part_lines=4))
    assert set(killed) == {"measure_part", "write_shard"}
    err = capfd.readouterr().err
    for pid in killed.values():
        assert f"worker (pid {pid}) died running unit" in err
    assert dataset_bytes(out) == reference


def test_a_unit_whose_worker_dies_runs_again_on_another_worker(local_ray, tmp_path, capfd):
    from omnipack.executors.ray import RayExecutor

    with RayExecutor(workers=2) as ex:
        pids = list(ex.map(die_once, str(tmp_path), list(range(6))))
    assert len(pids) == 6 and (tmp_path / "died-2").exists()
    assert "died running unit 2; it runs again on another worker" in capfd.readouterr().err


def test_the_node_wait_leaves_the_start_to_ray_where_its_internals_moved(monkeypatch):
    """No cluster: a GCS client that cannot be made ends the wait at once (Ray's own lookup then waits), and a
    lookup called in another way than Ray 2.60's goes to Ray's function unchanged, unwaited."""
    from ray._private import services

    import omnipack.executors.ray as ray_executor

    def moved(*args, **kwargs):
        raise RuntimeError("moved")

    monkeypatch.setattr(ray._raylet, "GcsClient", moved)
    start = time.monotonic()
    assert not ray_executor._node_registered("127.0.0.1:1", "ab", 5.0) and time.monotonic() - start < 1
    calls: list = []
    polled: list = []

    def rays_own(*args, **kwargs):
        calls.append((args, kwargs))
        return "node"

    monkeypatch.setattr(services, "get_node", rays_own)
    monkeypatch.setattr(ray_executor, "_node_registered", lambda *args: polled.append(args) or True)
    with ray_executor._prompt_node_start():
        assert services.get_node("addr", "ab", timeout_s=1) == "node"
        assert services.get_node("addr", "ab") == "node"
    assert calls == [(("addr", "ab"), {"timeout_s": 1}), (("addr", "ab"), {})]
    assert polled == [("addr", "ab", ray_executor.REGISTRATION_WAIT_S)] and services.get_node is rays_own


def test_a_unit_that_kills_every_worker_it_runs_on_fails_the_run_by_name(local_ray):
    """A unit that kills its worker each time (say, a sample that runs it out of memory) is tried 3 times,
    then the run fails naming it: it does not kill worker after worker for ever."""
    from omnipack.executors.ray import UNIT_TRIES, RayExecutor

    with RayExecutor(workers=2) as ex, pytest.raises(RuntimeError, match=f"unit 1 lost its worker {UNIT_TRIES} times"):
        list(ex.map(unit_1_kills_its_worker, None, list(range(4))))


def test_a_stage_counts_units_as_they_finish_and_keeps_their_order(local_ray, tmp_path):
    """Unit 0 ends last (it waits for units 1-4): the bar counts units 1-4 while it runs (not after it), records
    stay in unit order."""
    from omnipack.executors.ray import RayExecutor
    from omnipack.pipeline import _run_units
    from omnipack.progress import StageProgress

    units = list(range(5))
    with RayExecutor(workers=2) as ex:
        assert ex.wait_for_workers(120) == 2
        bar = StageProgress("measure", {u: 1 for u in units}, "samples", enabled=False)
        finished: list[int] = []
        finish = bar.finish
        first, second = tmp_path / "first", tmp_path / "second"
        first.mkdir(), second.mkdir()

        def counted(unit: int) -> None:  # unit 0 ends only after the bar has counted the others
            finished.append(unit)
            finish(unit)
            (first / f"done-{unit}").touch()

        bar.finish = counted
        assert _run_units(ex, last_to_finish, (str(first), False), units, bar) == units
        assert sorted(finished) == units and finished[-1] == 0 and bar.count == 5
        assert list(ex.map(last_to_finish, (str(second), True), units)) == units


def test_more_workers_than_cpus_are_capped_with_a_warning(
    local_ray, tmp_path, reference, demo_tokenizer, demo_corpus, capfd
):
    """The README's --workers 512 on a 2-CPU cluster: 2 workers and a warning, not a unit bound to an actor
    that is never placed."""
    out = tmp_path / "capped"
    cfg = demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=512, part_lines=8)
    finishes_within(600, lambda: run_prepare(cfg))
    assert "--workers 512 is more than the cluster's 2 CPUs: running 2 workers" in capfd.readouterr().err
    assert dataset_bytes(out) == reference


def test_a_worker_the_cluster_cannot_place_holds_no_unit(local_ray, monkeypatch, capfd):
    """Other jobs hold the cluster's CPUs: the run says it waits for a worker, and once one CPU is free the
    one worker placed runs every unit (none is bound to the worker that still waits)."""
    import omnipack.executors.ray as ray_executor

    monkeypatch.setattr(ray_executor, "STALL_S", 1.0)
    warn, warned = ray_executor._warn, threading.Event()

    def observed_warn(message: str) -> None:
        warn(message)
        if message.startswith("no worker placed"):
            warned.set()

    monkeypatch.setattr(ray_executor, "_warn", observed_warn)
    holders = [CpuHolder.remote() for _ in range(2)]
    ray.get([h.ping.remote() for h in holders])
    try:
        with ray_executor.RayExecutor(workers=2) as ex:
            # a CPU comes free once the run has said that it waits for one
            killer = threading.Thread(target=lambda: warned.wait(60) and ray.kill(holders[0]), daemon=True)
            killer.start()
            pids = finishes_within(180, lambda: list(ex.map(pid_of, None, list(range(6)))))
            killer.join()
            assert len(pids) == 6 and len(set(pids)) == 1  # the one placed worker ran them all
            assert len(ex.worker_pids()) == 1
        assert "no worker placed after 1 s (6 units waiting, 0 CPUs free in the cluster)" in capfd.readouterr().err
    finally:
        for h in holders:
            ray.kill(h)


def test_an_actor_gets_the_spec_once_and_keeps_its_context_for_every_unit(local_ray):
    from omnipack.executors.ray import RayExecutor
    from tests.test_executor import CountedSpec, kept_object, spec_loads

    with RayExecutor(workers=2) as ex:
        results = list(ex.map(spec_loads, CountedSpec(list(range(10000))), list(range(12))))
        kept = list(ex.map(kept_object, "thing", list(range(12))))  # another stage on the same actors
    assert all(n == 10000 for _, _, n in results)
    per_actor: dict[int, int] = {}
    for pid, loads, _ in results:
        per_actor[pid] = max(per_actor.get(pid, 0), loads)
    assert per_actor and set(per_actor.values()) == {1}
    objects: dict[int, set[int]] = {}
    for pid, obj in kept:
        objects.setdefault(pid, set()).add(obj)
    assert objects and all(len(o) == 1 for o in objects.values()), objects  # made once per actor


def measured_on_actor(spec, unit, context):
    """Measures part ``unit`` (the measure stage's unit function); the actor's pid, its measurer's tokenizer
    fingerprint, and whether the actor imported ``AutoTokenizer``'s module (a tokenizer load of its own)."""
    import sys

    from omnipack.stages.measure import measure_part, worker_measurer
    from omnipack.stages.tokenizer_facts import TOKENIZER_OFFER, tokenizer_offer_key

    record = measure_part(spec, unit, context)
    measurer = worker_measurer(context, spec.measure, spec.model, spec.model_options)  # the one measure_part made
    assert measurer.chat.tokenizer is context.offered(TOKENIZER_OFFER, tokenizer_offer_key(spec.model))
    auto = "transformers.models.auto.tokenization_auto" in sys.modules
    return os.getpid(), measurer.chat.fingerprint(), auto, record.measured


def test_actors_measure_with_the_tokenizer_the_driver_loaded(local_ray, tmp_path, demo_tokenizer, demo_corpus):
    """The driver loads the tokenizer for the run's facts and sends it to the actors: they measure with it
    (the same fingerprint) and never load one of their own (importing transformers' Auto classes and torch:
    1.6 s of CPU an actor)."""
    from omnipack.executors.ray import RayExecutor
    from omnipack.pipeline import build_spec

    with RayExecutor(workers=2) as ex:
        spec = build_spec(demo_config(tmp_path / "out", demo_tokenizer, demo_corpus, part_lines=16), ex)
        assert ex.wait_for_workers(120) == 2
        results = list(ex.map(measured_on_actor, spec, [p.number for p in spec.parts]))
    assert len({pid for pid, *_ in results}) == 2  # both actors measured
    assert {fingerprint for _, fingerprint, _, _ in results} == {spec.facts.tokenizer_fingerprint}
    assert not any(auto for _, _, auto, _ in results)
    assert sum(n for *_, n in results) > 0


def test_an_offer_is_fetched_once_and_one_that_cannot_be_unpickled_is_none_with_a_line(local_ray, capfd):
    import pickle

    from omnipack.executors.ray import _fetch_offer
    from omnipack.stages.worker import WorkerContext

    context, fetches = WorkerContext(), []
    sent = ray.put(pickle.dumps({"a": 1}))
    context.offer("thing", "k", lambda: fetches.append(1) or _fetch_offer("thing", sent))
    assert context.offered("thing", "k") == {"a": 1} and context.offered("thing", "k") == {"a": 1}
    assert fetches == [1]
    assert context.offered("thing", "another key") is None
    # a class of a module this node does not have (same length: the pickle stays well formed)
    missing = pickle.dumps(WorkerContext()).replace(b"omnipack.stages.worker", b"omnipack.stages.nosuch")
    context.offer("thing", "missing class", lambda: _fetch_offer("thing", ray.put(missing)))
    assert context.offered("thing", "missing class") is None
    assert "the driver's thing did not arrive on this worker (ModuleNotFoundError" in capfd.readouterr().err


def test_the_cli_says_which_cluster_it_is_on_and_joins_none_unasked(
    local_ray, tmp_path, reference, demo_tokenizer, demo_corpus
):
    """Without --ray-address a run joins the cluster in RAY_ADDRESS, and otherwise starts its own: not the one
    Ray's default would join, the cluster last started on the machine (its address in RAY_TMPDIR's
    ``ray/ray_current_cluster``). Each says where it runs, with the cluster's address and CPUs."""
    import tempfile

    address = ray.get_runtime_context().gcs_address
    runs = {}
    with tempfile.TemporaryDirectory(prefix="rt", dir="/tmp") as ray_tmp:  # short: Ray's socket paths go here
        os.makedirs(os.path.join(ray_tmp, "ray"))
        with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
            f.write(address)  # the machine's "current" cluster, as `ray start` leaves it
        clean = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        for name, extra in (("joined", {"RAY_ADDRESS": address}), ("own", {"RAY_TMPDIR": ray_tmp})):
            out = tmp_path / name
            args = [*cli_args(demo_config(out, demo_tokenizer, demo_corpus, workers=2)), "--executor", "ray"]
            # the command in a child of its own, forked from the warm server (no torch import for each)
            runs[name] = run = run_omnipack(args, {**clean, **extra}, timeout=600)
            assert run.returncode == 0, run.stderr
            assert dataset_bytes(out) == reference
    assert f"ray: joined the Ray cluster at {address}: 2 CPUs on 1 node(s)" in runs["joined"].stderr
    own = [line for line in runs["own"].stderr.splitlines() if "ray: " in line]
    assert own and "ray: started a local Ray cluster at " in own[0] and address not in own[0], own


def test_verify_source_on_ray_finds_what_the_local_check_finds(local_ray, demo_reference, tmp_path, monkeypatch):
    """``verify --source`` with ``executor="ray"`` (2 actors, input parts of 8 records): on the intact demo
    dataset it re-derives as many samples as the local check and passes; on a self-consistently damaged copy
    it reports the local check's difference. The actors measure with the tokenizer the check loaded."""
    import omnipack.tools.verify_source as vs
    from tests.test_verify_source import _damage_row, _damage_text_token
    from tests.tools_dataset import copy_dataset

    offered = recorded_offers(monkeypatch)
    monkeypatch.setattr(vs, "PART_LINES", 8)
    local = vs.run_source_check(demo_reference)
    on_ray = vs.run_source_check(demo_reference, executor="ray", workers=2)
    assert local[0] == [] and on_ray == local and " 0 of " not in local[1][-1], local
    assert offered == ["tokenizer"]

    ds = copy_dataset(demo_reference, tmp_path / "ds")
    where = _damage_row(ds, _damage_text_token)  # another token of a sample's own text
    local = vs.run_source_check(ds)
    on_ray = vs.run_source_check(ds, executor="ray", workers=2)
    assert len(local[0]) == 1 and f"sample {where['sid']} " in local[0][0] and "tokens differs" in local[0][0]
    assert on_ray == local


# The tests below shut the module's Ray down (each starts a cluster of its own): every test on the module's
# cluster (``local_ray``) comes before them, or it would start clusters of its own too (seconds each).


def test_two_node_cluster_gives_the_bytes_of_a_local_run(tmp_path, reference, demo_tokenizer, demo_corpus, capfd):
    from ray.cluster_utils import Cluster

    from omnipack.executors.ray import RayExecutor

    ray.shutdown()  # the module's one-node Ray (if it ran): this test starts its own cluster
    head = {"num_cpus": 1, "include_dashboard": False, "_system_config": {"worker_niceness": 0}}  # as a run's own
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=1)
    try:
        cluster.wait_for_nodes()
        with RayExecutor(workers=2, address=cluster.address) as ex:
            assert ex.wait_for_workers(120) == 2
            assert len(set(ex.map(node_of, None, [0, 1]))) == 2  # one actor on each node
        # the run says which cluster it joined
        assert f"joined the Ray cluster at {cluster.address}: 2 CPUs on 2 node(s)" in capfd.readouterr().err
        ray.init(address=cluster.address)
        out = tmp_path / "cluster"
        run_prepare(demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=2))
        assert dataset_bytes(out) == reference
    finally:
        ray.shutdown()
        cluster.shutdown()


def import_path_and_env(spec, unit, context):
    """A unit function that reports the import path its worker got and the runtime env it runs in."""
    return os.environ.get("PYTHONPATH"), dict(ray.get_runtime_context().runtime_env)


def test_a_run_starts_its_cluster_while_the_driver_splits_the_input(
    tmp_path, reference, demo_tokenizer, demo_corpus, monkeypatch
):
    """The cluster's start (seconds: its processes, then the actors') overlaps the driver's split of the input
    and its tokenizer load: a run that starts its own cluster is already splitting while Ray still starts."""
    import omnipack.pipeline as pipeline

    ray.shutdown()  # the module's one-node Ray (if it ran): this run starts its own cluster
    ray_init = ray.init
    init_called, split_started = threading.Event(), threading.Event()

    def slow_init(*args, **kwargs):  # a cluster slower to start than the split: it starts once the split has
        init_called.set()
        split_started.wait(60)
        return ray_init(*args, **kwargs)

    build_spec = pipeline.build_spec
    starting_at_split: list[bool] = []  # the cluster's start under way (begun, not done) when the split begins

    def split(cfg, executor=None):
        starting_at_split.append(init_called.wait(10) and not ray.is_initialized())
        split_started.set()
        return build_spec(cfg, executor)

    monkeypatch.setattr(ray, "init", slow_init)
    monkeypatch.setattr(pipeline, "build_spec", split)
    out = tmp_path / "ray"
    try:
        run_prepare(demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=2))
        assert not ray.is_initialized()  # the cluster the run started is gone with the run
    finally:
        ray.shutdown()
    assert starting_at_split == [True]
    assert dataset_bytes(out) == reference


def test_a_cluster_of_its_own_gives_the_actors_the_import_path_and_ends_without_waiting_on_its_monitor(monkeypatch):
    """One cluster the run starts (a start costs seconds: one serves every check here):
    - it inherits the driver's environment (PYTHONPATH: the same omnipack); a runtime_env would make every actor
      wait for a worker started for it instead of one started in advance;
    - it has a CPU per worker, not one per core (Ray starts a Python worker per CPU in advance), and its workers
      run at the driver's priority;
    - ``ray.shutdown`` gives each of the cluster's processes a second to exit on SIGTERM, one after another, and
      the autoscaler monitor never exits in it: the executor ends the monitor first (every run saved 1 s of a
      ~8 s run), and after the close none of the cluster's processes is left;
    - ``ray.init`` looks the new node up only once its raylet has registered (Ray's own lookup sleeps a whole
      second when it is early), and Ray's lookup is its own again after the start."""
    from ray._private import ray_constants, services

    import omnipack.executors.ray as ray_executor
    from omnipack.executors.ray import RayExecutor

    ray.shutdown()
    get_node = services.get_node
    node_registered = ray_executor._node_registered
    registered: list[bool] = []

    def observed_node_registered(*args):
        registered.append(node_registered(*args))
        return registered[-1]

    monkeypatch.setattr(ray_executor, "_node_registered", observed_node_registered)
    # the import path the driver runs with (a checkout on PYTHONPATH, as a developer's), which actors inherit
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    shutdown = ray.shutdown
    at_shutdown: dict[str, list] = {}

    def observed_shutdown(*args, **kwargs):
        node = ray._private.worker._global_node
        if node is not None and not at_shutdown:  # the executor's close (not the clean-up below)
            at_shutdown.update({kind: [i.process for i in infos] for kind, infos in node.all_processes.items()})
            at_shutdown["monitor running"] = [
                i.process.poll() is None for i in node.all_processes[ray_constants.PROCESS_TYPE_MONITOR]
            ]
        return shutdown(*args, **kwargs)

    monkeypatch.setattr(ray, "shutdown", observed_shutdown)
    try:
        with RayExecutor(workers=1, address="local") as ex:
            assert ex.workers == 1 and ray.cluster_resources()["CPU"] == 1
            seen = {(path, "env_vars" in env) for path, env in ex.map(import_path_and_env, None, [0, 1, 2, 3])}
            niceness = set(ex.map(niceness_of, None, [0, 1]))
            gcs, node_id = ray.get_runtime_context().gcs_address, ray.get_runtime_context().get_node_id()
            # a node that never registers: the wait gives up at its timeout (Ray's own wait then takes over)
            assert not node_registered(gcs, "ff" * 28, 0.1) and node_registered(gcs, node_id, 0.1)
    finally:
        shutdown()
    assert registered == [True] and services.get_node is get_node
    assert seen == {(os.environ["PYTHONPATH"], False)}
    # the actors run at the driver's priority (Ray's default would be nice 15: starved by any other work)
    assert niceness == {os.nice(0)}
    assert at_shutdown["monitor running"] == [False]  # ended before ray.shutdown began
    processes = [p for kind, ps in at_shutdown.items() if kind != "monitor running" for p in ps]
    assert processes and all(p.poll() is not None for p in processes)
