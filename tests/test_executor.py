"""The stage executor: the same results in unit order inline and on a pool; workers end with their parent."""

from __future__ import annotations

import os

from omnipack.executors.local import LocalExecutor


def _unit(spec, unit, context):
    return spec * unit


def test_local_executor_runs_units_in_unit_order_inline_and_on_a_pool():
    units = list(range(12))
    with LocalExecutor(1) as inline, LocalExecutor(2) as pool:
        assert list(inline.map(_unit, 3, units)) == list(pool.map(_unit, 3, units)) == [3 * u for u in units]
        assert list(pool.map(_unit, 2, units[:3])) == [0, 2, 4]  # the pool serves several stages


def cpus_of_worker(spec, unit, context):
    return context.cpus


def test_a_worker_is_given_its_share_of_the_cpus():
    """The threads a unit starts stay within its worker's share (``WorkerContext.cpus``): all of this
    process's CPUs inline, an even split on a pool (at least one each)."""
    from omnipack.executors.base import available_cpus

    with LocalExecutor(1) as inline, LocalExecutor(2) as pool:
        assert list(inline.map(cpus_of_worker, None, [0])) == [available_cpus()]
        assert set(pool.map(cpus_of_worker, None, list(range(6)))) == {max(1, available_cpus() // 2)}


def test_available_cpus_keep_within_the_affinity_mask_and_the_containers_quota(monkeypatch, tmp_path):
    from omnipack.executors.base import available_cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert available_cpus(tmp_path) == 16  # no cgroup files: the mask
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path) == 16  # no quota
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert available_cpus(tmp_path) == 3  # 2.5 CPUs' worth of time: 3 threads
    (tmp_path / "cpu.max").write_text("3200000 100000\n")
    assert available_cpus(tmp_path) == 16  # a quota above the mask
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(tmp_path) == 4  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cpus(tmp_path) == 16  # v1 without a quota


class CountedSpec:
    """A spec that counts how often this process unpickled one."""

    loads = 0

    def __init__(self, payload: list[int]) -> None:
        self.payload = payload

    def __setstate__(self, state: dict) -> None:
        CountedSpec.loads += 1
        self.__dict__.update(state)


def spec_loads(spec, unit, context):
    import os

    return os.getpid(), CountedSpec.loads, len(spec.payload)


def test_the_spec_goes_to_each_worker_once_not_with_every_unit():
    spec = CountedSpec(list(range(10000)))  # a large input's parts make the spec megabytes
    with LocalExecutor(2) as pool:
        results = list(pool.map(spec_loads, spec, list(range(24))))
        assert all(n == 10000 for _, _, n in results)
        per_worker: dict[int, int] = {}
        for pid, loads, _ in results:
            per_worker[pid] = max(per_worker.get(pid, 0), loads)
        assert per_worker and set(per_worker.values()) == {1}
        assert [n for _, _, n in pool.map(spec_loads, CountedSpec([1, 2]), [0, 1])] == [2, 2]  # a new spec


def kept_object(spec, unit, context):
    """The worker's process id and the object its context keeps for (``spec``, "one"), made on first use."""
    import os

    return os.getpid(), id(context.kept(spec, "one", object))


def test_a_worker_keeps_its_context_for_all_the_units_and_stages_it_runs():
    with LocalExecutor(1) as inline, LocalExecutor(2) as pool:
        for ex in (inline, pool):
            first = list(ex.map(kept_object, "thing", list(range(12))))
            later = list(ex.map(kept_object, "thing", list(range(4))))  # another stage on the same workers
            by_worker: dict[int, set[int]] = {}
            for pid, kept in first + later:
                by_worker.setdefault(pid, set()).add(kept)
            assert all(len(kept) == 1 for kept in by_worker.values()), by_worker  # one object per worker
        # the inline units run in this process, on the executor's own context
        assert {pid for pid, _ in inline.map(kept_object, "thing", [0])} == {os.getpid()}
    other = LocalExecutor(1)  # another executor (a new run): a context of its own
    assert list(other.map(kept_object, "thing", [0])) != list(inline.map(kept_object, "thing", [0]))


# this process's Measurer constructions (set up in each pool worker by its first ``measured_by`` unit)
MEASURERS_BUILT: list[int] = []


def count_measurers() -> None:
    """From now on, this process counts the Measurers it builds in ``MEASURERS_BUILT``."""
    from omnipack.stages import measure

    if getattr(measure.Measurer, "counted", False):
        return
    real = measure.Measurer

    class Counted(real):
        counted = True

        def __init__(self, *args, **kwargs) -> None:
            MEASURERS_BUILT.append(os.getpid())
            super().__init__(*args, **kwargs)

    measure.Measurer = Counted


def measured_by(spec, unit, context):
    """Measures part ``unit`` (the measure stage's unit function); the worker's pid and how many Measurers it
    has built so far."""
    from omnipack.stages.measure import measure_part

    count_measurers()
    record = measure_part(spec, unit, context)
    return os.getpid(), len(MEASURERS_BUILT), record.measured


def test_a_worker_builds_its_measurer_once_for_all_the_parts_it_measures(
    tmp_path, demo_tokenizer, demo_corpus, monkeypatch
):
    """The tokenizer is loaded once per worker and run, not once per unit: inline and on pool workers."""
    from omnipack.pipeline import build_spec
    from omnipack.stages import measure
    from tests.stage_outputs import demo_config

    monkeypatch.setattr(measure, "Measurer", measure.Measurer)  # undone after the test: count_measurers swaps it
    count_measurers()
    MEASURERS_BUILT.clear()
    spec = build_spec(demo_config(tmp_path / "inline", demo_tokenizer, demo_corpus, part_lines=8))
    units = [p.number for p in spec.parts]
    assert len(units) >= 6
    with LocalExecutor(1) as inline:
        measured = [n for _, _, n in inline.map(measured_by, spec, units)]
    assert [os.getpid()] == MEASURERS_BUILT  # one Measurer for all the parts

    spec = build_spec(demo_config(tmp_path / "pool", demo_tokenizer, demo_corpus, part_lines=8))
    with LocalExecutor(2) as pool:
        results = list(pool.map(measured_by, spec, units))
    assert [n for _, _, n in results] == measured
    built: dict[int, int] = {}
    for pid, count, _ in results:
        built[pid] = max(built.get(pid, 0), count)
    assert os.getpid() not in built and set(built.values()) == {1}, built  # one per worker, whatever it ran


def test_a_worker_measures_with_an_offered_tokenizer_and_loads_its_own_without_a_usable_one(
    tmp_path, demo_tokenizer, demo_corpus
):
    """The tokenizer offered for the run's shipped files (and these library versions) is the one measured
    with; an offer under another key, or one that could not be fetched (None), leaves the worker to load the
    same tokenizer itself."""
    from omnipack.pipeline import build_spec
    from omnipack.stages.measure import worker_measurer
    from omnipack.stages.tokenizer_facts import TOKENIZER_OFFER, tokenizer_offer_key
    from omnipack.stages.worker import WorkerContext
    from omnipack.text.chat import load_tokenizer
    from tests.stage_outputs import demo_config

    spec = build_spec(demo_config(tmp_path / "out", demo_tokenizer, demo_corpus))
    offered = load_tokenizer(demo_tokenizer)
    key = tokenizer_offer_key(spec.model)
    taken = WorkerContext()
    taken.offer(TOKENIZER_OFFER, key, lambda: offered)
    assert worker_measurer(taken, spec.measure, spec.model).chat.tokenizer is offered
    for offer_key, fetch in ((key, lambda: None), ("other files or versions", lambda: offered)):
        context = WorkerContext()
        context.offer(TOKENIZER_OFFER, offer_key, fetch)
        measurer = worker_measurer(context, spec.measure, spec.model)
        assert measurer.chat.tokenizer is not offered
        assert measurer.chat.fingerprint() == spec.facts.tokenizer_fingerprint


def blocking_unit(marker_dir, unit, context):
    """Signals that it runs, then blocks (until the test kills the run)."""
    import pathlib
    import time

    (pathlib.Path(marker_dir) / f"unit-{unit}").touch()
    time.sleep(120)


def test_a_killed_runs_spec_file_is_removed_by_the_next_run(tmp_path):
    """The pool's spec file lives in the run's staging folder: after ``kill -9`` of the run it is left, and
    the next run that starts a pool removes it (it used to stay in /tmp for good)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    tmp, markers = tmp_path / "tmp", tmp_path / "markers"
    tmp.mkdir()
    markers.mkdir()
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": path}
    run = (
        "import sys\nfrom omnipack.executors.local import LocalExecutor\nfrom tests import test_executor as t\n"
        "with LocalExecutor(2) as ex:\n    print(list(ex.map(getattr(t, sys.argv[1]), sys.argv[2], [0, 1])))\n"
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", run, "blocking_unit", str(markers)], env=env, cwd=root, start_new_session=True
    )
    try:
        end = time.monotonic() + 120
        while not any(markers.iterdir()) and time.monotonic() < end and killed.poll() is None:
            time.sleep(0.2)
        assert any(markers.iterdir()), "the pool never started a unit"
    finally:
        os.killpg(killed.pid, signal.SIGKILL)  # the run and its workers, as the OOM killer or a scheduler would
        killed.wait()
    assert list(tmp.rglob("omnipack-spec-*"))  # left behind by the killed run
    done = subprocess.run(
        [sys.executable, "-c", run, "_unit", "3"], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "['', '3']", done.stderr
    assert list(tmp.rglob("omnipack-spec-*")) == []


ORPHANS = """
import os, sys, time
from omnipack.executors.local import LocalExecutor


def pid_of_worker(spec, unit, context):
    time.sleep(0.2)  # long enough that every worker takes a unit
    return os.getpid()


if __name__ == "__main__":
    executor = LocalExecutor(2)
    pids = set(executor.map(pid_of_worker, None, list(range(6))))
    print(" ".join(map(str, sorted(pids))), flush=True)
    time.sleep(300)
"""


def test_pool_workers_exit_when_their_parent_is_killed(tmp_path):
    """A main process killed with SIGKILL (or by the OOM killer) takes its pool workers with it: none is
    left holding its memory (they wait for work forever otherwise)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "orphans.py"
    script.write_text(ORPHANS)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in parent.stdout.readline().split()]
    finally:
        parent.kill()
        parent.wait()
    assert len(workers) == 2, workers  # the executor's pool

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie (exited, not yet reaped by init) holds no memory
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"

    deadline = time.monotonic() + 5
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"pool workers {left} outlived their parent"


def torch_threads_unit(spec, unit, context):
    """Work on torch's intra-op thread pool (OpenMP): hangs in a worker forked from a process whose pool ran."""
    import torch

    x = torch.ones(256, 256)
    return float((x @ x).sum() + torch.ones(1 << 20).exp().sum()) > 0, torch.get_num_threads()


def pyarrow_list_unit(spec, unit, context):
    """The top-level modules a worker imports to build its first pyarrow array from a list (as the measure
    tables are built): pyarrow imports pandas there, where installed, unless the fork server did."""
    import sys

    import pyarrow as pa

    before = {m.split(".")[0] for m in sys.modules}
    pa.array([1, None, 3], type=pa.int64())
    return sorted({m.split(".")[0] for m in sys.modules} - before)


def test_pool_workers_run_torch_thread_pools():
    """Pool workers fork from the fork server, which imported torch but never ran its thread pools: a worker
    forked after they ran would hang on its first parallel op. A fresh process, so that a hang fails in time.
    The server imported what the units' pyarrow tables import (pandas), so no worker imports it again."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    run = (
        "from omnipack.executors.local import LocalExecutor\nfrom tests import test_executor as t\n"
        "with LocalExecutor(2) as ex:\n    print(list(ex.map(t.torch_threads_unit, None, [0, 1, 2, 3])))\n"
        "    print('imported:', list(ex.map(t.pyarrow_list_unit, None, [0, 1])))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", run], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("(True,") == 4, done.stdout
    assert "imported: [[], []]" in done.stdout, done.stdout


def test_a_pool_under_a_deep_tmpdir_runs_its_units(tmp_path):
    """The fork server listens on a socket in TMPDIR; under a TMPDIR too deep for an AF_UNIX path (a batch
    scheduler's per-job folder) the pool spawns its workers instead of failing its first unit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from omnipack.executors.local import UNIX_PATH_MAX

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    assert len(os.fsencode(deep)) + len("/pymp-XXXXXXXX/listener-XXXXXXXX") > UNIX_PATH_MAX
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TMPDIR": str(deep), "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    run = (
        "from omnipack.executors.local import LocalExecutor, pool_context\nfrom tests import test_executor as t\n"
        "print(pool_context().get_start_method())\n"
        "with LocalExecutor(2) as ex:\n    print(list(ex.map(t._unit, 3, [0, 1, 2])))\n"
    )
    out = subprocess.run([sys.executable, "-c", run], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    method, results = out.stdout.strip().splitlines()[-2:]
    assert (method, results) == ("spawn", "[0, 3, 6]")
