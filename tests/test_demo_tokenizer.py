"""The demo tokenizer's ids are stable: a family registered later adds its special tokens at new ids after
the trained vocabulary and renumbers none (the demo's dataset bytes are pinned, ``tests/test_demo_bytes.py``)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

TOY = """
from omnipack.profiles.base import ModelProfile, Segment
from omnipack.profiles.model_inputs import EncoderInputs

class ToyInputs(EncoderInputs):
    name = "toy_tokens"
    placeholder_tokens = {"image": ("<toy_image_token>",)}

class ToyProfile(ModelProfile):
    name = "toy_tokens"
    inputs_class = ToyInputs
    template_blocks = {"image": ("<toy_image_token>",)}
    turn_end = "<toy_turn_end>"

    def expand(self, plan):
        return [Segment(token="<toy_image_token>", count=plan.num_tokens, placeholder=True)]

    def settings(self):
        return {}

PROFILE = ToyProfile
"""


def _vocab(path: Path) -> dict[str, int]:
    return json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]


def _added(path: Path) -> dict[str, int]:
    return {t["content"]: t["id"] for t in json.loads((path / "tokenizer.json").read_text())["added_tokens"]}


def test_a_new_familys_tokens_renumber_no_id(tmp_path, monkeypatch):
    import omnipack.profiles as profiles
    from omnipack.demo.tokenizer import build_demo_tokenizer

    before = build_demo_tokenizer(tmp_path / "before")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "toy_tokens.py").write_text(textwrap.dedent(TOY))
    monkeypatch.setattr(profiles, "__path__", [*profiles.__path__, str(tmp_path / "pkg")])
    monkeypatch.delitem(sys.modules, "omnipack.profiles.toy_tokens", raising=False)
    assert "toy_tokens" in profiles.available_profiles()
    after = build_demo_tokenizer(tmp_path / "after")
    old, new = _added(before), _added(after)
    assert {k: v for k, v in new.items() if k in old} == old  # every special token keeps its id
    assert {k: v for k, v in _vocab(after).items() if k in _vocab(before)} == _vocab(before)  # and every merge
    size = max([*_vocab(before).values(), *old.values()]) + 1
    assert sorted(new[t] for t in ("<toy_turn_end>", "<toy_image_token>")) == [size, size + 1]

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(after))
    ids = tok.encode("a<toy_image_token>b<toy_turn_end>", add_special_tokens=False)
    assert new["<toy_image_token>"] in ids and new["<toy_turn_end>"] in ids
    assert "<toy_image_token>" in tok.all_special_tokens
