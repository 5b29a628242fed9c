"""Native profile vs processor-backed profile on the families whose processors hold a video processor
(transformers builds those only with torchvision): Qwen2.5-VL, Qwen3-VL and Qwen3-Omni, images (issue 23, item 4; the
Gemma 3 pair runs without torchvision in test_profile_hf_native.py). Opt-in (``pytest -m hf_processors``),
skipped where torchvision does not import.

Each model folder (the demo tokenizer of the family, its processor class with the PIL image processor and the
video processor, ``config.json``) is prepared twice from test_profile_hf.py's image corpus: by its native
family (chosen from the checkpoint) and by ``--profile hf`` with ``image_backend=pil`` (the backend the native
families reproduce; with torchvision installed transformers picks its torchvision backend, whose resize rounds
differently). Every sample gets the same token ids and labels, and the loader hands the same ``pixel_values``
(the native family's stored uint8 frames normalized and patched by its trainer half; the processor's float32
patches as stored) and ``image_grid_thw``, bit for bit.

Qwen3-Omni's folder (``Qwen3OmniMoeProcessor``, Whisper features beside the images) is compared the same way,
on images. Nemotron Omni has no hf side to compare: the hf profile refuses its processor at start, with the
reason (``OMNI_REFUSALS``; its native profile prepares the same folder).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import prepare_hf_corpus
from tests.hf_oracles import require_torchvision

pytestmark = pytest.mark.hf_processors
pytest.importorskip("transformers")
pytest.importorskip("megatron.energon")
require_torchvision()

from tests.family_kit import val_batches  # noqa: E402

# family -> (processor class, config class, patch size, video processor class)
FAMILIES = {
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2_5_VLConfig", 14, "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLConfig", 16, "Qwen3VLVideoProcessor"),
}
COMPARED = ("tokens", "labels")  # per sample; pixels and grids per sample's images


def build_qwen_vl_checkpoint(out: Path, family: str) -> Path:
    import transformers

    from omnipack.demo.tokenizer import build_demo_tokenizer

    proc_cls, config_cls, patch, video_cls = FAMILIES[family]
    build_demo_tokenizer(out, profile=family)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    getattr(transformers, proc_cls)(
        image_processor=transformers.Qwen2VLImageProcessorPil(patch_size=patch),
        video_processor=getattr(transformers, video_cls)(patch_size=patch),
        tokenizer=tok,
        chat_template=tok.chat_template,
    ).save_pretrained(out)
    config = getattr(transformers, config_cls)()
    config.architectures = [proc_cls.replace("Processor", "ForConditionalGeneration")]
    config.save_pretrained(out)
    return out


QWEN_OMNI_TOKENS = {
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}  # fmt: skip


def build_qwen3_omni_checkpoint(out: Path) -> Path:
    """Qwen3-Omni (thinker): the family's demo tokenizer with its multimodal token attributes,
    ``Qwen3OmniMoeProcessor`` over the PIL image processor at patch 16, the video processor and Whisper's
    128-bin extractor (the released layout), ``config.json`` model_type ``qwen3_omni_moe``."""
    import transformers

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out, profile="qwen3_omni")
    tok = transformers.AutoTokenizer.from_pretrained(out, extra_special_tokens=QWEN_OMNI_TOKENS)
    transformers.Qwen3OmniMoeProcessor(
        image_processor=transformers.Qwen2VLImageProcessorPil(patch_size=16),
        video_processor=transformers.Qwen2VLVideoProcessor(patch_size=16),
        feature_extractor=transformers.WhisperFeatureExtractor(feature_size=128),
        tokenizer=tok, chat_template=tok.chat_template,
    ).save_pretrained(out)  # fmt: skip
    config = transformers.Qwen3OmniMoeConfig()
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def build_nemotron_omni_checkpoint(out: Path) -> Path:
    """Nemotron Omni: the family's demo tokenizer, ``NemotronH_Omni_Reasoning_V3Processor`` over its RADIO
    image processor (torchvision only), video processor and ``ParakeetFeatureExtractor`` (class defaults),
    ``config.json`` model_type ``nemotron_h_omni``."""
    import transformers
    from transformers.models import nemotron_h_omni as nemotron

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out, profile="nemotron_omni")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    nemotron.NemotronH_Omni_Reasoning_V3Processor(
        image_processor=nemotron.NemotronH_Omni_Reasoning_V3ImageProcessor(),
        video_processor=nemotron.NemotronH_Omni_Reasoning_V3VideoProcessor(),
        feature_extractor=transformers.ParakeetFeatureExtractor(), tokenizer=tok, chat_template=tok.chat_template,
    ).save_pretrained(out)  # fmt: skip
    config = nemotron.NemotronH_Omni_Reasoning_V3_Config()
    config.architectures = ["NemotronH_Omni_Reasoning_V3"]
    config.save_pretrained(out)
    return out


# family -> its checkpoint folder builder (the native profiles compared with hf; benchmarks/bench_profiles.py)
BUILDERS = {
    "qwen2_5_vl": lambda out: build_qwen_vl_checkpoint(out, "qwen2_5_vl"),
    "qwen3_vl": lambda out: build_qwen_vl_checkpoint(out, "qwen3_vl"),
    "qwen3_omni": build_qwen3_omni_checkpoint,
    "nemotron_omni": build_nemotron_omni_checkpoint,
}
COMPARED_FAMILIES = {  # family -> the processor class hf runs
    "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor", "qwen3_omni": "Qwen3OmniMoeProcessor",
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(COMPARED_FAMILIES))
def both(request, tmp_path_factory):
    """(family, {profile: dataset}, samples) of one corpus prepared by the native family and by ``hf``."""
    family = request.param
    root = tmp_path_factory.mktemp(f"side_by_side_{family}")
    model = BUILDERS[family](root / "model")
    out = {}
    for name, extra in [(family, []), ("hf", ["--profile", "hf", "--profile-option", "image_backend=pil"])]:
        _, samples, out[name] = prepare_hf_corpus(root / name, model, *extra, seq_length=4096)
    return family, out, samples


def _per_sample(out: Path) -> dict[str, dict[str, np.ndarray]]:
    """{sample id: its token ids, labels, and its images' pixel rows and grids} as the loader hands them."""
    found = {}
    for batch in val_batches(out, batch_size=1):
        d = batch.as_dict()
        cup, cu = d["cu_seqlens_q_padded"], d["cu_seqlens_q"]
        grids = d.get("image_grid_thw")
        image, row = 0, 0
        for k, sid in enumerate(batch.sample_ids[0]):
            a, n = int(cup[k]), int(cu[k + 1] - cu[k])
            found[sid] = {key: d[key][0, a : a + n].numpy() for key in COMPARED}
            images = sum(m["sample_index"] == k for m in batch.row_meta[0]["media"])
            if images:
                g = grids[image : image + images].numpy()
                rows = int(np.prod(g, axis=1).sum())
                found[sid]["image_grid_thw"] = g
                found[sid]["pixel_values"] = d["pixel_values"][row : row + rows].numpy()
                image, row = image + images, row + rows
        assert row == (0 if grids is None else d["pixel_values"].shape[0])
    return found


def test_the_profiles_are_the_checkpoints_and_the_processors(both):
    family, out, samples = both
    native, hf = (json.loads((out[n] / ".nv-meta" / "omnipack.json").read_text()) for n in (family, "hf"))
    assert (native["profile"]["name"], native["profile"]["source"]) == (family, "checkpoint")
    assert (hf["profile"]["name"], hf["profile"]["source"]) == ("hf", "explicit")
    settings = hf["profile"]["settings"]
    settings["placeholder_tokens"] = dict(settings["placeholder_tokens"])
    audio = settings["placeholder_tokens"].pop("audio", None)  # Qwen3-Omni's clips (the others take none)
    assert audio == (["<|audio_pad|>"] if family == "qwen3_omni" else None)
    assert settings["processor_class"] == COMPARED_FAMILIES[family]
    assert (settings["image_backend"], settings["image_processor_class"]) == ("pil", "Qwen2VLImageProcessorPil")
    # the processor's videos are planned too (hf's video planning: tests/test_profile_hf_video.py)
    assert settings["placeholder_tokens"] == {"image": ["<|image_pad|>"], "video": ["<|video_pad|>"]}
    assert native["counts"]["packed"] == hf["counts"]["packed"] == len(samples)


def test_token_ids_labels_pixels_and_grids_equal_the_native_familys(both):
    family, out, samples = both
    native, hf = _per_sample(out[family]), _per_sample(out["hf"])
    assert sorted(native) == sorted(hf) == sorted(samples)
    images = 0
    for sid in samples:
        assert native[sid].keys() == hf[sid].keys(), sid
        for key, want in native[sid].items():
            got = hf[sid][key]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (sid, key, got.dtype, want.dtype, got.shape)
            assert got.tobytes() == want.tobytes(), (sid, key, float(np.abs(got.astype(float) - want).max()))
        images += len(native[sid].get("image_grid_thw", ()))
    assert images == sum(p["type"] == "image" for m in sum(samples.values(), []) for p in m["content"])


# Nemotron Omni: the hf profile refuses its processor at start, so there is no hf side to compare (README,
# "Model profiles"; benchmarks/README.md, "Profiles benchmark", records the same reason).
OMNI_REFUSALS = {
    # Its own __call__ drops the text_replacement_offsets that get_text_with_replacements returns
    # (``text, _ = ...``): no item's expansion can be read off the processor.
    "nemotron_omni": (
        build_nemotron_omni_checkpoint, "NemotronH_Omni_Reasoning_V3Processor",
        "reports no text replacement for an image",
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(OMNI_REFUSALS))
def test_the_omni_processors_are_refused_at_start_with_their_reason(family, tmp_path, capsys):
    """``--profile hf`` on the checkpoint: refused at start, the one-line reason naming the processor, nothing
    written; without ``--profile`` the same folder is prepared by its native family."""
    from omnipack.cli import main
    from tests.family_kit import prepare, prepare_args, run_meta
    from tests.test_profile_hf import _corpus

    build, proc_cls, reason = OMNI_REFUSALS[family]
    model = build(tmp_path / "model")
    manifest, media, _ = _corpus(tmp_path / "src", n=2)
    assert main(prepare_args(manifest, media, tmp_path / "ds", "--model", str(model), "--profile", "hf")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"profile hf: {proc_cls} of {model}" in err and reason in err, err
    assert not (tmp_path / "ds").exists()
    native = prepare(manifest, media, tmp_path / "native", "--model", str(model))  # the checkpoint's family
    rec = run_meta(native)["profile"]
    assert (rec["name"], rec["source"]) == (family, "checkpoint")
