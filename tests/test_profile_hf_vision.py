"""The processor-backed profile (``hf``) on models whose processors hold a video processor, which transformers
builds only with torchvision: InternVL and GLM-4.6V (images; GLM-4.6V's videos: test_profile_hf_video.py), and
Phi-4-multimodal, refused at start for its audio. Opt-in (``pytest -m hf_processors``), skipped where torchvision
does not import.

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
from tests.family_kit import val_batches  # noqa: E402
from tests.test_profile_hf_payload import (  # noqa: E402
    TEXT_KEYS,
    assert_each_sample_is_the_processors,
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
PHI4_RATE = 16000
DEMO_IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"  # the demo template's image text
DEMO_VIDEO_BLOCK = "<|vision_start|><|video_pad|><|vision_end|>"  # its video text


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


def build_glm46v_model_dir(out: Path, video_block: str = "<|begin_of_video|><|video|><|end_of_video|>") -> Path:
    """GLM-4.6V: the class defaults (patch 14, merge 2, Qwen-VL-like grids), ``<|image|>`` placeholders
    between the begin/end marks, per-token ``mm_token_type_ids``; ``video_block``: the template's video text."""
    import transformers

    tok = _tokenizer(out, GLM_TOKENS, list(GLM_TOKENS.values()) + GLM_MARKS)
    transformers.Glm46VProcessor(
        image_processor=transformers.Glm46VImageProcessor(), video_processor=transformers.Glm46VVideoProcessor(),
        tokenizer=tok,
        chat_template=tok.chat_template.replace(DEMO_IMAGE_BLOCK, "<|begin_of_image|><|image|><|end_of_image|>").replace(
            DEMO_VIDEO_BLOCK, video_block
        ),
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


def build_llava_onevision_model_dir(out: Path) -> Path:
    """LLaVA-OneVision: 32 px views, an image alone tiled (anyres, up to a 64x64 grid of 32 px crops besides
    its base view), each image of a sample of several padded to a square and given its base view only."""
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


# family -> (folder builder, processor class, the token the text holds, the token the features replace,
# the stored keys' item axes)
FAMILIES = {
    "internvl": (build_internvl_model_dir, "InternVLProcessor", "<IMG_CONTEXT>", "<IMG_CONTEXT>", {"pixel_values": 0}),
    "glm46v": (
        build_glm46v_model_dir, "Glm46VProcessor", "<|image|>", "<|image|>", {"pixel_values": 0, "image_grid_thw": 0}
    ),
    "llava_onevision": (
        build_llava_onevision_model_dir, "LlavaOnevisionProcessor", "<image>", "<image>",
        {"batch_num_images": 0, "image_sizes": 0, "pixel_values": 0},
    ),
}  # fmt: skip
# the families whose images are processed per sample's image set (``HFProfile._find_joint_layout``)
VIDEOS_PLANNED = {"glm46v": True, "internvl": False}
JOINT = {"llava_onevision": {"image": {"per_sample": ["batch_num_images"], "masks": {}}}}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, family) -> Path:
    return FAMILIES[family][0](tmp_path_factory.mktemp(family) / "model")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, model_dir):
    return prepare_hf_corpus(tmp_path_factory.mktemp("hf_vision"), model_dir, seq_length=2048)


def image_paths(messages: list[dict]) -> list[str]:
    return [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]


def clip_paths(messages: list[dict]) -> list[str]:
    return [p["audio"] for m in messages for p in m["content"] if p["type"] == "audio"]


def processor_alone(proc, media: Path, messages: list[dict]) -> dict[str, np.ndarray]:
    """The processor's outputs for one sample alone (numpy, in its dtypes); its clips read as 16 kHz mono
    float32 (the corpus's own rate, so no resampler is involved)."""
    import soundfile

    # the processor's chat template, the tokenizer's where the processor keeps none (Phi-4-multimodal's)
    text = (proc if proc.chat_template else proc.tokenizer).apply_chat_template(messages, tokenize=False)
    images = [Image.open(media / p).convert("RGB") for p in image_paths(messages)]
    clips = [soundfile.read(media / p, dtype="float32")[0] for p in clip_paths(messages)]
    kw: dict = {"images": [images]} if images else {}  # one sample's images, as apply_chat_template nests them
    if clips:
        kw.update(audio=clips, sampling_rate=PHI4_RATE)
    return dict(proc(text=[text], add_special_tokens=False, return_tensors="np", **kw))


def test_the_run_falls_back_to_the_processor(prepared, family, model_dir):
    _, samples, out = prepared
    rec = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    settings = rec["profile"]["settings"]
    assert (rec["profile"]["name"], rec["profile"]["source"], rec["profile"]["model_type"]) == ("hf", "fallback", family)
    _, cls, text_token, feature_token, axes = FAMILIES[family]
    assert settings["processor_class"] == cls
    assert settings["template_blocks"]["image"] == [text_token]
    assert settings["placeholder_tokens"]["image"] == [feature_token]
    assert settings["media_arrays"]["image"] == axes
    assert settings["media_joint"] == JOINT.get(family, {})
    if family in VIDEOS_PLANNED:  # GLM-4.6V's videos: tests/test_profile_hf_video.py; InternVL's probe video fails
        planned = VIDEOS_PLANNED[family]
        assert ("video" in settings["template_blocks"]) == planned == ("video" not in settings["unplanned"])
    assert rec["counts"]["packed"] == len(samples) and rec["counts"]["rejected"] == 0
    used = [p["image"] for msgs in samples.values() for m in msgs for p in m["content"] if p["type"] == "image"]
    if family in JOINT:  # one processor call per distinct image set (each image of its own size)
        used = [tuple(image_paths(msgs)) for msgs in samples.values() if image_paths(msgs)]
    cache = rec["processor_cache"]["image"]
    assert cache["processor_calls"] == len(set(used)) and cache["cache_hits"] == len(used) - len(set(used))


def test_every_sample_equals_the_processor_alone(prepared, proc, family):
    """Token ids, labels (each answer through its end of turn) and every stored tensor, joined along the
    processor's item axis, are the processor's for the sample alone, bit for bit."""
    media, samples, out = prepared
    axes = FAMILIES[family][4]
    seen = assert_each_sample_is_the_processors(
        out, samples, lambda sid: processor_alone(proc, media, samples[sid]), lambda parts: joined(parts, axes),
        proc.tokenizer,
    )
    assert sum(n > 0 for n in seen.values()) >= 6 and max(seen.values()) > 1


def assert_loader_hands_the_processor_tensors(out: Path, samples: dict, alone, axes: dict[str, int]) -> set[int]:
    """The loader's micro-batches of two rows hold every sample's processor outputs (``alone(sample id)``), in
    stream order, joined along the item axes, and (sample by sample) its per-token outputs (GLM's
    ``mm_token_type_ids``) as the processor gives them; the per-token values seen."""
    seen = []
    for batch in val_batches(out, batch_size=2):
        sids = [s for row in batch.sample_ids for s in row]
        seen += sids
        want = joined([{k: v for k, v in alone(s).items() if k in axes} for s in sids], axes)
        assert_same_bits({k: v.numpy() for k, v in (batch.encoder_inputs or {}).items()}, want, sids)
    assert sorted(seen) == sorted(samples)
    values: set[int] = set()
    for batch in val_batches(out, batch_size=1):  # per-token outputs, sample by sample
        d = batch.as_dict()
        cup, cu = d["cu_seqlens_q_padded"], d["cu_seqlens_q"]
        for k, sid in enumerate(batch.sample_ids[0]):
            want = alone(sid)
            a, n = int(cup[k]), int(cu[k + 1] - cu[k])
            for key in set(want) - set(axes) - set(TEXT_KEYS):
                assert d[key][0, a : a + n].tolist() == want[key][0].tolist(), (sid, key)
                values |= set(want[key][0].tolist())
    return values


def test_verify_and_the_loader_hand_the_processor_tensors(prepared, proc, family):
    """``omnipack verify`` re-measures with the processor and finds every row as written; the loader hands
    every sample's processor outputs and per-token outputs."""
    media, samples, out = prepared
    assert main(["verify", str(out), "--workers", "1"]) == 0
    alone = lambda sid: processor_alone(proc, media, samples[sid])  # noqa: E731
    assert_loader_hands_the_processor_tensors(out, samples, alone, FAMILIES[family][4])


def test_the_trainer_only_install_loads_them(prepared, tmp_path):
    assert_trainer_only_loads_the_same(prepared[2], tmp_path)


def test_phi4_multimodal_crop_masks_pad_with_ones(tmp_path):
    """Phi-4-multimodal pads a batch's crop masks with ones (its pixels with zeros): the profile reads that
    pad value off the processor, and the trainer half pads with it, giving the processor's batch."""
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


# ---- Phi-4-multimodal, images and clips: the clips processed per sample's clip set ----

PHI4_AXES = {
    "image": {"image_pixel_values": 0, "image_sizes": 0, "image_attention_mask": 0},
    "audio": {"audio_attention_mask": 0, "audio_embed_sizes": 0, "audio_input_features": 0},
}
PHI4_FILLS = {"image_attention_mask": 1}  # its crop masks pad with ones


def _phi4_corpus(root: Path) -> tuple[Path, Path, dict[str, list[dict]]]:
    """16 samples of 0-2 images and 0-2 clips (16 kHz mono, each of its own length), some sets repeated."""
    import soundfile

    from tests.family_kit import noise_images, write_manifest

    media = root / "media"
    sizes = [(100, 220), (40, 50), (64, 64), (150, 90)]
    images = noise_images(media, np.random.default_rng(1), [(f"img{k}.png", h, w) for k, (h, w) in enumerate(sizes)])
    rng = np.random.default_rng(3)
    clips = []
    for k, secs in enumerate([0.5, 1.3, 0.3, 0.8]):
        clips.append(f"clip{k}.wav")
        wave = (0.3 * rng.standard_normal(int(secs * PHI4_RATE))).clip(-1, 1)
        soundfile.write(media / clips[-1], wave, PHI4_RATE, subtype="PCM_16")
    samples = {}
    for i in range(16):
        user = [{"type": "image", "image": images[(i + j) % 4]} for j in range(i % 3)]
        user += [{"type": "audio", "audio": clips[(i + j) % 4]} for j in range((i + 1) % 3)]
        user.append({"type": "text", "text": f"What is shown and heard in {i}?"})
        answer = [{"type": "text", "text": "A bird on a wire." * (1 + i % 2)}]
        samples[f"p-{i:03d}"] = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return write_manifest(root, samples), media, samples


@pytest.fixture(scope="module")
def phi4(tmp_path_factory):
    """(processor, media, samples, dataset): the image + audio corpus prepared with a Phi-4-multimodal folder."""
    from transformers import AutoProcessor

    from tests.family_kit import prepare

    root = tmp_path_factory.mktemp("phi4")
    folder = build_phi4_multimodal_model_dir(root / "model")
    manifest, media, samples = _phi4_corpus(root / "src")
    out = prepare(manifest, media, root / "ds", "--model", str(folder), "--seq-length", "2048", "--shard-max-rows", "2")
    return AutoProcessor.from_pretrained(str(folder)), media, samples, out


def phi4_joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each kind's arrays joined along their item axis (crop masks padded with ones, the rest with zeros)."""
    return {k: v for axes in PHI4_AXES.values() for k, v in joined(parts, axes, PHI4_FILLS).items()}


def test_phi4_multimodal_images_and_clips_equal_the_processor_per_sample(phi4):
    """Phi-4-multimodal pads a sample's clips to the longest before computing their features (a shorter
    clip's padding frames hold its own tail), and gives ``audio_attention_mask`` for two clips or more: its
    clips are processed per sample's clip set (counted once per tuple of clip lengths), each clip storing
    its rows; its images per image. Every sample's token ids, labels and stored tensors equal the
    processor's for the sample alone, bit for bit."""
    proc, media, samples, out = phi4
    meta = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    settings = meta["profile"]["settings"]
    assert settings["media_arrays"] == PHI4_AXES and settings["media_pad_values"] == PHI4_FILLS
    masks = {"audio_attention_mask": ["audio_input_features", "|b1", 2]}
    assert settings["media_joint"] == {"audio": {"per_sample": [], "masks": masks}}
    assert meta["counts"]["packed"] == len(samples) and meta["counts"]["rejected"] == 0
    sets = [tuple(clip_paths(m)) for m in samples.values() if clip_paths(m)]
    images = [p for m in samples.values() for p in image_paths(m)]
    cache = {kind: (c["processor_calls"], c["cache_hits"]) for kind, c in meta["processor_cache"].items()}
    assert cache["audio"] == (len(set(sets)), len(sets) - len(set(sets)))
    assert cache["image"] == (len(set(images)), len(images) - len(set(images)))
    seen = assert_each_sample_is_the_processors(
        out, samples, lambda sid: processor_alone(proc, media, samples[sid]), phi4_joined, proc.tokenizer
    )
    assert sum(n > 2 and len(clip_paths(samples[sid])) > 1 for sid, n in seen.items()) >= 4  # image + 2 clips


def test_phi4_multimodal_verify_and_the_loader(phi4, tmp_path):
    """``omnipack verify`` re-measures and finds every row as written; the loader's micro-batches of two rows
    hold every sample's processor outputs joined, with the clip mask the processor gives for several clips
    (true over each clip's own frames) wherever the micro-batch holds several, and the trainer-only install
    gives the same tensors."""
    proc, media, samples, out = phi4
    assert main(["verify", str(out), "--workers", "1"]) == 0
    seen, masked = [], 0
    for batch in val_batches(out, batch_size=2):
        sids = [s for row in batch.sample_ids for s in row]
        seen += sids
        alone = [processor_alone(proc, media, samples[s]) for s in sids]
        features = [a["audio_input_features"] for a in alone if "audio_input_features" in a]
        if sum(f.shape[0] for f in features) > 1:
            for a in alone:
                if "audio_input_features" in a and "audio_attention_mask" not in a:
                    a["audio_attention_mask"] = np.ones(a["audio_input_features"].shape[:2], bool)
            masked += 1
        want = phi4_joined([{k: v for k, v in a.items() if k not in TEXT_KEYS} for a in alone])
        assert_same_bits({k: v.numpy() for k, v in (batch.encoder_inputs or {}).items()}, want, sids)
    assert sorted(seen) == sorted(samples) and masked
    assert_trainer_only_loads_the_same(out, tmp_path)


def test_llava_onevision_counts_an_image_by_its_sample(tmp_path):
    """Why LLaVA-OneVision's images are processed per sample's image set: its processor tiles an image alone
    (anyres: a base view and the crops of its best grid) but gives each image of several its base view only
    (pixel rows and placeholder counts of their own), and the model reads which from ``batch_num_images``.
    The plans follow the set, each image storing its rows; a set of the same sizes is counted once."""
    from omnipack.media.meta import MediaMeta
    from omnipack.profiles import get_profile

    prof = get_profile("hf", model_dir=str(build_llava_onevision_model_dir(tmp_path / "model")))
    wide, small = MediaMeta("image", height=100, width=220), MediaMeta("image", height=40, width=50)
    (alone,) = prof.plan_sample([wide])
    pair = prof.plan_sample([wide, small])
    assert alone.info["stored_arrays"]["pixel_values"][0] == [1, 3, 3, 32, 32]  # base view + 1x2 crops
    assert [p.info["stored_arrays"]["pixel_values"][0] for p in pair] == [[1, 1, 3, 32, 32]] * 2
    assert [p.num_tokens for p in pair] == [5, 5] and alone.num_tokens > 5  # 4 features + a newline each
    assert "batch_num_images" in pair[0].info["stored_arrays"] and "batch_num_images" not in pair[1].info["stored_arrays"]
    assert prof.plan_sample([wide, small]) == pair and prof.plan(wide) == alone
    assert prof.cache_stats() == {"image": {"processor_calls": 2, "cache_hits": 2}}
