"""Gemma 4 profile: exact against ``Gemma4Processor`` with ``Gemma4ImageProcessorPil`` and
``Gemma4AudioFeatureExtractor`` (transformers 5.24).

The oracle is built offline: a tiny byte-level BPE tokenizer with Gemma 4's special tokens, token attributes
and chat template, and the processor from its own classes with their defaults. ``Gemma4Processor`` also
takes a ``Gemma4VideoProcessor``, which needs torchvision (not installed here): it is built with none, and
no video goes through it. Images without torchvision resolve to the PIL backend, as for a user without it.

Payloads go the way a dataset's do: the source file is materialised by the write stage's
``omnipack.media.probe.materialize`` from its plan, decoded by the loader's ``decode_payload``, and turned
into encoder inputs by the trainer half.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.loader.media import decode_payload
from omnipack.media.probe import materialize, probe
from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta, MediaPlan, MediaRejected
from omnipack.profiles.gemma4 import CHAT_TEMPLATE, aspect_preserving_size, audio_soft_tokens
from omnipack.profiles.model_inputs import MediaInputOptions
from tests.family_kit import byte_level_bpe

pytest.importorskip("transformers")

PLAIN = MediaInputOptions()  # float32 pixels, built at once

GEMMA4_SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<|turn>",
    "<turn|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
]
# (height, width): landscape, portrait, square, tiny, huge, extreme strips (one side floors to 0), exact fit.
SIZES = [
    (480, 640), (640, 480), (300, 300), (20, 30), (2000, 3000), (40, 2000), (2000, 40), (720, 864), (1, 500)
]  # fmt: skip


def build_gemma4_model_dir(out_dir: str | Path, *, newline_merges: bool = False) -> Path:
    """Tokenizer (Gemma 4's special tokens, boi/eoi/image and boa/eoa/audio token attributes, chat template)
    saved as a model directory."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    newlines = ["Paragraph one.\n\nParagraph two.\n\n\nThree.\nuser\nmodel\n"] * 40 if newline_merges else []
    tok = byte_level_bpe(GEMMA4_SPECIAL_TOKENS, newlines)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|turn>", "<turn|>", "<|video|>"],
        extra_special_tokens={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


def build_processor(model_dir: str | Path, **image_kwargs):
    """``Gemma4Processor`` over the tokenizer, with the image processor and feature extractor classes'
    defaults (``image_kwargs`` overrides the image processor's), and no video processor (see the module)."""
    from transformers import AutoTokenizer
    from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4Processor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    class _Gemma4ProcessorWithoutVideo(Gemma4Processor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return _Gemma4ProcessorWithoutVideo(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessorPil(**image_kwargs),
        tokenizer=AutoTokenizer.from_pretrained(str(model_dir)),
        video_processor=None,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_gemma4_model_dir(tmp_path_factory.mktemp("gemma4"))


@pytest.fixture(scope="module")
def processor(model_dir):
    return build_processor(model_dir)


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + h * 7 + w)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * y) % 256], -1)
    return (base + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)


def _wave(n: int, seed: int = 0) -> np.ndarray:
    """A 16 kHz clip as int16-exact float32 (what soundfile reads from a PCM_16 wav)."""
    rng = np.random.default_rng(seed + n)
    t = np.arange(n) / 16000.0
    x = 0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + 0.05 * rng.standard_normal(n)
    return (np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32)


def _stored(src: Path, plan: MediaPlan) -> np.ndarray:
    """The payload the write stage stores for ``src`` under ``plan``, as the loader decodes it."""
    ext, data = materialize(src, MediaPlan.from_json(json.loads(json.dumps(plan.to_json()))))
    return decode_payload(f"media.0.{ext}", data)


def _image_file(frame: np.ndarray, tmp: Path, fmt: str = "png") -> Path:
    path = tmp / f"img-{frame.shape[0]}x{frame.shape[1]}.{fmt}"
    Image.fromarray(frame).save(path, **({"quality": 90} if fmt == "jpeg" else {}))
    return path


def _wav_file(wave: np.ndarray, tmp: Path, name: str) -> Path:
    import soundfile as sf

    path = tmp / f"{name}.wav"
    sf.write(path, wave, 16000, subtype="PCM_16")
    return path


@pytest.mark.parametrize("budget", [None, 70, 1120], ids=["default", "70", "1120"])
def test_image_pixels_positions_and_counts_match_the_image_processor(model_dir, budget, tmp_path):
    import torch

    from omnipack.loader.media import normalize_pixels

    kw = {} if budget is None else {"max_soft_tokens": budget}
    proc = build_processor(model_dir, **kw)
    prof = get_profile("gemma4", **kw)
    inputs = prof.inputs()
    for k, (h, w) in enumerate(SIZES):
        frame = _image(h, w)
        src = _image_file(frame, tmp_path, "jpeg" if k % 2 else "png")
        hf = proc.image_processor(images=[Image.open(src).convert("RGB")], return_tensors="np")
        meta = probe(src, "image")
        plan = prof.plan(meta)
        assert plan.num_tokens == int(hf["num_soft_tokens_per_image"][0]), (h, w)
        item = {"kind": "image", "info": plan.to_json()}
        stored = _stored(src, plan)
        assert stored.dtype == np.uint8 and stored.shape == (*plan.target_hw, 3)
        assert inputs.feature_count(item, stored) == plan.num_tokens
        ours = inputs.media_inputs(item, stored, PLAIN)
        pixels, want = ours["pixel_values"], hf["pixel_values"]
        assert pixels.dtype == np.float32 and pixels.shape == want.shape
        assert np.array_equal(pixels.view(np.uint32), want.view(np.uint32)), (h, w)  # bit for bit
        assert np.array_equal(ours["image_position_ids"], hf["image_position_ids"]), (h, w)
        raw = inputs.media_inputs(item, stored, MediaInputOptions(pixel_dtype="uint8"))["pixel_values"]
        mean, std = inputs.pixel_normalization()
        on_device = normalize_pixels(torch.from_numpy(raw), mean, std).numpy()
        assert np.array_equal(on_device.view(np.uint32), hf["pixel_values"].view(np.uint32)), (h, w)


def test_aspect_preserving_size_is_the_processors_rule():
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    rng = np.random.default_rng(3)
    sizes = [(1, 1), (1, 5000), (5000, 1), (47, 47), (48, 48), (10, 3000), (3000, 10)]
    sizes += [tuple(int(v) for v in rng.integers(1, 4000, 2)) for _ in range(300)]
    for budget in (70, 140, 280, 560, 1120):
        for h, w in sizes:
            try:
                want = get_aspect_ratio_preserving_size(h, w, 16, budget * 9, 3)
            except ValueError:
                with pytest.raises(MediaRejected):
                    aspect_preserving_size(h, w, 16, budget * 9, 3)
                continue
            assert aspect_preserving_size(h, w, 16, budget * 9, 3) == want, (h, w, budget)


@pytest.mark.parametrize(
    "n", [161, 320, 480, 481, 16000, 38560, 48000, 48077, 48800, 99360, 480000, 480001, 640000]
)
def test_audio_features_and_counts_match_the_feature_extractor(processor, n, tmp_path):
    prof = get_profile("gemma4")
    inputs = prof.inputs()
    wave = _wave(n)
    src = _wav_file(wave, tmp_path, f"a{n}")
    plan = prof.plan(probe(src, "audio"))
    stored = _stored(src, plan)
    assert stored.shape == (min(n, 480000),) and plan.truncate == (n > 480000)
    fe = processor.feature_extractor(raw_speech=[wave], return_tensors="np")
    mask = fe["input_features_mask"][0]
    # the processor's count: the valid-frame mask halved twice
    assert plan.num_tokens == int(mask[::2][::2].sum()) == audio_soft_tokens(int(stored.shape[0]))
    item = {"kind": "audio", "info": plan.to_json()}
    assert inputs.feature_count(item, stored) == plan.num_tokens
    got = inputs.collate_media([inputs.media_inputs(item, stored, PLAIN)], PLAIN)
    feats, got_mask = got["input_features"].numpy(), got["input_features_mask"].numpy()
    assert feats.shape == fe["input_features"].shape and got_mask.shape == fe["input_features_mask"].shape
    assert np.array_equal(feats.view(np.uint32), fe["input_features"].view(np.uint32)), n
    assert np.array_equal(got_mask, fe["input_features_mask"]), n


def test_a_batch_of_clips_is_padded_as_one_feature_extractor_call(processor, tmp_path):
    """Clips of different lengths in one batch: each one's masked frames after its own are what the
    extractor computes over the zero padding (bit for bit, the sign of zero included)."""
    prof = get_profile("gemma4")
    inputs = prof.inputs()
    lengths = [16000, 16127, 16128, 16129, 16300, 8001, 48077]
    waves = [_wave(n, seed=k) for k, n in enumerate(lengths)]
    items, stored = [], []
    for k, w in enumerate(waves):
        plan = prof.plan(probe(_wav_file(w, tmp_path, f"b{k}"), "audio"))
        items.append({"kind": "audio", "info": plan.to_json()})
        stored.append(_stored(tmp_path / f"b{k}.wav", plan))
    fe = processor.feature_extractor(raw_speech=waves, return_tensors="np")
    per_item = [inputs.media_inputs(i, s, PLAIN) for i, s in zip(items, stored, strict=True)]
    got = inputs.collate_media(per_item, PLAIN)
    assert np.array_equal(got["input_features"].numpy().view(np.uint32), fe["input_features"].view(np.uint32))
    assert np.array_equal(got["input_features_mask"].numpy(), fe["input_features_mask"])


def _conversation(kinds: list[str]) -> list[dict]:
    user = [{"type": kind, kind: f"x.{kind}"} for kind in kinds[:-1]]
    user.append({"type": "text", "text": "Describe the inputs."})
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": user},
        {"role": "assistant", "content": "The image shows a red square."},
        {"role": "user", "content": [{"type": "text", "text": "Count the objects."}, {"type": kinds[-1]}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Five dozen jugs."}]},
    ]


def _encode_both(model_dir, processor, kinds: list[str], tmp: Path):
    from omnipack.text.chat import ChatTokenizer

    prof = get_profile("gemma4")
    chat = ChatTokenizer(model_dir, prof)
    messages = _conversation(kinds)
    images, audio, plans, stored = [], [], [], []
    for k, kind in enumerate(kinds):
        if kind == "image":
            frame = _image(300 + 40 * k, 500 - 30 * k, seed=k)
            src = _image_file(frame, tmp)
            images.append(Image.open(src).convert("RGB"))
        else:
            wave = _wave(16000 + 3333 * k, seed=k)
            src = _wav_file(wave, tmp, f"c{k}")
            audio.append(wave)
        plans.append(prof.plan(probe(src, kind)))
        stored.append(_stored(src, plans[-1]))
    enc = chat.encode(messages, plans)
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False)
    hf = processor(
        images=images or None, audio=audio or None, text=text, add_special_tokens=False, return_tensors="np"
    )
    return prof, enc, hf, plans, stored


@pytest.mark.parametrize(
    "kinds",
    [["image", "image"], ["audio", "audio"], ["image", "audio", "image"]],
    ids=["images", "audio", "mixed"],
)
def test_token_ids_types_labels_and_inputs_match_the_processor(model_dir, processor, kinds, tmp_path):
    import torch

    prof, enc, hf, plans, stored = _encode_both(model_dir, processor, kinds, tmp_path)
    assert enc.input_ids.tolist() == hf["input_ids"][0].tolist()
    assert [s.num_placeholders for s in enc.spans] == [p.num_tokens for p in plans]
    inputs = prof.inputs()
    tok = processor.tokenizer
    ids = {k: [tok.convert_tokens_to_ids(t)] for k, t in (("image", "<|image|>"), ("audio", "<|audio|>"))}
    types = inputs.token_inputs(torch.from_numpy(enc.input_ids.astype(np.int64))[None], ids)
    assert types["mm_token_type_ids"][0].tolist() == hf["mm_token_type_ids"][0].tolist()
    assert types["mm_token_type_ids"].dtype == torch.int64
    items = [{"kind": p.kind, "info": p.to_json()} for p in plans]
    per_item = [inputs.media_inputs(i, s, PLAIN) for i, s in zip(items, stored, strict=True)]
    got = inputs.collate_media(per_item, PLAIN)
    assert set(got) == {k for k in hf if k in inputs.batch_keys}
    for key, value in got.items():
        assert np.array_equal(value.numpy(), hf[key]), key
    # labels: the model turns through <turn|>, never a media token
    supervised = tok.decode(enc.input_ids[1:][enc.labels[:-1] != -100])
    assert supervised == "The image shows a red square.<turn|>Five dozen jugs.<turn|>"
    for span in enc.spans:
        assert (enc.labels[max(span.start - 1, 0) : span.end - 1] == -100).all()
    assert enc.mrope_position_ids is None
    rendered = tok.decode(enc.input_ids)
    assert rendered.startswith("<bos><|turn>system\nYou are a helpful assistant.<turn|>\n<|turn>user\n")
    assert "<turn|>\n<|turn>model\nThe image shows" in rendered


def test_newline_merging_vocabulary_matches_the_processor(tmp_path):
    """Gemma's vocabulary merges newline runs: the blocks are special tokens only, so the ids around them
    are the template's own tokenization (no text is joined across a block)."""
    model_dir = build_gemma4_model_dir(tmp_path / "nl", newline_merges=True)
    proc = build_processor(model_dir)
    _, enc, hf, _, _ = _encode_both(model_dir, proc, ["image", "audio", "image"], tmp_path)
    assert enc.input_ids.tolist() == hf["input_ids"][0].tolist()


def test_profile_options_settings_and_rejects(tmp_path):
    cfg = {"max_soft_tokens": 140, "patch_size": 16, "pooling_kernel_size": 3, "resample": 3}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(cfg))
    prof = get_profile("gemma4", preprocessor_config=str(tmp_path))
    plan = prof.plan(MediaMeta(kind="image", width=640, height=480))
    assert plan.target_hw == aspect_preserving_size(480, 640, 16, 140 * 9, 3) and plan.resample == "bicubic"
    assert plan.num_tokens <= 140
    assert MediaPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    s = prof.settings()
    assert s["image"]["max_soft_tokens"] == 140 and json.loads(json.dumps(s)) == s
    call = get_profile("gemma4", preprocessor_config=str(tmp_path), max_soft_tokens=560)
    assert call.max_soft_tokens == 560  # a call's keyword wins over the config, as in the processor
    with pytest.raises(ValueError, match="max_soft_tokens must be one of"):
        get_profile("gemma4", max_soft_tokens=300)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3})
    )
    with pytest.raises(ValueError, match="normalization"):
        get_profile("gemma4", preprocessor_config=str(tmp_path))
    prof = get_profile("gemma4")
    with pytest.raises(MediaRejected, match="size unknown"):
        prof.plan(MediaMeta(kind="image", width=0, height=10))
    with pytest.raises(MediaRejected, match="video has 31 frames, fewer than the 32 sampled"):
        prof.plan(MediaMeta(kind="video", width=10, height=10, num_frames=31, fps=1.0))
    with pytest.raises(MediaRejected, match="fps or frame count unknown"):
        prof.plan(MediaMeta(kind="video", width=10, height=10, num_frames=40))
    with pytest.raises(MediaRejected, match="too short"):
        prof.plan(MediaMeta(kind="audio", num_samples=160, sample_rate=16000))
    inputs = prof.inputs()
    with pytest.raises(ValueError, match="not a multiple of 48"):
        inputs.feature_count({"kind": "image"}, np.zeros((50, 48, 3), np.uint8))
    with pytest.raises(ValueError, match="over"):
        inputs.feature_count({"kind": "audio"}, np.zeros(480001, np.int16))
    with pytest.raises(ValueError, match="pixel_dtype"):
        MediaInputOptions(pixel_dtype="float16")  # refused where the options are made
    with pytest.raises(ValueError, match="lack 'image'"):
        type(inputs).from_settings({"audio": {}})
    with pytest.raises(ValueError, match="stored video has 3 frames, expected 32"):
        inputs.feature_count({"kind": "video"}, np.zeros((3, 48, 48, 3), np.uint8))
    toks = prof.special_tokens()
    assert toks[0] == "<turn|>"
    assert {"<|image|>", "<|image>", "<image|>", "<|audio|>", "<|video|>", "<|turn>"} <= set(toks)
    assert prof.turn_start == "<|turn>" and not prof.uses_mrope()


def test_deferred_inputs_fill_the_batch_tensor_like_the_direct_path():
    inputs = get_profile("gemma4").inputs()
    stored = [_image(96, 144), _image(480, 336)]
    for dtype in ("uint8", "float32"):
        opts = MediaInputOptions(pixel_dtype=dtype)
        direct = [inputs.media_inputs({"kind": "image"}, f, opts) for f in stored]
        deferred = [
            inputs.media_inputs({"kind": "image"}, f, MediaInputOptions(pixel_dtype=dtype, deferred=True))
            for f in stored
        ]
        a, b = inputs.collate_media(direct, PLAIN), inputs.collate_media(deferred, PLAIN)
        assert a["pixel_values"].shape == (2, 2520, 768) and str(a["pixel_values"].dtype) == f"torch.{dtype}"
        assert np.array_equal(a["pixel_values"].numpy(), b["pixel_values"].numpy())
        assert np.array_equal(a["image_position_ids"].numpy(), b["image_position_ids"].numpy())


# (frames, fps, width, height): exactly 32 frames, more at a fractional-second step, over a minute long.
VIDEOS = [(32, 8, 96, 64), (45, 10, 160, 90), (70, 1, 64, 112)]


def _video_file(tmp: Path, k: int, n: int, fps: int, w: int, h: int) -> Path:
    from omnipack.demo.media import write_video

    path = tmp / f"v{k}.mp4"
    write_video(path, n=n, fps=fps, w=w, h=h)
    return path


def test_video_plan_ids_and_types_match_the_processor(model_dir, processor, tmp_path):
    """The video processor needs torchvision (absent here): its frame sampler, resize size, the processor's
    own ``replace_video_token``, replacement and token types are checked, each as the processor runs them."""
    import torch
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size
    from transformers.video_utils import VideoMetadata, default_sample_indices_fn

    from omnipack.text.chat import ChatTokenizer

    prof = get_profile("gemma4")
    chat = ChatTokenizer(model_dir, prof)
    tok = processor.tokenizer
    for k, (n, fps, w, h) in enumerate(VIDEOS):
        meta = probe(_video_file(tmp_path, k, n, fps, w, h), "video")
        plan = prof.plan(meta)
        hf_meta = VideoMetadata(total_num_frames=n, fps=float(fps), width=w, height=h)
        indices = default_sample_indices_fn(hf_meta, num_frames=32)
        assert list(plan.frame_indices) == indices.tolist()
        th, tw = get_aspect_ratio_preserving_size(h, w, 16, 70 * 9, 3)
        assert plan.target_hw == (th, tw) and plan.num_tokens == 32 * (th // 16) * (tw // 16) // 9
        hf_meta.frames_indices = indices
        replacement = processor.replace_video_token(
            {"num_soft_tokens_per_video": [plan.num_tokens // 32], "video_metadata": [hf_meta]}, 0
        )
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "What happens?"}, {"type": "video"}]},
            {"role": "assistant", "content": "A colour fades."},
        ]
        enc = chat.encode(messages, [plan])
        text = tok.apply_chat_template(messages, tokenize=False)
        expanded, _ = processor.get_text_with_replacements([text], videos_replacements=[replacement])
        ids = tok(expanded, add_special_tokens=False)["input_ids"]
        assert enc.input_ids.tolist() == ids[0], k
        assert ("01:07 <|image>" in replacement) == (k == 2)  # minutes past the first
        inputs = prof.inputs()
        ids_by_kind = {"video": [tok.convert_tokens_to_ids("<|video|>")]}
        types = inputs.token_inputs(torch.from_numpy(enc.input_ids.astype(np.int64))[None], ids_by_kind)
        assert types["mm_token_type_ids"][0].tolist() == processor.create_mm_token_type_ids(ids)[0]
        assert enc.spans[0].num_placeholders == plan.num_tokens


def test_video_pixels_are_each_stored_frame_patchified_as_the_processor_does(tmp_path):
    """Stored frames (sampled and resized at prepare time) -> ``pixel_values_videos``: each frame's patches
    and positions as the Gemma 4 patchifier gives them at the video budget (70 soft tokens)."""
    import torch
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from omnipack.loader.media import normalize_pixels

    prof = get_profile("gemma4")
    inputs = prof.inputs()
    patchifier = Gemma4ImageProcessorPil(max_soft_tokens=70, do_resize=False)
    for k, (n, fps, w, h) in enumerate(VIDEOS):
        src = _video_file(tmp_path, k, n, fps, w, h)
        plan = prof.plan(probe(src, "video"))
        item = {"kind": "video", "info": plan.to_json()}
        stored = _stored(src, plan)
        frames = stored["frames"]
        assert frames.shape == (32, *plan.target_hw, 3)
        assert inputs.feature_count(item, stored) == plan.num_tokens
        got = inputs.collate_media([inputs.media_inputs(item, stored, PLAIN)], PLAIN)
        want = patchifier(images=[Image.fromarray(f) for f in frames], return_tensors="np")
        pixels = got["pixel_values_videos"].numpy()
        assert np.array_equal(pixels.view(np.uint32), want["pixel_values"].view(np.uint32))
        assert np.array_equal(got["video_position_ids"].numpy(), want["image_position_ids"])
        assert got["num_frames_per_video"].tolist() == [32]
        raw = inputs.media_inputs(item, stored, MediaInputOptions(pixel_dtype="uint8"))["pixel_values_videos"]
        on_device = normalize_pixels(torch.from_numpy(raw), *inputs.pixel_normalization()).numpy()
        assert np.array_equal(on_device.view(np.uint32), want["pixel_values"].view(np.uint32))
