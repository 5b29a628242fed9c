from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests explore a fixed, reproducible set of examples: CI must not pass or fail by luck.
# (HYPOTHESIS_PROFILE=explore widens the search locally.)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def demo_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from omnipack.demo.tokenizer import build_demo_tokenizer

    return build_demo_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(manifest, media_root) of a 60-sample demo corpus including the deliberately broken samples."""
    from omnipack.demo.corpus import build_demo_corpus

    return build_demo_corpus(tmp_path_factory.mktemp("corpus"), num_samples=60)
