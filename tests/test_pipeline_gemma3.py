"""Gemma 3 end to end: ``omnipack prepare`` -> ``omnipack verify`` -> the Energon loader, every packed sample
and every batch's pixels checked against ``Gemma3Processor`` (loaded with ``AutoProcessor`` from a model
directory built offline), with pan-and-scan on so images with and without crops share rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnipack.cli import main
from omnipack.loader.media import decode_payload
from omnipack.profiles import MediaMeta, get_profile
from tests.family_kit import (
    assert_packed_but_the_missing,
    chat_samples,
    noise_images,
    prepare_family_corpus,
    val_batches,
    write_manifest,
)
from tests.test_profiles_gemma3 import build_gemma_model_dir

pytest.importorskip("megatron.energon")

# (height, width) of the source images: 3, 0, 2, 0, 4 and 0 pan-and-scan crops.
SIZES = [(300, 900), (480, 400), (700, 260), (64, 64), (300, 1200), (20, 30)]
PAS = {"do_pan_and_scan": True}


def _corpus(root: Path, n: int = 14) -> tuple[Path, Path, dict[str, list[dict]]]:
    media = root / "media"
    files = [(f"img{k}.png", h, w) for k, (h, w) in enumerate(SIZES)]
    images = noise_images(media, np.random.default_rng(0), files)
    samples = chat_samples(
        "g", n, "image", images, "Describe the picture {}.", "The image shows a red square.",
        follow_up=("img0.png", "Count the objects."), answer_parts=False, answer_repeats=4,
    )  # fmt: skip
    return write_manifest(root, samples, missing="nope.png"), media, samples


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3_e2e")
    model_dir = build_gemma_model_dir(root / "model", newline_merges=True)  # as Gemma's vocabulary
    options = ("--profile-option", "do_pan_and_scan=true", "--seq-length", "4096", "--cp", "2")
    return prepare_family_corpus(root, model_dir, _corpus, "gemma3", *options)


def test_prepare_records_the_family_and_rejects_with_reasons(prepared):
    _, _, samples, out = prepared
    meta = assert_packed_but_the_missing(out, samples, "missing image file")
    assert meta["profile"]["name"] == "gemma3" and meta["profile"]["options"] == PAS
    assert meta["profile"]["settings"]["pan_and_scan"]["enabled"] is True
    assert meta["mrope_position_ids"] is False


def test_verify_passes(prepared):
    assert main(["verify", str(prepared[3]), "--workers", "1"]) == 0


def test_loader_batches_equal_the_processor_sample_by_sample(prepared):
    from transformers import AutoProcessor

    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    model_dir, media, samples, out = prepared
    proc = AutoProcessor.from_pretrained(str(model_dir))
    te = OmnipackTaskEncoder.from_dataset(out)
    planner = get_profile("gemma3", **PAS)
    soft_id = proc.tokenizer.image_token_id
    assert te.placeholder_ids == {"image": [soft_id]}
    seen, crops_seen = [], set()
    for batch in val_batches(out, te, workers=1):
        tokens = batch.tokens[0].numpy()
        cu, cup = batch.cu_seqlens_q.numpy(), batch.cu_seqlens_q_padded.numpy()
        expected_pixels = []
        for k, sid in enumerate(batch.sample_ids[0]):
            messages = samples[sid]
            paths = [p["image"] for m in messages if not isinstance(m["content"], str) for p in m["content"]
                     if p["type"] == "image"]  # fmt: skip
            images = [Image.open(media / p).convert("RGB") for p in paths]
            text = proc.tokenizer.apply_chat_template(messages, tokenize=False)
            hf = proc(images=images or None, text=text, add_special_tokens=False, return_tensors="np", **PAS)
            n = int(cu[k + 1] - cu[k])
            assert tokens[cup[k] : cup[k] + n].tolist() == hf["input_ids"][0].tolist(), sid
            # the model's token_type_ids travel with the batch (an HF forward attends images causally without)
            type_ids = batch.as_dict()["token_type_ids"][0].numpy()
            assert type_ids[cup[k] : cup[k] + n].tolist() == hf["token_type_ids"][0].tolist(), sid
            if images:
                expected_pixels.append(hf["pixel_values"])
                # coverage: which crop counts these rows hold (the processor does not return num_crops)
                crops_seen |= {
                    planner.plan(MediaMeta("image", im.width, im.height)).info["num_crops"]
                    for im in images
                }
            seen.append(sid)
        got = batch.normalized_media_inputs()
        if expected_pixels:
            want = np.concatenate(expected_pixels)
            assert batch.media_inputs()["pixel_values"].dtype == torch.uint8  # 4x fewer bytes; normalized as the trainer does
            assert np.array_equal(got["pixel_values"].numpy(), want)
            assert int((tokens == soft_id).sum()) == 256 * want.shape[0]
        else:
            assert "pixel_values" not in got
        # Each view is one run of soft tokens (token_type_ids 1), bounded by its own markers.
        runs = np.flatnonzero(np.diff(np.concatenate([[0], (tokens == soft_id).astype(np.int8)])) == 1)
        assert len(runs) == (want.shape[0] if expected_pixels else 0)
        for row_items in batch.row_meta:
            assert row_items is not None
    assert sorted(seen) == sorted(samples)
    assert {0, 2, 3, 4} <= crops_seen


def test_stored_payloads_are_the_image_processors_views(prepared):
    """Every stored image is its views as ``Gemma3ImageProcessor`` resizes them (uint8, channel-last), so
    the loader only transposes and normalizes."""
    from transformers import AutoProcessor

    from omnipack.dataset.codec import decode_row
    from tests.test_pipeline import read_rows_from_tars

    model_dir, media, _, out = prepared
    proc = AutoProcessor.from_pretrained(str(model_dir))
    checked = 0
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for m in row.media:
            stored = np.asarray(decode_payload(m.part, parts[m.part]))
            boxes = m.info["image_views"]
            h, w = boxes[0][2], boxes[0][3]
            src = next(p for p in sorted(media.glob("*.png")) if Image.open(p).size == (w, h))
            hf = proc.image_processor(
                images=[Image.open(src).convert("RGB")],
                return_tensors="np",
                **{**type(proc).images_kwargs, **PAS, "do_normalize": False},
            )["pixel_values"]
            views = stored if stored.ndim == 4 else stored[None]
            assert views.dtype == np.uint8 and views.shape == (len(boxes), 896, 896, 3)
            # unnormalized, the processor's pixels are the resized uint8 values times 1/255
            assert np.array_equal(views.transpose(0, 3, 1, 2).astype(np.float32) / 255, hf.astype(np.float32))
            checked += 1
    assert checked
