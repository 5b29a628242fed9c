"""The processor-backed profile (``hf``): models without a native family, their own processor deciding every
count. Idefics3 (SmolVLM) and LLaVA model folders are built from the transformers 5.24 classes (config,
the PIL image processor and the processor over the demo vocabulary with the model's added tokens), saved
as a checkpoint is, and prepared without ``--profile``: the run falls back to ``hf``, says so, and every
packed sample's token ids and labels equal the processor's for that sample alone.

(LLaVA-OneVision and SmolVLM processors need a video processor, which transformers builds only with
torchvision; the Idefics3 and LLaVA processors are image-only.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.cli import main
from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta
from tests.family_kit import chat_samples, noise_images, prepare_args, run_meta, val_batches, write_manifest

IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]
# SmolVLM's chat template (turns "User:" / "Assistant:", each ended by <end_of_utterance>).
SMOL_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# (height, width): images split into 1x1 .. 2x2 tiles and a small one left whole.
SIZES = [(50, 90), (300, 200), (64, 64), (20, 30), (700, 260), (128, 129)]


def build_idefics3_model_dir(out: Path) -> Path:
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": IDEFICS3_TOKENS})
    images = transformers.Idefics3ImageProcessorPil(
        size={"longest_edge": 128}, max_image_size={"longest_edge": 64}, do_image_splitting=True
    )
    transformers.Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=4, chat_template=SMOL_TEMPLATE
    ).save_pretrained(out)
    config = transformers.Idefics3Config()
    config.vision_config.image_size, config.vision_config.patch_size, config.scale_factor = 64, 16, 2
    config.architectures = ["Idefics3ForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def build_llava_model_dir(out: Path) -> Path:
    """LLaVA 1.5 layout: CLIP image processor (64 px, patch 16), the vision tower's CLS token counted and
    dropped by the default feature selection: 16 placeholders, as a CLIP tower of that size gives."""
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = tok.chat_template.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
    images = transformers.CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})
    transformers.LlavaProcessor(
        image_processor=images, tokenizer=tok, patch_size=16, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=template,
    ).save_pretrained(out)  # fmt: skip
    config = transformers.LlavaConfig()
    config.architectures = ["LlavaForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def build_llava_next_model_dir(out: Path) -> Path:
    """LLaVA-NeXT (anyres): the 64 px base view plus 64 px crops of the image resized to its best grid among
    the pinpoints, each image's patches as many as its shape needs (a batch pads them)."""
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = tok.chat_template.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
    pinpoints = [[64, 128], [128, 64], [128, 128], [64, 192]]
    images = transformers.LlavaNextImageProcessorPil(
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}, image_grid_pinpoints=pinpoints
    )
    transformers.LlavaNextProcessor(
        image_processor=images, tokenizer=tok, patch_size=16, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=template,
    ).save_pretrained(out)  # fmt: skip
    config = transformers.LlavaNextConfig(image_grid_pinpoints=pinpoints)
    config.vision_config.image_size, config.vision_config.patch_size = 64, 16
    config.architectures = ["LlavaNextForConditionalGeneration"]
    config.save_pretrained(out)
    return out


# family -> (folder builder, processor class, end of an assistant turn, supervised text of an answer)
FAMILIES = {
    "idefics3": (build_idefics3_model_dir, "Idefics3Processor", "<end_of_utterance>", " {}<end_of_utterance>"),
    "llava": (build_llava_model_dir, "LlavaProcessor", "<|im_end|>", "{}<|im_end|>"),
    "llava_next": (build_llava_next_model_dir, "LlavaNextProcessor", "<|im_end|>", "{}<|im_end|>"),
}


def _corpus(root: Path, n: int = 12) -> tuple[Path, Path, dict[str, list[dict]]]:
    media = root / "media"
    files = [(f"img{k}.png", h, w) for k, (h, w) in enumerate(SIZES)]
    images = noise_images(media, np.random.default_rng(1), files)
    samples = chat_samples(
        "s", n, "image", images, "Describe the picture {}.", "The image shows a red square.",
        follow_up=("img4.png", "Count the objects."),
    )  # fmt: skip
    return write_manifest(root, samples), media, samples


# The family, its model folder and its prepared dataset: built once per session (tests/conftest.py), shared
# with test_profile_hf_payload.py.
@pytest.fixture(scope="module")
def family(hf_family) -> str:
    return hf_family


@pytest.fixture(scope="module")
def model_dir(hf_model_dir) -> Path:
    return hf_model_dir


@pytest.fixture(scope="module")
def prepared(hf_prepared):
    return hf_prepared


def test_a_model_type_without_a_native_profile_falls_back_to_its_processor(prepared, model_dir, family):
    _, samples, out = prepared
    meta = run_meta(out)
    rec = meta["profile"]
    assert rec["name"] == "hf" and rec["source"] == "fallback" and rec["model_type"] == family
    assert rec["settings"]["processor_class"] == FAMILIES[family][1]
    assert rec["settings"]["placeholder_tokens"] == {"image": ["<image>"]}
    assert rec["settings"]["turn_end"] == FAMILIES[family][2]
    assert rec["processor_files"] == {
        kind: f"{model_dir / 'processor_config.json'}#image_processor" for kind in ["image"]
    }
    assert meta["counts"]["packed"] == len(samples) and meta["counts"]["rejected"] == 0
    # one processor call per distinct image size of the corpus, every other image a cache hit
    used = [p["image"] for msgs in samples.values() for m in msgs for p in m["content"] if p["type"] == "image"]
    cache = meta["processor_cache"]["image"]
    assert cache["processor_calls"] == len(set(used)) and cache["cache_hits"] == len(used) - len(set(used))


def test_every_sample_equals_the_processor_alone(prepared, model_dir, family):
    from transformers import AutoProcessor

    from omnipack.dataset.codec import decode_row
    from tests.test_pipeline import read_rows_from_tars

    media, samples, out = prepared
    proc = AutoProcessor.from_pretrained(str(model_dir))
    turn_end, answer = FAMILIES[family][2:]
    end = proc.tokenizer.convert_tokens_to_ids(turn_end)
    seen = []
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for k, sid in enumerate(row.sample_ids):
            messages = samples[sid]
            paths = [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]
            text = proc.apply_chat_template(messages, tokenize=False)
            images = [Image.open(media / p).convert("RGB") for p in paths]
            hf = proc(text=[text], images=[images] if images else None, add_special_tokens=False)
            a, b = int(row.cu_seqlens[k]), int(row.cu_seqlens[k + 1])
            ids = row.tokens[row.cu_seqlens_padded[k] : row.cu_seqlens_padded[k] + (b - a)]
            assert ids.tolist() == list(hf["input_ids"][0]), sid
            labels = row.labels[row.cu_seqlens_padded[k] : row.cu_seqlens_padded[k] + (b - a)]
            # supervised: each assistant answer through its end of turn (labels are the next tokens)
            targets = labels[labels >= 0].tolist()
            answers = [p["text"] for m in messages if m["role"] == "assistant" for p in m["content"]]
            assert proc.tokenizer.decode(targets) == "".join(answer.format(t) for t in answers), sid
            assert targets.count(end) == len(answers)
            seen.append(sid)
    assert sorted(seen) == sorted(samples)


def test_the_processor_runs_once_per_image_size(model_dir):
    """A 10k-image corpus of 50 distinct sizes: 50 processor calls, 9950 cache hits, and each count the
    processor's."""
    from transformers import AutoProcessor

    prof = get_profile("hf", model_dir=str(model_dir))
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(8, 400, (50, 2))]
    assert len(set(sizes)) == 50
    counts = {}
    for k in rng.integers(0, 50, 9950).tolist() + list(range(50)):
        h, w = sizes[k]
        counts[(h, w)] = prof.plan(MediaMeta("image", width=w, height=h)).num_tokens
    assert prof.cache_stats() == {"image": {"processor_calls": 50, "cache_hits": 9950}}
    proc = AutoProcessor.from_pretrained(str(model_dir))
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    for h, w in sizes[:8]:  # a real (non-blank) image of that size gives the same count
        px = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        ids = proc(text=["<image>"], images=[Image.fromarray(px)])["input_ids"][0]
        assert counts[(h, w)] == sum(int(i) == image_id for i in ids)


def test_a_native_profile_that_disagrees_names_the_processor_profile(tmp_path, model_dir, capsys):
    manifest, media, _ = _corpus(tmp_path / "src", n=2)
    args = prepare_args(
        manifest, media, tmp_path / "ds", "--model", str(model_dir), "--profile", "qwen2_5_vl"
    )
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "--profile qwen2_5_vl disagrees with the checkpoint" in err and "model_type '" in err
    assert "--profile hf" in err


def test_a_processor_that_cannot_be_loaded_is_refused_at_start(tmp_path, capsys):
    """A folder whose processor transformers cannot build (here: no processor files at all) is refused with
    the reason, before anything is measured."""
    from omnipack.demo.tokenizer import build_demo_tokenizer

    folder = build_demo_tokenizer(tmp_path / "model")
    (folder / "config.json").write_text(json.dumps({"model_type": "llava_onevision"}))
    manifest, media, _ = _corpus(tmp_path / "src", n=2)
    args = prepare_args(manifest, media, tmp_path / "ds", "--model", str(folder))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "profile hf:" in err and str(folder) in err
    assert not (tmp_path / "ds").exists()


def test_a_processor_that_needs_torchvision_is_refused_naming_it(tmp_path, capsys):
    """LLaVA-OneVision's processor holds a video processor, which transformers builds only with torchvision:
    without it the run is refused at start, the one-line reason naming the class and the library. (The
    folder is written by hand: transformers cannot build that processor here to save it.)"""
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    if transformers.utils.is_torchvision_available():
        pytest.skip("torchvision is installed: the processor loads")
    folder = build_demo_tokenizer(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    tok.save_pretrained(folder)
    images = transformers.LlavaOnevisionImageProcessorPil(size={"height": 64, "width": 64})
    processor = {
        "processor_class": "LlavaOnevisionProcessor", "image_processor": images.to_dict(),
        "video_processor": {"video_processor_type": "LlavaOnevisionVideoProcessor"}, "num_image_tokens": 16,
    }  # fmt: skip
    (folder / "processor_config.json").write_text(json.dumps(processor))
    transformers.LlavaOnevisionConfig().save_pretrained(folder)
    manifest, media, _ = _corpus(tmp_path / "src", n=2)
    args = prepare_args(manifest, media, tmp_path / "ds", "--model", str(folder))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"profile hf: the processor of {folder} cannot be loaded offline" in err
    assert "(ImportError: LlavaOnevisionVideoProcessor requires the Torchvision library but it was not found" in err
    assert not (tmp_path / "ds").exists()


def test_verify_and_the_loader_read_the_dataset(prepared):
    """``omnipack verify`` re-measures with the recorded profile (the processor again) and finds every row as
    written; the Energon loader, built from omnipack.json alone, hands out the packed rows."""
    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    _, samples, out = prepared
    assert main(["verify", str(out), "--workers", "1"]) == 0
    te = OmnipackTaskEncoder.from_dataset(out, decode_media=False)
    image_id = te.placeholder_ids["image"][0]
    seen = []
    for batch in val_batches(out, te):
        seen += batch.sample_ids[0]
        media = batch.row_meta[0]["media"]
        assert int((batch.tokens[0] == image_id).sum()) == sum(m["num_tokens"] for m in media) > 0
        assert set(batch.media[0]) == {m["part"] for m in media}  # the stored payloads, handed over as they are
    assert sorted(seen) == sorted(samples)


def test_the_demo_refuses_the_processor_profile(tmp_path, capsys):
    assert main(["demo", str(tmp_path / "demo"), "--profile", "hf", "--samples", "2"]) == 2
    assert "needs (the model's own processor): prepare with --model" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
