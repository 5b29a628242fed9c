"""Qwen3.5 profile: exact against the transformers 5.24 classes a Qwen3.5 release resolves to.

The oracle is a tiny Qwen3.5 model directory built offline (``tests/qwen3_5_model.py``): ``Qwen3_5Tokenizer``,
the released preprocessor configs and a ``Qwen3_5Config``. Images go through ``Qwen3VLProcessor``'s own
``__call__`` with the ``Qwen2VLImageProcessorPil`` that ``AutoImageProcessor`` loads; video blocks through its
``replace_video_token`` with ``Qwen3VLVideoProcessor``'s sampling and sizing functions (its pixel path needs
torchvision: ``tests/test_hf_video_processors.py`` runs it where installed). Positions are
``Qwen3_5Model.get_rope_index`` of a real (tiny, random) model, and a packed row's logits equal each
sample's own.

Pixels go the way a dataset's do: the source file is materialised by the write stage's
``omnipack.media.probe.materialize`` from its plan, decoded by the loader's ``decode_payload``, and turned
into encoder inputs by the trainer half built from the recorded settings.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.demo.media import write_video
from omnipack.loader.media import decode_payload, normalize_pixels
from omnipack.media.probe import materialize, probe
from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta, MediaPlan
from omnipack.profiles.model_inputs import MediaInputOptions
from tests.hf_oracles import import_hf
from tests.qwen3_5_model import (
    RELEASED_VIDEO_PREPROCESSOR_CONFIG,
    build_qwen35_model_dir,
    hf_ids_and_types,
    hf_video_inputs,
    model_rope_index,
    qwen35_processor,
    tiny_config,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("av")

# (height, width, format): landscape, portrait, below the minimum pixel budget, odd sizes.
IMAGES = [(480, 640, "png"), (300, 200, "jpeg"), (37, 53, "png"), (721, 1279, "jpeg"), (16, 300, "png")]
# (frames, fps, width, height): odd frame counts, a portrait clip, fewer frames than min_frames.
CLIPS = [(13, 10, 160, 96), (30, 15, 96, 128), (3, 10, 64, 64)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_qwen35_model_dir(tmp_path_factory.mktemp("qwen3_5"))


@pytest.fixture(scope="module")
def processor(model_dir):
    proc = qwen35_processor(model_dir)
    assert type(proc.image_processor).__name__ == "Qwen2VLImageProcessorPil"
    assert type(proc.tokenizer).__name__ == "Qwen3_5Tokenizer"
    return proc


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, list[Path]]:
    d = tmp_path_factory.mktemp("media")
    images = []
    for k, (h, w, fmt) in enumerate(IMAGES):
        rng = np.random.default_rng(k)
        y, x = np.mgrid[0:h, 0:w]
        px = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * y) % 256], -1)
        px = (px + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)
        p = d / f"img{k}.{'jpg' if fmt == 'jpeg' else fmt}"
        Image.fromarray(px).save(p, format=fmt.upper())
        images.append(p)
    clips = []
    for k, (n, fps, w, h) in enumerate(CLIPS):
        p = d / f"clip{k}.mp4"
        write_video(p, n=n, fps=fps, w=w, h=h)
        clips.append(p)
    return {"image": images, "video": clips}


@pytest.fixture(scope="module")
def model(model_dir):
    """A tiny random ``Qwen3_5ForConditionalGeneration`` from the directory's config."""
    from transformers import AutoConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    return Qwen3_5ForConditionalGeneration(AutoConfig.from_pretrained(str(model_dir))).eval()


def _stored(path: Path, plan: MediaPlan) -> np.ndarray:
    """The payload the write stage stores for ``path`` under ``plan`` (JSON round trip), as the loader
    decodes it."""
    ext, data = materialize(path, MediaPlan.from_json(json.loads(json.dumps(plan.to_json()))))
    return decode_payload(f"media.0.{ext}", data)


def _messages(kinds: list[str]) -> list[dict]:
    content: list[dict] = [{"type": "text", "text": "Look:"}]
    for i, kind in enumerate(kinds):
        content += [{"type": kind, kind: f"m{i}"}, {"type": "text", "text": f" item {i}."}]
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": content},
        {"role": "assistant", "content": "The image shows a red square."},
        {"role": "user", "content": [{"type": "text", "text": "Count the objects."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Five dozen jugs."}]},
    ]


# ---- defaults at every level ----


def test_defaults_are_the_released_configs(model_dir, processor):
    """The profile's defaults equal a Qwen3.5 release's preprocessor configs read by the profile, and the
    image processor ``AutoImageProcessor`` builds from them."""
    prof = get_profile("qwen3_5")
    from_release = get_profile(
        "qwen3_5",
        preprocessor_config=str(model_dir),
        video_preprocessor_config=str(model_dir / "video_preprocessor_config.json"),
    )
    assert from_release.settings() == prof.settings()
    ip = processor.image_processor
    s = prof.image
    assert (ip.patch_size, ip.merge_size) == (s.patch_size, s.merge_size)
    assert ip.temporal_patch_size == s.temporal_patch_size
    assert (ip.size["shortest_edge"], ip.size["longest_edge"]) == (s.min_pixels, s.max_pixels)
    assert tuple(ip.image_mean) == prof.image_mean and tuple(ip.image_std) == prof.image_std
    size = RELEASED_VIDEO_PREPROCESSOR_CONFIG["size"]
    assert (prof.video.min_pixels, prof.video.max_pixels) == (size["shortest_edge"], size["longest_edge"])


def test_video_sampling_and_sizes_match_the_video_processor():
    """``Qwen3VLVideoProcessor.sample_frames`` (class defaults: 2 fps, 4..768 frames) and
    ``get_num_of_video_patches`` under the released size, and under the class's own size (the named rule:
    ``video_min_pixels`` / ``video_max_pixels``)."""
    import itertools

    from transformers.video_utils import VideoMetadata

    m = import_hf("models.qwen3_vl.video_processing_qwen3_vl")
    cls = m.Qwen3VLVideoProcessor
    released = RELEASED_VIDEO_PREPROCESSOR_CONFIG["size"]
    for size, opts in [
        (released, {}),
        (cls.size, {
            "video_min_pixels": cls.size["shortest_edge"], "video_max_pixels": cls.size["longest_edge"]
        }),
    ]:
        prof = get_profile("qwen3_5", **opts)
        proc = object.__new__(cls)
        proc.fps, proc.num_frames = cls.fps, cls.num_frames
        stub = types.SimpleNamespace(
            size=size, patch_size=16, merge_size=2, temporal_patch_size=2,
            cap_pixels_per_frame=cls.cap_pixels_per_frame, max_video_tokens=cls.max_video_tokens,
        )  # fmt: skip
        for total, fps in itertools.product([1, 3, 4, 13, 30, 61, 300, 2999], [8.0, 23.976, 30.0]):
            meta = VideoMetadata(total_num_frames=total, fps=fps, width=64, height=48, duration=total / fps)
            want = [int(i) for i in cls.sample_frames(proc, meta)]
            assert prof.sample_video_frames(total, fps) == want, (total, fps)
        sizes = [(48, 64), (96, 160), (1080, 1920), (2160, 3840), (31, 400)]
        for (h, w), n in itertools.product(sizes, [2, 4, 9, 64]):
            rh, rw = prof.video_resize(n, h, w)
            want = cls.get_num_of_video_patches(stub, n, h, w)
            assert -(-n // 2) * (rh // 16) * (rw // 16) == want, (size, h, w, n)
    # the two budgets differ (the README's rule): the release keeps more pixels of a large frame
    assert get_profile("qwen3_5").video_resize(8, 1080, 1920) != get_profile(
        "qwen3_5", video_min_pixels=cls.size["shortest_edge"], video_max_pixels=cls.size["longest_edge"]
    ).video_resize(8, 1080, 1920)


# ---- images: ids, pixels, grids, positions ----


def test_image_pixels_match_the_image_processor(processor, media):
    prof = get_profile("qwen3_5")
    inputs = prof.inputs()
    mean, std = inputs.pixel_normalization()
    for path in media["image"]:
        meta = probe(path, "image")
        plan = prof.plan(meta)
        hf = processor.image_processor(images=[Image.open(path).convert("RGB")], return_tensors="np")
        assert tuple(int(x) for x in hf["image_grid_thw"][0]) == plan.grid_thw, path.name
        stored = _stored(path, plan)
        item = {"kind": "image", "info": plan.to_json()}
        assert inputs.feature_count(item, stored) == plan.num_tokens == hf["pixel_values"].shape[0] // 4
        ours = inputs.media_inputs(item, stored, MediaInputOptions())
        assert ours["pixel_values"].dtype == np.float32
        assert np.array_equal(ours["pixel_values"], hf["pixel_values"]), path.name
        assert ours["image_grid_thw"].tolist() == hf["image_grid_thw"].tolist()
        raw = inputs.media_inputs(item, stored, MediaInputOptions(pixel_dtype="uint8"))["pixel_values"]
        on_device = normalize_pixels(torch.from_numpy(raw), mean, std).numpy()
        assert np.array_equal(on_device, hf["pixel_values"]), path.name


def test_image_sample_ids_labels_and_mrope_match_processor_and_model(model_dir, processor, media, model):
    from omnipack.text.chat import ChatTokenizer

    prof = get_profile("qwen3_5")
    chat = ChatTokenizer(model_dir, prof, mrope=True)
    paths = media["image"][:3]
    plans = [prof.plan(probe(p, "image")) for p in paths]
    messages = _messages(["image"] * len(paths))
    enc = chat.encode(messages, plans)
    tok = processor.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False)
    hf = processor(images=[Image.open(p).convert("RGB") for p in paths], text=[text], return_tensors="np")
    assert enc.input_ids.tolist() == hf["input_ids"][0].tolist()
    assert [tuple(g) for g in hf["image_grid_thw"].tolist()] == [p.grid_thw for p in plans]
    ids, types_ = hf["input_ids"][0].tolist(), hf["mm_token_type_ids"][0].tolist()
    want = model_rope_index(model, ids, types_, hf["image_grid_thw"].tolist(), [])
    assert enc.mrope_position_ids.dtype == np.int32
    np.testing.assert_array_equal(enc.mrope_position_ids, want)
    # labels: each assistant turn's text through <|im_end|>; the last turn's thinking block is the template's
    ids, labels = enc.input_ids, enc.labels
    runs, cur = [], []
    for p in range(len(ids) - 1):
        if labels[p] != -100:
            assert labels[p] == ids[p + 1]
            cur.append(int(labels[p]))
        elif cur:
            runs.append(cur)
            cur = []
    runs += [cur] if cur else []
    assert [tok.decode(r) for r in runs] == [
        "The image shows a red square.<|im_end|>",
        "Five dozen jugs.<|im_end|>",
    ]
    assert "<think>\n\n</think>\n\nFive dozen jugs." in tok.decode(ids)


# ---- video: ids, grids, stored frames, positions ----


def test_video_sample_ids_and_mrope_match_processor_and_model(model_dir, processor, media, model):
    from omnipack.text.chat import ChatTokenizer

    prof = get_profile("qwen3_5")
    chat = ChatTokenizer(model_dir, prof, mrope=True)
    kinds = ["video", "image", "video", "video"]
    paths = [media["video"][0], media["image"][1], media["video"][1], media["video"][2]]
    plans = [prof.plan(probe(p, k)) for p, k in zip(paths, kinds, strict=True)]
    messages = _messages(kinds)
    enc = chat.encode(messages, plans)
    tok = processor.tokenizer
    text = tok.apply_chat_template(messages, tokenize=False)
    videos = [p for p, k in zip(paths, kinds, strict=True) if k == "video"]
    ids, mm_types = hf_ids_and_types(processor, text, [paths[1]], videos)
    assert enc.input_ids.tolist() == ids
    video_grids = [tuple(int(x) for x in g) for g in hf_video_inputs(videos)["video_grid_thw"]]
    assert video_grids == [p.grid_thw for p in plans if p.kind == "video"]
    n_vs = ids.count(tok.convert_tokens_to_ids("<|vision_start|>"))
    assert n_vs == sum(g[0] for g in video_grids) + len(plans)  # frame groups + blocks
    image_grids = processor.image_processor(images=[Image.open(paths[1]).convert("RGB")])["image_grid_thw"]
    want = model_rope_index(model, ids, mm_types, image_grids.tolist(), video_grids)
    np.testing.assert_array_equal(enc.mrope_position_ids, want)
    inputs = prof.inputs()
    for path, plan in zip(paths, plans, strict=True):
        if plan.kind != "video":
            continue
        stored = _stored(path, plan)
        frames = stored["frames"] if isinstance(stored, dict) else stored
        assert frames.shape[:3] == (len(plan.frame_indices), *plan.target_hw)
        item = {"kind": "video", "info": plan.to_json()}
        assert inputs.feature_count(item, stored) == plan.num_tokens
        out = inputs.media_inputs(item, stored, MediaInputOptions())
        assert tuple(out["video_grid_thw"][0]) == plan.grid_thw
        assert out["pixel_values_videos"].shape == (plan.vision_patches, 3 * 2 * 16 * 16)
        assert "second_per_grid_ts" not in out  # time is timestamp text


def _write_textured_video(path: Path, n: int, fps: int, w: int, h: int) -> None:
    """A lossless libx264 mp4 whose frames differ pixel by pixel (moving gradients plus noise)."""
    import av

    rng = np.random.default_rng(n * 31 + w)
    y, x = np.mgrid[0:h, 0:w]
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"crf": "0"}
        for i in range(n):
            f = np.stack([(x * 3 + i * 7) % 256, (y * 5 + i * 11) % 256, (x * y + i) % 256], -1)
            f = (f + rng.integers(0, 30, (h, w, 3))).clip(0, 255).astype(np.uint8)
            for pk in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)


@pytest.mark.parametrize("clip", [(13, 10, 160, 96), (30, 15, 96, 128), (5, 4, 64, 32)])
def test_video_frames_and_patches_match_the_video_processor(tmp_path, clip):
    """Frames whose sides the processor keeps (multiples of 32 within the budget): the stored frames are
    transformers' ``load_video`` decode at ``Qwen3VLVideoProcessor.sample_frames``' indices bit for bit, and
    the trainer half's ``pixel_values_videos`` are its ``patchify`` of them (the last frame repeated to the
    temporal patch): the uint8 layout exactly, the float32 values within 2**-24 of its fused
    ``(x - 255*mean) / (255*std)`` (omnipack normalizes as the image processor, ``(x/255 - mean) / std``)."""
    from transformers.video_utils import load_video

    m = import_hf("models.qwen3_vl.video_processing_qwen3_vl")
    n, fps, w, h = clip
    path = tmp_path / "clip.mp4"
    _write_textured_video(path, n, fps, w, h)
    prof = get_profile("qwen3_5")
    plan = prof.plan(probe(path, "video"))
    assert plan.target_hw == (h, w)  # no resize: the pixels are comparable
    stored = _stored(path, plan)
    frames = stored["frames"] if isinstance(stored, dict) else stored
    decoded, _ = load_video(str(path), backend="pyav")
    indices = [int(i) for i in hf_video_inputs([path])["video_metadata"][0].frames_indices]
    assert np.array_equal(frames[: len(indices)], decoded[indices])
    assert (frames[len(indices) :] == decoded[indices[-1]]).all()  # padding repeats the last frame

    video = torch.from_numpy(decoded[indices]).permute(0, 3, 1, 2)[None]  # [1, T, C, H, W] as the processor
    item = {"kind": "video", "info": plan.to_json()}
    inputs = prof.inputs()
    raw = inputs.media_inputs(item, stored, MediaInputOptions(pixel_dtype="uint8"))["pixel_values_videos"]
    want_raw, gt, gh, gw = m.Qwen3VLVideoProcessor.patchify(None, video.float(), 16, 2, 2)
    assert (gt, gh, gw) == plan.grid_thw
    assert np.array_equal(raw.astype(np.float32), want_raw[0].numpy())
    mean = torch.tensor(prof.image_mean) * (1.0 / (1 / 255))  # the processor's fused rescale + normalize
    std = torch.tensor(prof.image_std) * (1.0 / (1 / 255))
    normalized = (video.float() - mean[:, None, None]) / std[:, None, None]
    want, *_ = m.Qwen3VLVideoProcessor.patchify(None, normalized, 16, 2, 2)
    ours = inputs.media_inputs(item, stored, MediaInputOptions())["pixel_values_videos"]
    # each side rounds once or twice near (2x - 255) / 255: at most 2**-24 apart (half an ulp of 1.0)
    assert np.abs(ours - want[0].numpy()).max() <= 2.0**-24


# ---- a packed row through the model ----


def test_packed_row_logits_equal_each_samples_own(model_dir, processor, media):
    """Two samples packed into one row with omnipack's per-sample mRoPE positions (and text positions
    restarting per sample, from which transformers builds the block-diagonal mask) give each sample's own
    logits. The layers are all full attention here: HF's reference Gated DeltaNet (no FLA kernels) takes no
    sample boundaries, which a trainer passes as ``cu_seqlens`` to the kernels."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration

    from omnipack.text.chat import ChatTokenizer

    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(tiny_config(processor.tokenizer, linear_attention=False)).eval()
    prof = get_profile("qwen3_5")
    chat = ChatTokenizer(model_dir, prof, mrope=True)
    inputs = prof.inputs()
    samples = [[media["image"][0]], [media["image"][2], media["image"][4]]]
    single, row = [], {"ids": [], "pos": [], "text_pos": [], "pixels": [], "grids": []}
    for paths in samples:
        plans = [prof.plan(probe(p, "image")) for p in paths]
        enc = chat.encode(_messages(["image"] * len(paths)), plans)
        stored = [_stored(p, pl) for p, pl in zip(paths, plans, strict=True)]
        items = [inputs.media_inputs({"kind": "image"}, s, MediaInputOptions()) for s in stored]
        pixels = torch.from_numpy(np.concatenate([i["pixel_values"] for i in items]))
        grids = torch.from_numpy(np.concatenate([i["image_grid_thw"] for i in items]))
        ids = torch.from_numpy(enc.input_ids.astype(np.int64))[None]
        with torch.no_grad():
            pos = torch.from_numpy(enc.mrope_position_ids.astype(np.int64))[:, None]
            single.append(
                model(input_ids=ids, pixel_values=pixels, image_grid_thw=grids, position_ids=pos).logits[0]
            )
            # the model's own positions (from mm_token_type_ids) give the same logits
            mm = torch.from_numpy((enc.input_ids == model.config.image_token_id).astype(np.int64))[None]
            own = model(
                input_ids=ids, pixel_values=pixels, image_grid_thw=grids, mm_token_type_ids=mm
            ).logits[0]
        torch.testing.assert_close(own, single[-1], rtol=0, atol=0)
        row["ids"].append(ids[0])
        row["pos"].append(torch.from_numpy(enc.mrope_position_ids.astype(np.int64)))
        row["text_pos"].append(torch.arange(ids.shape[1]))
        row["pixels"].append(pixels)
        row["grids"].append(grids)
    position_ids = torch.cat([torch.cat(row["text_pos"])[None], torch.cat(row["pos"], 1)])[:, None]
    with torch.no_grad():
        packed = model(
            input_ids=torch.cat(row["ids"])[None],
            pixel_values=torch.cat(row["pixels"]),
            image_grid_thw=torch.cat(row["grids"]),
            position_ids=position_ids,
            use_cache=False,  # transformers finds packed samples from the positions only without a cache
        ).logits[0]
    n0 = row["ids"][0].shape[0]
    torch.testing.assert_close(packed[:n0], single[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed[n0:], single[1], rtol=1e-4, atol=1e-5)
    # without the restart the second sample would attend to the first: the check can fail
    with torch.no_grad():
        leaky = model(
            input_ids=torch.cat(row["ids"])[None], pixel_values=torch.cat(row["pixels"]),
            image_grid_thw=torch.cat(row["grids"]),
            position_ids=torch.cat([torch.arange(position_ids.shape[-1])[None, None], position_ids[1:]]),
            use_cache=False,
        ).logits[0]  # fmt: skip
    assert not torch.allclose(leaky[n0:], single[1], rtol=1e-4, atol=1e-5)


def test_settings_round_trip_and_options(tmp_path):
    prof = get_profile("qwen3_5", video_fps=1.0, max_pixels=256 * 256)
    s = json.loads(json.dumps(prof.settings()))
    assert s["video"]["fps"] == 1.0 and s["image"]["max_pixels"] == 65536
    assert type(prof.inputs()).__name__ == "Qwen35Inputs" and prof.inputs().image.max_pixels == 65536
    plan = prof.plan(MediaMeta(kind="image", height=1000, width=1000))
    assert plan.grid_thw == (1, 16, 16)
    assert prof.cost_model().lm.num_attention_layers == 8  # hybrid: 1 in 4 layers is full attention
    # Qwen3-VL's rules and settings but the released video budget (the README's rule)
    ours, vl = get_profile("qwen3_5").settings(), get_profile("qwen3_vl").settings()
    assert {k: v for k, v in ours.items() if k != "video"} == {k: v for k, v in vl.items() if k != "video"}
    differs = {k for k in ours["video"] if ours["video"][k] != vl["video"][k]}
    assert differs == {"min_pixels", "max_pixels"}
    assert get_profile("qwen3_5", mrope_rule="hf4").video_layout == "hf4"


# ---- opt-in: the whole processor, as ``AutoProcessor`` loads it (needs torchvision) ----


@pytest.mark.hf_processors
def test_auto_processor_whole_samples(model_dir, media, model):
    """``AutoProcessor.from_pretrained`` of the directory (``Qwen3VLProcessor`` with the released image and
    video processors, videos decoded by transformers' ``load_video``): ids, grids, image pixels and the
    model's rope index from its ``mm_token_type_ids``. Skipped without a torchvision matching torch
    (README, "Model profiles": ``pytest -m hf_processors``). Images on the PIL backend, which the profile
    reproduces (with torchvision, transformers picks its torchvision backend, whose resize rounds otherwise)."""
    try:
        import torchvision.transforms.v2.functional  # noqa: F401
    except Exception as e:  # missing, or a build that does not match torch
        pytest.skip(f"Qwen3VLVideoProcessor needs a working torchvision ({type(e).__name__})")
    from transformers import AutoImageProcessor, AutoProcessor
    from transformers.video_utils import load_video

    from omnipack.text.chat import ChatTokenizer

    images = AutoImageProcessor.from_pretrained(str(model_dir), backend="pil")
    proc = AutoProcessor.from_pretrained(str(model_dir), image_processor=images)
    assert type(proc).__name__ == "Qwen3VLProcessor"
    assert type(proc.video_processor).__name__ == "Qwen3VLVideoProcessor"
    prof = get_profile("qwen3_5")
    chat = ChatTokenizer(model_dir, prof, mrope=True)
    kinds = ["video", "image", "video"]
    paths = [media["video"][0], media["image"][0], media["video"][1]]
    plans = [prof.plan(probe(p, k)) for p, k in zip(paths, kinds, strict=True)]
    messages = _messages(kinds)
    enc = chat.encode(messages, plans)
    decoded = [load_video(str(p), backend="pyav") for p, k in zip(paths, kinds, strict=True) if k == "video"]
    hf = proc(
        text=[proc.tokenizer.apply_chat_template(messages, tokenize=False)],
        images=[Image.open(paths[1]).convert("RGB")],
        videos=[v for v, _ in decoded],
        video_metadata=[m for _, m in decoded],
        return_tensors="pt",
    )
    assert hf["input_ids"][0].tolist() == enc.input_ids.tolist()
    assert [tuple(g) for g in hf["video_grid_thw"].tolist()] == [p.grid_thw for p in plans if p.kind == "video"]
    stored = _stored(paths[1], plans[1])
    pixels = prof.inputs().media_inputs({"kind": "image"}, stored, MediaInputOptions())["pixel_values"]
    assert np.array_equal(pixels, hf["pixel_values"].numpy())
    want = model_rope_index(
        model, hf["input_ids"][0].tolist(), hf["mm_token_type_ids"][0].tolist(),
        hf["image_grid_thw"].tolist(), hf["video_grid_thw"].tolist(),
    )  # fmt: skip
    np.testing.assert_array_equal(enc.mrope_position_ids, want)
