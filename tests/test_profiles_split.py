"""A family is one module: a planner and its trainer half, found by name, the trainer half light.

The trainer half (``EncoderInputs``) is built from the settings the planner records and needs none of the
prepare stack: a subprocess with transformers, PyAV, decord, tokenizers (and pillow, for omnipack's own
imports) blocked builds every family's encoder inputs, equal to the full install's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from omnipack.profiles import (
    PROFILES,
    available_profiles,
    get_encoder_inputs,
    get_profile,
    profile_class,
)
from omnipack.profiles.base import ModelProfile
from omnipack.profiles.model_inputs import EncoderInputs
from tests.family_kit import encode_payloads

ROOT = Path(__file__).parents[1]
# discovered: every native family module (the processor-backed ``hf`` needs a model folder: test_profile_hf.py)
FAMILIES = [n for n in available_profiles() if not profile_class(n).processor_backed]


def test_registry_resolves_names_to_their_modules():
    assert sorted(PROFILES) == available_profiles() and len(PROFILES) == len(available_profiles())
    # the shipped families are found (a broken module would silently drop out of the kit)
    assert {"gemma3", "nemotron_omni", "qwen2_5_vl", "qwen3_omni", "qwen3_vl"} <= set(FAMILIES)
    assert set(available_profiles()) - set(FAMILIES) == {"hf"}  # the processor-backed profile, by its flag
    for name in available_profiles():
        cls = profile_class(name)
        assert cls.name == name and cls.__module__ == f"omnipack.profiles.{name}"
        assert issubclass(cls.inputs_class, EncoderInputs) and cls.inputs_class.name == name
        assert set(cls().kinds) <= set(cls.inputs_class.placeholder_tokens)
    for bad in ("base", "model_inputs", "qwen_vl", "audio_features", "nope", "../x", "Qwen3_VL", ""):
        with pytest.raises(ValueError, match=f"unknown profile .*available: {', '.join(available_profiles())}$"):
            get_profile(bad)


def test_a_new_family_is_one_module(tmp_path, monkeypatch):
    """A module that appears on the package path is a profile by that name; nothing else is edited."""
    import omnipack.profiles as profiles

    (tmp_path / "toy_family.py").write_text(
        textwrap.dedent(
            """
            from omnipack.profiles.base import ModelProfile, Segment
            from omnipack.profiles.model_inputs import EncoderInputs, payload_frames

            class ToyInputs(EncoderInputs):
                name = "toy_family"
                placeholder_tokens = {"image": ("<img>",)}
                batch_keys = ("pixels",)
                pixel_keys = ("pixels",)

                def __init__(self, settings):
                    super().__init__(settings)
                    self.tokens_per_image = int(settings["tokens_per_image"])

                def feature_count(self, item, payload):
                    return self.tokens_per_image

                def media_inputs(self, item, payload, options):
                    return {"pixels": payload_frames(payload).reshape(1, -1)}

            class ToyProfile(ModelProfile):
                name = "toy_family"
                inputs_class = ToyInputs
                turn_start = "<start_of_turn>"
                template_blocks = {"image": ("<img>",)}

                def expand(self, plan):
                    return [Segment(token="<img>", count=plan.num_tokens, placeholder=True)]

                def settings(self):
                    return {"tokens_per_image": 4}

            PROFILE = ToyProfile
            """
        )
    )
    monkeypatch.setattr(profiles, "__path__", [*profiles.__path__, str(tmp_path)])
    monkeypatch.delitem(sys.modules, "omnipack.profiles.toy_family", raising=False)
    assert "toy_family" in available_profiles()
    toy = get_profile("toy_family")
    assert not toy.uses_mrope() and toy.turn_start == "<start_of_turn>"
    inputs = get_encoder_inputs("toy_family", toy.settings())
    assert inputs.feature_count({"kind": "image"}, np.zeros((2, 2, 3), np.uint8)) == 4
    assert inputs.batch_keys == ("pixels",)
    with pytest.raises(ValueError, match="recorded settings lack 'tokens_per_image'"):
        get_encoder_inputs("toy_family", {})
    # omnipack inspect finds this family's turns by its own marker
    from types import SimpleNamespace

    from omnipack.tools.inspect import _turn_start

    assert _turn_start(SimpleNamespace(meta={"profile": {"name": "toy_family"}})) == "<start_of_turn>"
    assert _turn_start(SimpleNamespace(meta={"profile": {"name": "qwen3_vl"}})) == "<|im_start|>"
    assert _turn_start(SimpleNamespace(meta={})) is None


def test_family_facts_live_in_the_profile():
    """What used to be chosen by profile name elsewhere (CLI mRoPE default, inspect's role marker)."""
    mrope = {"gemma3": False, "nemotron_omni": False, "qwen2_5_vl": True, "qwen3_omni": True, "qwen3_vl": True}
    assert {n: profile_class(n).uses_mrope() for n in mrope} == mrope
    assert profile_class("gemma3").turn_start == "<start_of_turn>"
    assert {profile_class(n).turn_start for n in mrope if n != "gemma3"} == {"<|im_start|>"}
    keys = {n: profile_class(n).inputs_class.batch_keys for n in FAMILIES}
    assert "image_grid_hw" in keys["nemotron_omni"] and "image_grid_thw" not in keys["nemotron_omni"]
    assert "second_per_grid_ts" in keys["qwen2_5_vl"] and "video_second_per_grid" in keys["qwen3_omni"]
    assert not {"input_features", "second_per_grid_ts"} & set(keys["qwen3_vl"])


@pytest.mark.parametrize("name", FAMILIES)
def test_trainer_half_is_built_from_recorded_settings(name):
    """The loader's encoder inputs (from omnipack.json's JSON settings) equal the planner's own."""
    planner = get_profile(name)
    recorded = json.loads(json.dumps(planner.settings()))
    a = encode_payloads(get_encoder_inputs(name, recorded), name)
    b = encode_payloads(planner.inputs(), name)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert set(a) - {"_counts"} <= set(planner.inputs_class.batch_keys)
    missing = dict(recorded)
    missing.pop(next(iter(missing)))
    with pytest.raises(ValueError, match="recorded settings lack"):
        get_encoder_inputs(name, missing)


BLOCKER = """
import sys
BLOCKED = ("transformers", "av", "decord", "tokenizers", "soundfile", "soxr")

def importer():
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith("<frozen") or f.f_globals.get("__name__") == "__main__"):
        f = f.f_back
    return "" if f is None else str(f.f_globals.get("__name__", ""))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in BLOCKED or (top in ("PIL", "jinja2") and importer().startswith("omnipack")):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

sys.meta_path.insert(0, Blocker())
"""


def test_trainer_half_imports_without_the_prepare_stack(tmp_path):
    """In a process where the prepare stack cannot be imported: the task encoder imports no family, and each
    family's trainer half (audio features included) gives what the full install gives."""
    settings = {n: get_profile(n).settings() for n in FAMILIES}
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    code = BLOCKER + textwrap.dedent(
        f"""
        import json
        import numpy as np
        import omnipack.loader.task_encoder
        from tests.family_kit import encode_payloads
        settings = json.load(open({str(tmp_path / "settings.json")!r}))
        fams = {{f"omnipack.profiles.{{n}}" for n in settings}}
        assert not fams & set(sys.modules), sorted(fams & set(sys.modules))
        from omnipack.profiles import get_encoder_inputs
        for n in settings:
            before = fams & set(sys.modules)
            out = encode_payloads(get_encoder_inputs(n, settings[n]), n)
            assert (fams & set(sys.modules)) - before == {{f"omnipack.profiles.{{n}}"}}
            np.savez({str(tmp_path)!r} + f"/{{n}}.npz", **out)
        bad = [m for m in sys.modules if m.split(".")[0] in ("transformers", "av", "decord", "tokenizers")]
        assert not bad, bad
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    for n in FAMILIES:
        got = dict(np.load(tmp_path / f"{n}.npz"))
        want = encode_payloads(get_profile(n).inputs(), n)
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want), n


def test_the_blocker_catches_a_prepare_import(tmp_path):
    """The subprocess check can fail: a trainer path that imports transformers is refused there."""
    code = BLOCKER + "import omnipack.loader.task_encoder\nimport transformers\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "No module named 'transformers' (blocked)" in out.stderr
    code = (
        BLOCKER
        + "import omnipack.profiles\nfrom omnipack.loader.media import decode_payload\n"
        + ("import io, numpy as np\ndecode_payload('x.png', b'')\n")
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "No module named 'PIL' (blocked)" in out.stderr


def test_planner_and_trainer_halves_are_separate_classes():
    for n in FAMILIES:
        cls = profile_class(n)
        for method in ("feature_count", "media_inputs", "collate_media"):
            assert not hasattr(cls, method), f"{n} planner still has {method}"
        for method in ("plan", "expand", "settings"):
            assert not hasattr(cls.inputs_class, method), f"{n} trainer half has {method}"
        assert issubclass(cls, ModelProfile)


def test_planner_half_imports_no_trainer_stack():
    """Planning every native family imports neither torch nor Energon / megatron (the trainer's heavy stack);
    the processor-backed profile runs the model's transformers processor by design."""
    code = (
        "import sys\n"
        "from omnipack.profiles import MediaMeta, available_profiles, get_profile, profile_class\n"
        "for n in available_profiles():\n"
        "    if profile_class(n).processor_backed: continue\n"
        "    p = get_profile(n)\n"
        "    p.plan(MediaMeta(kind='image', height=300, width=400)); p.settings()\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'transformers'})\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_packed_batch_names_no_family_field():
    """PackedBatch is not a union of families' forward arguments: encoder inputs are a dict keyed by the
    family's ``batch_keys``."""
    import dataclasses

    from omnipack.loader.task_encoder import PackedBatch

    fields = {f.name for f in dataclasses.fields(PackedBatch)}
    every_key = {k for n in FAMILIES for k in profile_class(n).inputs_class.batch_keys}
    assert "encoder_inputs" in fields and not fields & every_key
