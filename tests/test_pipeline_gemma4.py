"""Gemma 4 end to end: ``omnipack prepare`` -> ``omnipack verify`` -> the Energon loader, every packed sample
and every batch's encoder inputs checked against ``Gemma4Processor`` (built offline as in
``tests/test_profiles_gemma4.py``), with images (PNG and JPEG), audio (wav) and video (mp4) sharing rows,
and the same dataset loaded by a process that cannot import the prepare stack. The video processor needs
torchvision (absent here): a video sample's expected ids come from the processor's own replacement of the
sampled frames, its pixels from the Gemma 4 patchifier over those frames resized with PIL bicubic."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnipack.cli import main
from tests.family_kit import (
    assert_packed_but_the_missing,
    noise_images,
    prepare_family_corpus,
    val_batches,
    write_manifest,
)
from tests.test_profiles_gemma4 import build_gemma4_model_dir, build_processor

pytest.importorskip("megatron.energon")

ROOT = Path(__file__).parents[1]
# (height, width) of the source images, and sample counts of the 16 kHz clips (one over 30 s: truncated).
SIZES = [(300, 900), (480, 400), (700, 260), (64, 64), (20, 30)]
CLIPS = [16000, 8001, 23456, 480000 + 3200]
# (frames, fps, width, height) of the mp4 videos.
VIDEOS = [(40, 10, 64, 48), (33, 8, 48, 80)]


def _corpus(root: Path, n: int = 12) -> tuple[Path, Path, dict[str, list[dict]]]:
    import soundfile as sf

    rng = np.random.default_rng(0)
    media = root / "media"
    noise_images(media, rng, [(f"img{k}.{'jpg' if k % 2 else 'png'}", *hw) for k, hw in enumerate(SIZES)])
    for k, num in enumerate(CLIPS):
        t = np.arange(num) / 16000
        wave = 0.3 * np.sin(2 * np.pi * (200 + 90 * k) * t) + 0.02 * rng.standard_normal(num)
        sf.write(media / f"clip{k}.wav", wave, 16000, subtype="PCM_16")
    from omnipack.demo.media import write_video

    for k, (num, fps, w, h) in enumerate(VIDEOS):
        write_video(media / f"vid{k}.mp4", n=num, fps=fps, w=w, h=h)
    names = sorted(p.name for p in media.iterdir())
    images = [p for p in names if p.startswith("img")]
    clips = [p for p in names if p.startswith("clip")]
    samples: dict[str, list[dict]] = {}
    for i in range(n):
        user: list[dict] = [{"type": "image", "image": images[(i + j) % len(images)]} for j in range(i % 3)]
        user += [{"type": "audio", "audio": clips[(i // 2) % len(clips)]} for _ in range((i + 1) % 2)]
        if i % 4 == 3:  # video samples hold no other media (the processor call is rebuilt for them)
            user = [{"type": "video", "video": f"vid{(i // 4) % len(VIDEOS)}.mp4"}]
        user.append({"type": "text", "text": f"Describe input {i}."})
        msgs = [
            {"role": "user", "content": user},
            {"role": "assistant", "content": "The image shows a red square." * (1 + i % 3)},
        ]
        samples[f"g-{i:03d}"] = msgs
    return write_manifest(root, samples, missing="nope.wav"), media, samples


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4_e2e")
    model_dir = build_gemma4_model_dir(root / "model", newline_merges=True)
    return prepare_family_corpus(root, model_dir, _corpus, "gemma4", "--seq-length", "4096", "--cp", "2")


def test_prepare_records_the_family_and_rejects_with_reasons(prepared):
    _, _, samples, out = prepared
    meta = assert_packed_but_the_missing(out, samples, "missing")
    assert meta["profile"]["name"] == "gemma4"
    assert meta["profile"]["settings"]["image"]["max_soft_tokens"] == 280
    assert meta["mrope_position_ids"] is False


def test_verify_passes(prepared):
    assert main(["verify", str(prepared[3]), "--workers", "1"]) == 0


def _media(messages: list[dict], media: Path) -> tuple[list, list]:
    import soundfile as sf

    parts = [p for m in messages if not isinstance(m["content"], str) for p in m["content"]]
    images = [Image.open(media / p["image"]).convert("RGB") for p in parts if p["type"] == "image"]
    audio = [sf.read(media / p["audio"], dtype="float32")[0] for p in parts if p["type"] == "audio"]
    return images, audio


def _video_expected(proc, text: str, path: Path) -> tuple[dict, np.ndarray]:
    """What ``Gemma4Processor`` gives for a video-only sample, without its torchvision video processor: the
    class's frame sampler over PyAV's decoded frames, each resized (PIL bicubic) to the processor's size and
    patchified by the Gemma 4 patchifier at the video budget, and the processor's own replacement, ids and
    token types."""
    import av
    from transformers.models.gemma4.image_processing_pil_gemma4 import (
        Gemma4ImageProcessorPil,
        get_aspect_ratio_preserving_size,
    )
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    with av.open(str(path)) as c:
        fps = float(c.streams.video[0].average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    meta = VideoMetadata(total_num_frames=len(frames), fps=fps)
    meta.frames_indices = default_sample_indices_fn(meta, num_frames=32)
    h, w = frames[0].shape[:2]
    th, tw = get_aspect_ratio_preserving_size(h, w, 16, 70 * 9, 3)
    sampled = [
        Image.fromarray(frames[i]).resize((tw, th), Image.Resampling.BICUBIC) for i in meta.frames_indices
    ]
    pixels = Gemma4ImageProcessorPil(max_soft_tokens=70, do_resize=False)(images=sampled, return_tensors="np")
    per_frame = (th // 16) * (tw // 16) // 9
    inputs = {"num_soft_tokens_per_video": [per_frame], "video_metadata": [meta]}
    replacement = proc.replace_video_token(inputs, 0)
    expanded, _ = proc.get_text_with_replacements([text], videos_replacements=[replacement])
    ids = proc.tokenizer(expanded, add_special_tokens=False)["input_ids"]
    types = proc.create_mm_token_type_ids(ids)
    return {"input_ids": np.asarray(ids), "mm_token_type_ids": np.asarray(types)}, pixels


def test_loader_batches_equal_the_processor_sample_by_sample(prepared):
    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    model_dir, media, samples, out = prepared
    proc = build_processor(model_dir)
    te = OmnipackTaskEncoder.from_dataset(out)
    tok = proc.tokenizer
    ids = {k: [tok.convert_tokens_to_ids(f"<|{k}|>")] for k in ("image", "video", "audio")}
    assert te.placeholder_ids == ids
    assert te.pixel_dtype == "uint8"  # x / 255: mean 0, std 1 for every channel
    seen, kinds_seen, truncated_seen = [], set(), False
    videos = {}
    for batch in val_batches(out, te, workers=1):
        tokens = batch.tokens[0].numpy()
        cu, cup = batch.cu_seqlens_q.numpy(), batch.cu_seqlens_q_padded.numpy()
        row_images, row_audio, row_video = [], [], []
        for k, sid in enumerate(batch.sample_ids[0]):
            messages = samples[sid]
            images, audio = _media(messages, media)
            text = tok.apply_chat_template(messages, tokenize=False)
            video = next((p["video"] for p in messages[0]["content"] if p["type"] == "video"), None)
            if video is not None:
                if video not in videos:
                    videos[video] = _video_expected(proc, text, media / video)
                hf, pixels = _video_expected(proc, text, media / video)[0], videos[video][1]
                row_video.append(pixels)
                kinds_seen.add("video")
            else:
                hf = proc(
                    images=images or None, audio=audio or None, text=text, add_special_tokens=False,
                    return_tensors="np",
                )  # fmt: skip
            n = int(cu[k + 1] - cu[k])
            assert tokens[cup[k] : cup[k] + n].tolist() == hf["input_ids"][0].tolist(), sid
            types = batch.as_dict()["mm_token_type_ids"][0].numpy()
            assert types[cup[k] : cup[k] + n].tolist() == hf["mm_token_type_ids"][0].tolist(), sid
            row_images += images
            row_audio += audio
            kinds_seen |= {"image"} if images else set()
            kinds_seen |= {"audio"} if audio else set()
            truncated_seen |= any(len(a) > 480000 for a in audio)
            seen.append(sid)
        got = batch.normalized_media_inputs()
        if row_images:  # one image processor call over the row's images gives the batch's pixels
            want = proc.image_processor(images=row_images, return_tensors="np")
            assert batch.media_inputs()["pixel_values"].dtype == torch.uint8
            pixels = got["pixel_values"].numpy()
            assert np.array_equal(pixels.view(np.uint32), want["pixel_values"].view(np.uint32))
            assert np.array_equal(got["image_position_ids"].numpy(), want["image_position_ids"])
        else:
            assert "pixel_values" not in got
        if row_audio:  # and one feature extractor call over its clips (padded to the longest) its features
            want = proc.feature_extractor(raw_speech=row_audio, return_tensors="np")
            feats = got["input_features"].numpy()
            assert np.array_equal(feats.view(np.uint32), want["input_features"].view(np.uint32))
            assert np.array_equal(got["input_features_mask"].numpy(), want["input_features_mask"])
        else:
            assert "input_features" not in got
        if row_video:  # the frames of the row's videos, in order, and each video's frame count
            want_pixels = np.concatenate([p["pixel_values"] for p in row_video])
            pixels = got["pixel_values_videos"].numpy()
            assert np.array_equal(pixels.view(np.uint32), want_pixels.view(np.uint32))
            want_pos = np.concatenate([p["image_position_ids"] for p in row_video])
            assert np.array_equal(got["video_position_ids"].numpy(), want_pos)
            assert got["num_frames_per_video"].tolist() == [32] * len(row_video)
        else:
            assert "pixel_values_videos" not in got
    assert sorted(seen) == sorted(samples)
    assert kinds_seen == {"image", "audio", "video"} and truncated_seen


def test_trainer_only_process_loads_the_same_batches(prepared):
    """A process that cannot import transformers, PyAV, decord, tokenizers, soundfile or soxr (and where
    omnipack may not import pillow) loads the dataset with only the gemma4 family module, to the same
    bytes."""
    from tests.test_profiles_split import BLOCKER
    from tests.trainer_only_check import batch_digests

    out = prepared[3]
    code = BLOCKER + textwrap.dedent(
        f"""
        import json
        from tests.trainer_only_check import batch_digests
        digests = batch_digests({str(out)!r})
        fams = sorted(m for m in sys.modules if m.startswith("omnipack.profiles.") and m.count(".") == 2)
        fams = [m for m in fams if getattr(sys.modules[m], "PROFILE", None) is not None]  # family modules
        assert fams == ["omnipack.profiles.gemma4"], fams
        print(json.dumps(digests))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == batch_digests(out)
