from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests explore a fixed, reproducible set of examples: CI must not pass or fail by luck.
# (HYPOTHESIS_PROFILE=explore widens the search locally.)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# What is alive when a test's body starts (its fixtures included) is frozen (``gc.freeze()``: moved out of every
# collection and out of ``gc.get_objects()``). Energon's loaders run a full ``gc.collect()`` when ``get_loader``
# makes one, when one is read in this process and in each forked loader worker, whose start also walks
# ``gc.get_objects()``: in a pytest worker holding torch, transformers and the session's fixtures each of these
# costs ~0.3 s, ~80 s of the suite's CPU in all. Frozen, they see only what the test made. Garbage that earlier
# tests left in reference cycles is frozen too, until a full collection every FULL_COLLECT_EVERY tests. An
# in-process Energon read (``GcDataset``) freezes what is alive when it starts and unfreezes everything when
# it ends, so every later loader of the same test would collect over the whole process again (~40 s of the
# suite's CPU): during a test's body ``gc.unfreeze`` leaves frozen what is frozen. A collection at each
# module change instead cost ~40 s of the two workers' wall (a full collection that frees garbage takes
# ~0.5 s). A loader iterator left in a cycle is meanwhile out of reach of the walk by which Energon's forked
# workers shut down the iterators they inherit; `SUITE_PROFILE_GC=1` (benchmarks/suite_profile.py), under
# which nothing is frozen, finds such tests.
FULL_COLLECT_EVERY = 50
TESTS_SINCE_COLLECT = pytest.StashKey[int]()
UNFREEZE = gc.unfreeze


def _leave_frozen() -> None:
    """``gc.unfreeze`` during a test's body: what is frozen stays so until the next full collection."""


@pytest.hookimpl(hookwrapper=True, trylast=True)  # inside a profiler's wrapper: the collection is counted
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if os.environ.get("SUITE_PROFILE_GC"):
        yield
        return
    count = item.session.stash.get(TESTS_SINCE_COLLECT, FULL_COLLECT_EVERY)  # the first test collects
    item.session.stash[TESTS_SINCE_COLLECT] = 1 if count >= FULL_COLLECT_EVERY else count + 1
    if count >= FULL_COLLECT_EVERY:
        UNFREEZE()
        gc.collect()
    gc.freeze()
    gc.unfreeze = _leave_frozen
    try:
        yield
    finally:
        gc.unfreeze = UNFREEZE


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnipack.demo.tokenizer import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(manifest, media_root) of a 60-sample demo corpus including the deliberately broken samples."""
    from omnipack.demo.corpus import build_demo_corpus

    return build_demo_corpus(tmp_path_factory.mktemp("corpus"), num_samples=60)


@pytest.fixture(scope="session")
def demo_reference(tmp_path_factory: pytest.TempPathFactory, demo_tokenizer: Path, demo_corpus) -> Path:
    """The demo corpus prepared once, in this process, with ``tests/stage_outputs.demo_config``'s settings:
    the dataset that every other way of running it (staged, resumed, on Ray, to S3) must reproduce byte for
    byte. Shared by those tests: read it, never write into it."""
    from omnipack.pipeline import run_prepare
    from tests.stage_outputs import demo_config

    out = tmp_path_factory.mktemp("demo_reference")
    run_prepare(demo_config(out, demo_tokenizer, demo_corpus))
    return out


# The processor-backed (``hf``) checkpoints of tests/test_profile_hf.py and their prepared datasets, built once
# per family for the session: test_profile_hf.py and test_profile_hf_payload.py both read them.
HF_FAMILIES = ["idefics3", "llava", "llava_next"]


@pytest.fixture(scope="session", params=HF_FAMILIES)
def hf_family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory, hf_family: str) -> Path:
    from tests.test_profile_hf import FAMILIES

    assert sorted(FAMILIES) == HF_FAMILIES  # a family added there is added here
    return FAMILIES[hf_family][0](tmp_path_factory.mktemp(hf_family) / "model")


@pytest.fixture(scope="session")
def hf_prepared(tmp_path_factory: pytest.TempPathFactory, hf_model_dir: Path):
    """(media, samples, dataset) of test_profile_hf.py's corpus prepared with ``--model hf_model_dir``."""
    return prepare_hf_corpus(tmp_path_factory.mktemp("hf_e2e"), hf_model_dir)


@pytest.fixture(scope="module")
def proc(model_dir: Path):
    """The model folder's own processor, as users load it (``AutoProcessor``), for the modules that define a
    ``model_dir`` fixture: the oracle their tests compare against."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model_dir))


def prepare_hf_corpus(root: Path, model_dir: Path, *extra: str, seq_length: int = 1024):
    """(media, samples, dataset): test_profile_hf.py's image corpus under ``root`` prepared with
    ``--model model_dir`` (no ``--profile``: the checkpoint's, or the ``hf`` fallback) and ``extra`` flags."""
    from tests.family_kit import prepare
    from tests.test_profile_hf import _corpus

    manifest, media, samples = _corpus(root / "src")
    out = prepare(
        manifest, media, root / "ds", "--model", str(model_dir), "--seq-length", str(seq_length),
        "--shard-max-rows", "2", *extra,
    )  # fmt: skip
    return media, samples, out


# Parallel runs (``pytest -n 2``, pytest-xdist): tests go to the workers a module at a time, so that each
# module's fixtures (its prepared datasets, S3 server, Ray cluster) are built once, and the modules that
# share a session fixture too expensive to build twice go to the same worker together. The slowest modules
# are sent first: one of them started last would leave the other worker idle at the end.
SHARED_WORKER = {"tests/test_profile_hf_payload.py": "tests/test_profile_hf.py"}  # hf_prepared
SLOWEST_FIRST = [  # by each module's wall and CPU in CI (benchmarks/README.md, Test loop: "Sixth part")
    "tests/test_ray.py",  # still the longest with its actors at the driver's priority (~200 s)
    "tests/test_family_conformance.py",
    "tests/test_gemma3_packed_forward.py",
    "tests/test_energon_tools.py",
    "tests/test_resume.py",
    "tests/test_lock.py",  # two SIGTERM runs of ~24 s wall each
    "tests/test_profile_hf.py",  # with test_profile_hf_payload.py
    "tests/test_loader_buffer_pool.py",
    "tests/test_cli.py",
    "tests/test_loader_energon.py",
    "tests/test_output_s3.py",
    "tests/test_profile_hf_audio.py",
    "tests/test_pipeline_gemma4.py",
    "tests/test_profiles_gemma4.py",
    "tests/test_shipped_tokenizer.py",
    "tests/test_record_memory.py",
    "tests/test_loader_storage.py",
    "tests/test_pipeline_gemma3.py",
    "tests/test_errors.py",
    "tests/test_packing.py",
    "tests/test_loader_contract.py",
    "tests/test_verify_source.py",
    "tests/test_inputs_parts.py",
    "tests/test_token_count.py",
]


def _module_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SHARED_WORKER.get(module, module)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown (and unused) without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _module_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            rank = {m: i for i, m in enumerate(SLOWEST_FIRST)}
            first = min(self.workqueue, key=lambda scope: rank.get(scope, len(rank)))
            self.workqueue.move_to_end(first, last=False)  # ties keep the collection's order (min: first)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)
