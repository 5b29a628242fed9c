"""Qwen3.5 end to end: ``omnipack prepare`` -> ``omnipack verify`` -> the Energon loader, on real PNG/JPEG
images and mp4 videos. Every packed sample's tokens equal ``Qwen3VLProcessor``'s (the processor class a
Qwen3.5 release names), its mRoPE ids ``Qwen3_5Model.get_rope_index``'s, and every batch's image pixels
the image processor's, bit for bit after the loader's normalization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.cli import main
from omnipack.demo.media import write_video
from omnipack.profiles import get_profile
from tests.family_kit import (
    assert_packed_but_the_missing,
    noise_images,
    prepare_family_corpus,
    val_batches,
    write_manifest,
)
from tests.qwen3_5_model import (
    build_qwen35_model_dir,
    hf_ids_and_types,
    hf_video_inputs,
    model_rope_index,
    qwen35_processor,
)

pytest.importorskip("megatron.energon")
torch = pytest.importorskip("torch")

# (height, width, format) of the images; (frames, fps, width, height) of the clips.
IMAGES = [(300, 400, "png"), (120, 90, "jpeg"), (37, 53, "png"), (200, 640, "jpeg")]
CLIPS = [(13, 10, 96, 64), (8, 4, 64, 96)]


def _corpus(root: Path, n: int = 12) -> tuple[Path, Path, dict[str, list[dict]]]:
    media = root / "media"
    images = [(f"img{k}.{'jpg' if fmt == 'jpeg' else 'png'}", h, w) for k, (h, w, fmt) in enumerate(IMAGES)]
    names = {"image": noise_images(media, np.random.default_rng(0), images), "video": []}
    for k, (frames, fps, w, h) in enumerate(CLIPS):
        write_video(media / f"clip{k}.mp4", n=frames, fps=fps, w=w, h=h)
        names["video"].append(f"clip{k}.mp4")
    samples: dict[str, list[dict]] = {}
    for i in range(n):
        user: list[dict] = []
        if i % 3 != 2:
            user.append({"type": "image", "image": names["image"][i % len(IMAGES)]})
        if i % 2:
            user.append({"type": "video", "video": names["video"][i % len(CLIPS)]})
        user.append({"type": "text", "text": f"Describe sample {i}."})
        samples[f"q-{i:03d}"] = [
            {"role": "user", "content": user},
            {"role": "assistant", "content": "A ball moves from the left to the right." * (1 + i % 3)},
        ]
    return write_manifest(root, samples, missing="nope.mp4"), media, samples


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3_5_e2e")
    model_dir = build_qwen35_model_dir(root / "model")
    return prepare_family_corpus(root, model_dir, _corpus, "qwen3_5", "--seq-length", "2048")


def test_prepare_records_the_family_and_rejects_with_reasons(prepared):
    _, _, samples, out = prepared
    meta = assert_packed_but_the_missing(out, samples, "missing")
    assert meta["profile"]["name"] == "qwen3_5"
    assert meta["profile"]["settings"] == get_profile("qwen3_5").settings()
    assert meta["mrope_position_ids"] is True  # the family's default: it uses mRoPE


def test_verify_passes(prepared):
    assert main(["verify", str(prepared[3]), "--workers", "1"]) == 0


def test_loader_batches_equal_the_processor_and_model_sample_by_sample(prepared):
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    model_dir, media, samples, out = prepared
    proc = qwen35_processor(model_dir)
    model = Qwen3_5ForConditionalGeneration(AutoConfig.from_pretrained(str(model_dir))).eval()
    te = OmnipackTaskEncoder.from_dataset(out)
    tok = proc.tokenizer
    assert te.placeholder_ids == {
        "image": [tok.convert_tokens_to_ids("<|image_pad|>")],
        "video": [tok.convert_tokens_to_ids("<|video_pad|>")],
    }
    seen, kinds_seen = [], set()
    for batch in val_batches(out, te, workers=1):
        tokens = batch.tokens[0].numpy()
        mrope = batch.mrope_position_ids.numpy().reshape(3, -1)
        cu, cup = batch.cu_seqlens_q.numpy(), batch.cu_seqlens_q_padded.numpy()
        want_pixels, want_image_grids, want_video_grids = [], [], []
        for k, sid in enumerate(batch.sample_ids[0]):
            messages = samples[sid]
            items = [p for p in messages[0]["content"] if p["type"] != "text"]
            images = [media / it["image"] for it in items if it["type"] == "image"]
            videos = [media / it["video"] for it in items if it["type"] == "video"]
            text = tok.apply_chat_template(messages, tokenize=False)
            ids, mm_types = hf_ids_and_types(proc, text, images, videos)
            n = int(cu[k + 1] - cu[k])
            assert tokens[cup[k] : cup[k] + n].tolist() == ids, sid
            image_grids = []
            if images:
                pil = [Image.open(p).convert("RGB") for p in images]
                hf = proc.image_processor(images=pil, return_tensors="np")
                want_pixels.append(hf["pixel_values"])
                image_grids = hf["image_grid_thw"].tolist()
            video_grids = [[int(x) for x in g] for g in hf_video_inputs(videos)["video_grid_thw"]]
            want = model_rope_index(model, ids, mm_types, image_grids, video_grids)
            np.testing.assert_array_equal(mrope[:, cup[k] : cup[k] + n], want, err_msg=sid)
            want_image_grids += image_grids
            want_video_grids += video_grids
            kinds_seen |= {it["type"] for it in items}
            seen.append(sid)
        got = batch.normalized_media_inputs()
        if want_pixels:
            assert batch.media_inputs()["pixel_values"].dtype == torch.uint8  # normalized as the trainer does
            assert np.array_equal(got["pixel_values"].numpy(), np.concatenate(want_pixels))
            assert got["image_grid_thw"].tolist() == want_image_grids
        else:
            assert "pixel_values" not in got
        if want_video_grids:
            assert got["video_grid_thw"].tolist() == want_video_grids
            patches = sum(t * h * w for t, h, w in want_video_grids)
            assert got["pixel_values_videos"].shape == (patches, 3 * 2 * 16 * 16)
            assert got["pixel_values_videos"].dtype == torch.float32
        assert "second_per_grid_ts" not in got
    assert sorted(seen) == sorted(samples)
    assert kinds_seen == {"image", "video"}
