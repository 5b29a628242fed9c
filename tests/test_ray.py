"""The Ray executor: the same units on Ray actors give the bytes of a local run, on one node (a local
Ray with 2 CPUs, started once for the module) and on a simulated cluster of two nodes."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from omnipack.pipeline import run_prepare  # noqa: E402
from tests.stage_outputs import dataset_bytes, demo_config  # noqa: E402


def node_of(spec, unit):
    """A unit function that reports where it ran."""
    return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_tokenizer, demo_corpus):
    out = tmp_path_factory.mktemp("reference")
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus))
    return dataset_bytes(out)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def test_ray_actors_give_the_bytes_of_a_local_run(local_ray, tmp_path, reference, demo_tokenizer, demo_corpus):
    out = tmp_path / "ray"
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=2))
    assert dataset_bytes(out) == reference
    assert ray.is_initialized()  # a Ray the caller started stays up


def test_an_actor_gets_the_spec_once_not_with_every_unit(local_ray):
    from omnipack.executors.ray import RayExecutor
    from tests.test_executor import CountedSpec, spec_loads

    with RayExecutor(workers=2) as ex:
        results = list(ex.map(spec_loads, CountedSpec(list(range(10000))), list(range(12))))
    assert all(n == 10000 for _, _, n in results)
    per_actor: dict[int, int] = {}
    for pid, loads, _ in results:
        per_actor[pid] = max(per_actor.get(pid, 0), loads)
    assert per_actor and set(per_actor.values()) == {1}


def test_two_node_cluster_gives_the_bytes_of_a_local_run(tmp_path, reference, demo_tokenizer, demo_corpus):
    from ray.cluster_utils import Cluster

    from omnipack.executors.ray import RayExecutor

    ray.shutdown()  # the module's one-node Ray (if it ran): this test starts its own cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        with RayExecutor(workers=2) as ex:
            assert len(set(ex.map(node_of, None, [0, 1]))) == 2  # one actor on each node
        out = tmp_path / "cluster"
        run_prepare(demo_config(out, demo_tokenizer, demo_corpus, executor="ray", workers=2))
        assert dataset_bytes(out) == reference
    finally:
        ray.shutdown()
        cluster.shutdown()
