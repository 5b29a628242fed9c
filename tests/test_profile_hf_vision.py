"""The processor-backed profile (``hf``) on models whose processors hold a video processor, which transformers
builds only with torchvision: InternVL and GLM-4.6V (images; their videos are not planned yet, README "Model
profiles"), and Phi-4-multimodal, refused at start for its audio. Opt-in (``pytest -m hf_processors``), skipped
where torchvision does not import.

Each model folder is built from the transformers 5.24 classes over the demo vocabulary with the model's
added tokens, saved as a checkpoint is, and prepared without ``--profile`` (test_profile_hf.py's image
corpus): the run falls back to ``hf``, and every packed sample's token ids, labels and stored tensors equal
the processor's for that sample alone; verify and the trainer-only loader work.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import prepare_hf_corpus
from tests.hf_oracles import require_torchvision

pytestmark = pytest.mark.hf_processors
pytest.importorskip("transformers")
pytest.importorskip("megatron.energon")
require_torchvision()

from omnipack.cli import main  # noqa: E402
from omnipack.dataset.codec import decode_row  # noqa: E402
from omnipack.loader.media import decode_payload  # noqa: E402
from tests.family_kit import val_batches  # noqa: E402
from tests.test_pipeline import read_rows_from_tars  # noqa: E402
from tests.test_profile_hf_payload import (  # noqa: E402
    TEXT_KEYS,
    assert_same_bits,
    assert_trainer_only_loads_the_same,
    joined,
)

INTERNVL_TOKENS = {
    "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}  # fmt: skip
GLM_TOKENS = {"image_token": "<|image|>", "video_token": "<|video|>"}
GLM_MARKS = ["<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>"]
DEMO_IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"  # the demo template's image text


def _tokenizer(out: Path, extra: dict[str, str], added: list[str]):
    """The demo tokenizer with the model's added tokens and its multimodal token attributes."""
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out, extra_special_tokens=extra)
    tok.add_special_tokens({"additional_special_tokens": added})
    return tok


def build_internvl_model_dir(out: Path) -> Path:
    """InternVL: 32 px tiles (the image cropped to up to 4 plus a thumbnail), 4 context tokens a tile
    between ``<img>`` and ``</img>``."""
    import transformers

    tok = _tokenizer(out, INTERNVL_TOKENS, list(INTERNVL_TOKENS.values()))
    transformers.InternVLProcessor(
        image_processor=transformers.GotOcr2ImageProcessor(size={"height": 32, "width": 32}, max_patches=4),
        video_processor=transformers.InternVLVideoProcessor(size={"height": 32, "width": 32}),
        tokenizer=tok, image_seq_length=4,
        chat_template=tok.chat_template.replace(DEMO_IMAGE_BLOCK, "<IMG_CONTEXT>\n"),
    ).save_pretrained(out)  # fmt: skip
    config = transformers.InternVLConfig()
    config.architectures = ["InternVLForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def build_glm46v_model_dir(out: Path) -> Path:
    """GLM-4.6V: the class defaults (patch 14, merge 2, Qwen-VL-like grids), ``<|image|>`` placeholders
    between the begin/end marks, per-token ``mm_token_type_ids``."""
    import transformers

    tok = _tokenizer(out, GLM_TOKENS, list(GLM_TOKENS.values()) + GLM_MARKS)
    transformers.Glm46VProcessor(
        image_processor=transformers.Glm46VImageProcessor(), video_processor=transformers.Glm46VVideoProcessor(),
        tokenizer=tok,
        chat_template=tok.chat_template.replace(DEMO_IMAGE_BLOCK, "<|begin_of_image|><|image|><|end_of_image|>"),
    ).save_pretrained(out)  # fmt: skip
    config = transformers.Glm46VConfig()
    config.architectures = ["Glm46VForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def build_phi4_multimodal_model_dir(out: Path) -> Path:
    """Phi-4-multimodal (image + audio): 56 px crops (up to 4 and a global view), crop masks padded with ones."""
    import transformers

    extra = {"image_token": "<|image|>", "audio_token": "<|audio|>"}
    tok = _tokenizer(out, extra, list(extra.values()))
    template = tok.chat_template.replace(DEMO_IMAGE_BLOCK, "<|image|>")
    template = template.replace("{%- elif item['type'] == 'audio' -%}", "{%- elif item['type'] == 'audio' -%}<|audio|>")
    transformers.Phi4MultimodalProcessor(
        image_processor=transformers.Phi4MultimodalImageProcessor(size={"height": 56, "width": 56}, dynamic_hd=4),
        audio_processor=transformers.Phi4MultimodalFeatureExtractor(), tokenizer=tok, chat_template=template,
    ).save_pretrained(out)  # fmt: skip
    config = transformers.Phi4MultimodalConfig()
    config.architectures = ["Phi4MultimodalForCausalLM"]
    config.save_pretrained(out)
    return out


# family -> (folder builder, processor class, the token the text holds, the token the features replace,
# the stored keys' item axes)
FAMILIES = {
    "internvl": (build_internvl_model_dir, "InternVLProcessor", "<IMG_CONTEXT>", "<IMG_CONTEXT>", {"pixel_values": 0}),
    "glm46v": (
        build_glm46v_model_dir, "Glm46VProcessor", "<|image|>", "<|image|>", {"pixel_values": 0, "image_grid_thw": 0}
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, family) -> Path:
    return FAMILIES[family][0](tmp_path_factory.mktemp(family) / "model")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, model_dir):
    return prepare_hf_corpus(tmp_path_factory.mktemp("hf_vision"), model_dir, seq_length=2048)


@pytest.fixture(scope="module")
def proc(model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model_dir))


def processor_alone(proc, media: Path, messages: list[dict]) -> dict[str, np.ndarray]:
    """The processor's outputs for one sample alone (numpy, in its dtypes)."""
    text = proc.apply_chat_template(messages, tokenize=False)
    paths = [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]
    images = [Image.open(media / p).convert("RGB") for p in paths]
    kw = {"images": images} if images else {}
    return dict(proc(text=[text], add_special_tokens=False, return_tensors="np", **kw))


def test_the_run_falls_back_to_the_processor(prepared, family, model_dir):
    _, samples, out = prepared
    rec = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    settings = rec["profile"]["settings"]
    assert (rec["profile"]["name"], rec["profile"]["source"], rec["profile"]["model_type"]) == ("hf", "fallback", family)
    _, cls, text_token, feature_token, axes = FAMILIES[family]
    assert settings["processor_class"] == cls
    assert settings["template_blocks"] == {"image": [text_token]}
    assert settings["placeholder_tokens"] == {"image": [feature_token]}
    assert settings["media_arrays"] == {"image": axes}
    assert rec["counts"]["packed"] == len(samples) and rec["counts"]["rejected"] == 0
    used = [p["image"] for msgs in samples.values() for m in msgs for p in m["content"] if p["type"] == "image"]
    cache = rec["processor_cache"]["image"]
    assert cache["processor_calls"] == len(set(used)) and cache["cache_hits"] == len(used) - len(set(used))


def test_every_sample_equals_the_processor_alone(prepared, proc, family):
    """Token ids, labels (each answer through its end of turn) and every stored tensor, joined along the
    processor's item axis, are the processor's for the sample alone, bit for bit."""
    media, samples, out = prepared
    axes = FAMILIES[family][4]
    seen, with_images = [], 0
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for k, sid in enumerate(row.sample_ids):
            want = processor_alone(proc, media, samples[sid])
            start, n = int(row.cu_seqlens_padded[k]), int(row.cu_seqlens[k + 1] - row.cu_seqlens[k])
            assert row.tokens[start : start + n].tolist() == want["input_ids"][0].tolist(), sid
            labels = row.labels[start : start + n]
            answers = [p["text"] for m in samples[sid] if m["role"] == "assistant" for p in m["content"]]
            assert proc.tokenizer.decode(labels[labels >= 0].tolist()) == "".join(f"{a}<|im_end|>" for a in answers)
            items = sorted((m for m in row.media if m.sample_index == k), key=lambda m: m.token_start)
            stored = joined([dict(decode_payload(m.part, parts[m.part])) for m in items], axes)
            assert_same_bits(stored, {k2: v for k2, v in want.items() if k2 in axes}, sid)
            seen.append(sid)
            with_images += bool(items)
    assert sorted(seen) == sorted(samples) and with_images >= 6


def test_verify_and_the_loader_hand_the_processor_tensors(prepared, proc, family):
    """``omnipack verify`` re-measures with the processor and finds every row as written; the loader's
    micro-batches of two rows hold every sample's processor outputs, in stream order, joined per image, and
    its per-token outputs (GLM's ``mm_token_type_ids``) as the processor gives them."""
    media, samples, out = prepared
    assert main(["verify", str(out), "--workers", "1"]) == 0
    axes = FAMILIES[family][4]
    seen = []
    for batch in val_batches(out, batch_size=2):
        sids = [s for row in batch.sample_ids for s in row]
        seen += sids
        alone = [processor_alone(proc, media, samples[s]) for s in sids]
        got = {k: v.numpy() for k, v in (batch.encoder_inputs or {}).items()}
        assert_same_bits(got, joined([{k: v for k, v in a.items() if k in axes} for a in alone], axes), sids)
    assert sorted(seen) == sorted(samples)
    for batch in val_batches(out, batch_size=1):  # per-token outputs, sample by sample
        d = batch.as_dict()
        cup, cu = d["cu_seqlens_q_padded"], d["cu_seqlens_q"]
        for k, sid in enumerate(batch.sample_ids[0]):
            want = processor_alone(proc, media, samples[sid])
            a, n = int(cup[k]), int(cu[k + 1] - cu[k])
            for key in set(want) - set(axes) - set(TEXT_KEYS):
                assert d[key][0, a : a + n].tolist() == want[key][0].tolist(), (sid, key)


def test_the_trainer_only_install_loads_them(prepared, tmp_path):
    assert_trainer_only_loads_the_same(prepared[2], tmp_path)


def test_phi4_multimodal_crop_masks_pad_with_ones_and_its_audio_is_refused(tmp_path, capsys):
    """Phi-4-multimodal pads a batch's crop masks with ones (its pixels with zeros): the profile reads that
    pad value off the processor, and the trainer half pads with it, giving the processor's batch. Its audio
    features of a clip beside a longer one differ from the clip's alone in the padding frames (masked by an
    ``audio_attention_mask`` it emits only for two clips or more): refused at start with that reason."""
    from omnipack.profiles.hf import HFInputs, HFProfile
    from omnipack.profiles.model_inputs import MediaInputOptions

    folder = build_phi4_multimodal_model_dir(tmp_path / "model")
    from transformers import AutoProcessor

    images = AutoProcessor.from_pretrained(str(folder)).image_processor
    rng = np.random.default_rng(0)
    big, small = (Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in [(100, 220), (40, 50)])
    batch = images([big, small], return_tensors="np")
    alone = [images([im], return_tensors="np") for im in (big, small)]
    fills = {}
    for key in ("image_pixel_values", "image_attention_mask"):
        fills[key] = HFProfile._pad_value(batch[key], [a[key] for a in alone], 0)
    assert fills == {"image_pixel_values": 0, "image_attention_mask": 1}
    axes = {"image_pixel_values": 0, "image_attention_mask": 0}
    settings = {"placeholder_tokens": {"image": ["<|image|>"]}, "media_arrays": {"image": axes}, "media_pad_values": fills}
    got = HFInputs(settings).collate_media([{k: a[k] for k in axes} for a in alone], MediaInputOptions())
    assert_same_bits({k: v.numpy() for k, v in got.items()}, {k: batch[k] for k in axes}, "phi4 images")

    manifest, media, _ = __import__("tests.test_profile_hf", fromlist=["_corpus"])._corpus(tmp_path / "src", n=2)
    args = [
        "prepare", "--manifest", str(manifest), "--media-root", str(media), "--model", str(folder),
        "-o", str(tmp_path / "ds"), "--no-progress",
    ]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "profile hf: Phi4MultimodalProcessor" in err, err
    assert "'audio_input_features' beside a second audio" in err, err
    assert not (tmp_path / "ds").exists()


def build_llava_onevision_model_dir(out: Path) -> Path:
    import transformers

    tok = _tokenizer(out, {}, ["<image>", "<video>"])
    transformers.LlavaOnevisionProcessor(
        image_processor=transformers.LlavaOnevisionImageProcessor(
            size={"height": 32, "width": 32}, image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]]
        ),
        video_processor=transformers.LlavaOnevisionVideoProcessor(size={"height": 32, "width": 32}),
        tokenizer=tok, num_image_tokens=4, vision_feature_select_strategy="full",
        chat_template=tok.chat_template.replace(DEMO_IMAGE_BLOCK, "<image>"),
    ).save_pretrained(out)  # fmt: skip
    config = transformers.LlavaOnevisionConfig()
    config.architectures = ["LlavaOnevisionForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def test_llava_onevision_is_refused_for_its_multi_image_mode(tmp_path):
    """LLaVA-OneVision's processor tiles an image alone (anyres) but gives each image of a sample of several
    its base view only, with other counts: its outputs per image depend on the sample, refused at start."""
    from omnipack.profiles import get_profile

    folder = build_llava_onevision_model_dir(tmp_path / "model")
    # a 224 px probe alone: the base view and 4 crops of its best grid; two: one base view each
    shapes = r"'pixel_values' \(1, 5, 3, 32, 32\) for one image and \(2, 1, 3, 32, 32\) for two"
    with pytest.raises(ValueError, match=rf"LlavaOnevisionProcessor .* returns {shapes}, not one item axis"):
        get_profile("hf", model_dir=str(folder))
