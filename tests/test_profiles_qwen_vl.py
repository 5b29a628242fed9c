"""Qwen2.5-VL / Qwen3-VL profiles against the installed transformers processors and rope index."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from omnipack.profiles import MediaMeta, MediaRejected, MediaSpan, get_profile
from omnipack.profiles.qwen_vl import smart_resize, smart_resize_3d
from tests.hf_oracles import import_hf

transformers = pytest.importorskip("transformers")

SIZES = [
    (480, 640), (1, 1), (5, 3), (13, 27), (27, 28), (28, 28), (56, 56), (100, 19999), (19999, 100),
    (14, 2800), (2800, 14), (3, 599), (4000, 6000), (8192, 8192), (12000, 300), (721, 1279), (1080, 1920),
    (333, 777), (50, 50), (29, 41), (2, 399),
]  # fmt: skip


@pytest.mark.parametrize(
    "factor,minp,maxp", [(28, 3136, 12845056), (32, 65536, 16777216), (28, 56 * 56, 28 * 28 * 1280)]
)
def test_smart_resize_matches_hf(factor, minp, maxp):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf

    rng = np.random.default_rng(factor)
    sizes = SIZES + [tuple(int(x) for x in rng.integers(1, 5000, 2)) for _ in range(300)]
    for h, w in sizes:
        try:
            want = hf(h, w, factor, minp, maxp)
        except ValueError:
            with pytest.raises(MediaRejected):
                smart_resize(h, w, factor, minp, maxp)
            continue
        assert smart_resize(h, w, factor, minp, maxp) == want, (h, w)


@pytest.mark.parametrize("name,ps", [("qwen2_5_vl", 14), ("qwen3_vl", 16)])
@pytest.mark.parametrize("hw", [(480, 640), (5, 3), (28, 28), (1080, 1920), (40, 3000), (3000, 40)])
def test_image_plan_matches_processor(name, ps, hw):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    prof = get_profile(name)
    s = prof.image
    proc = Qwen2VLImageProcessorPil(
        patch_size=ps, merge_size=2, temporal_patch_size=2, min_pixels=s.min_pixels, max_pixels=s.max_pixels
    )
    img = np.zeros((*hw, 3), np.uint8)
    out = proc(images=[img], return_tensors="np")
    plan = prof.plan(MediaMeta(kind="image", height=hw[0], width=hw[1]))
    assert tuple(int(x) for x in out["image_grid_thw"][0]) == plan.grid_thw
    assert out["pixel_values"].shape[0] == plan.vision_patches
    assert plan.num_tokens == plan.vision_patches // 4


def test_480x640_golden():
    plan = get_profile("qwen2_5_vl").plan(MediaMeta(kind="image", height=480, width=640))
    assert plan.grid_thw == (1, 34, 46) and plan.vision_patches == 1564 and plan.num_tokens == 391


# ---- video frame sampling ----

TOTALS = [
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    9,
    10,
    13,
    24,
    25,
    30,
    31,
    59,
    60,
    61,
    97,
    100,
    299,
    300,
    301,
    1000,
    2999,
    7919,
]
FPS = [1.0, 8.0, 23.976, 24.0, 25.0, 29.97, 30.0, 60.0]


def _meta(total, fps):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=total, fps=fps, width=64, height=48, duration=total / fps)


@pytest.mark.parametrize("sample_fps", [0.5, 1.0, 2.0, 4.0])
def test_qwen2_sampling_matches_hf(sample_fps):
    m = import_hf("models.qwen2_vl.video_processing_qwen2_vl")
    prof = get_profile("qwen2_5_vl", video_fps=sample_fps)
    v = prof.video
    stub = types.SimpleNamespace(
        num_frames=None,
        fps=sample_fps,
        temporal_patch_size=2,
        min_frames=v.min_frames,
        max_frames=v.max_frames,
    )
    for total, fps in itertools.product(TOTALS, FPS):
        try:
            want = [int(i) for i in m.Qwen2VLVideoProcessor.sample_frames(stub, _meta(total, fps))]
        except (ZeroDivisionError, ValueError):
            want = None  # HF cannot sample fewer than temporal_patch_size frames; omnipack uses all of them
        got = prof.sample_video_frames(total, fps)
        if want is None:
            assert total < 2 and got == list(range(total))
        else:
            assert got == want, (total, fps)


@pytest.mark.parametrize(
    "sample_fps,min_frames,max_frames", [(2.0, 4, 768), (1.0, 4, 768), (0.5, 2, 16), (4.0, 8, 64)]
)
def test_qwen3_sampling_matches_hf(sample_fps, min_frames, max_frames):
    m = import_hf("models.qwen3_vl.video_processing_qwen3_vl")
    prof = get_profile(
        "qwen3_vl", video_fps=sample_fps, video_min_frames=min_frames, video_max_frames=max_frames
    )
    stub = types.SimpleNamespace(fps=sample_fps, min_frames=min_frames, max_frames=max_frames)
    for total, fps in itertools.product(TOTALS, FPS):
        want = [int(i) for i in m.Qwen3VLVideoProcessor.sample_frames(stub, _meta(total, fps))]
        assert prof.sample_video_frames(total, fps) == want, (total, fps)


@pytest.mark.parametrize("cap", [False, True])
def test_video_patches_match_hf(cap):
    m2 = import_hf("models.qwen2_vl.video_processing_qwen2_vl")
    m3 = import_hf("models.qwen3_vl.video_processing_qwen3_vl")
    rng = np.random.default_rng(7)
    sizes = SIZES[2:] + [tuple(int(x) for x in rng.integers(8, 4000, 2)) for _ in range(60)]
    for name, mod, cls in (
        ("qwen2_5_vl", m2, m2.Qwen2VLVideoProcessor),
        ("qwen3_vl", m3, m3.Qwen3VLVideoProcessor),
    ):
        prof = get_profile(name, cap_pixels_per_frame=cap)
        v, s = prof.video, prof.image
        for (h, w), n in itertools.product(sizes, [2, 3, 4, 9, 64, 767]):
            if name == "qwen2_5_vl":
                mp = v.max_pixels
                if cap:
                    total_pixels = int(v.max_video_tokens * s.factor**2 * 0.9)
                    mp = max(min(mp, total_pixels * 2 // n), int(v.min_pixels * 1.05))
                try:
                    want = mod.smart_resize(h, w, s.factor, v.min_pixels, mp)
                except ValueError:
                    with pytest.raises(MediaRejected):
                        prof.video_resize(n, h, w)
                    continue
            else:
                stub = types.SimpleNamespace(
                    size={"shortest_edge": v.min_pixels, "longest_edge": v.max_pixels},
                    patch_size=16, merge_size=2, temporal_patch_size=2,
                    cap_pixels_per_frame=cap, max_video_tokens=v.max_video_tokens,
                )  # fmt: skip
                try:
                    patches = cls.get_num_of_video_patches(stub, n, h, w)
                except ValueError:
                    with pytest.raises(MediaRejected):
                        prof.video_resize(n, h, w)
                    continue
                rh, rw = prof.video_resize(n, h, w)
                assert -(-n // 2) * (rh // 16) * (rw // 16) == patches, (h, w, n)
                continue
            assert prof.video_resize(n, h, w) == want, (h, w, n)


def test_smart_resize_3d_matches_hf_including_tiny():
    m3 = import_hf("models.qwen3_vl.video_processing_qwen3_vl")
    for (h, w), n in itertools.product([(5, 3), (31, 400), (16, 16), (480, 640), (2, 300)], [2, 3, 8]):
        try:
            want = m3.smart_resize(n, h, w, 2, 32, 128 * 32 * 32, 768 * 32 * 32)
        except ValueError:
            continue
        assert smart_resize_3d(n, h, w, 2, 32, 128 * 32 * 32, 768 * 32 * 32) == want


def _qwen3vl_processor(tokenizer=None, **ids):
    """transformers' Qwen3VLProcessor (its own replacement methods), built without the torchvision parts."""
    from tests.hf_oracles import bare_processor

    return bare_processor(
        "models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor", tokenizer,
        image_token="<|image_pad|>", video_token="<|video_pad|>",
        vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
        image_processor=types.SimpleNamespace(merge_size=2),
        video_processor=types.SimpleNamespace(merge_size=2, temporal_patch_size=2), **ids,
    )  # fmt: skip


def _hf_video_text(proc, text: str, plans, layout: str) -> str:
    """``text`` (template output) with each video block replaced as transformers 5.x (``layout="hf5"``:
    only ``<|video_pad|>``) or 4.x (``"hf4"``: the whole ``<|vision_start|><|video_pad|><|vision_end|>``,
    reproduced by handing the 5.x replacement the bare pad) does it."""
    from transformers.video_utils import VideoMetadata

    if layout == "hf4":
        text = text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")
    inputs = {"video_grid_thw": [np.array(p.grid_thw) for p in plans], "video_metadata": []}
    for p in plans:
        n = p.info["num_sampled_frames"]
        inputs["video_metadata"].append(
            VideoMetadata(
                total_num_frames=None, fps=p.info["src_fps"], frames_indices=list(p.frame_indices[:n])
            )
        )
    reps = [proc.replace_video_token(inputs, i) for i in range(len(plans))]
    return proc.get_text_with_replacements([text], [], reps, [])[0][0]


@pytest.mark.parametrize("layout", ["hf5", "hf4"])
def test_qwen3_timestamps_and_expansion(layout):
    proc_mod = import_hf("models.qwen3_vl.processing_qwen3_vl")
    proc = _qwen3vl_processor()
    prof = get_profile("qwen3_vl", mrope_rule=layout)
    assert prof.video_layout == layout
    for total, fps in [(13, 10.0), (1, 24.0), (61, 29.97), (300, 30.0), (5, 2.0)]:
        plan = prof.plan(MediaMeta(kind="video", height=240, width=320, num_frames=total, fps=fps))
        sampled = prof.sample_video_frames(total, fps)
        want = proc_mod.Qwen3VLProcessor._calculate_timestamps(None, list(sampled), fps, 2)
        assert plan.info["timestamps"] == want
        assert plan.grid_thw[0] == len(want) == len(plan.frame_indices) // 2
        segs = prof.expand(plan)
        got = "".join(s.text if s.text is not None else s.token * s.count for s in segs)
        block = "".join(prof.template_blocks["video"])
        assert got == _hf_video_text(proc, block, [plan], layout)
        assert sum(s.count for s in segs if s.placeholder) == plan.num_tokens


def test_video_layout_follows_mrope_rule_and_rejects_a_mix():
    assert get_profile("qwen3_vl").video_layout == "hf5"
    assert get_profile("qwen3_vl", mrope_rule="hf4").video_layout == "hf4"
    assert get_profile("qwen3_vl", mrope_rule="hf4", video_layout="hf4").settings()["video_layout"] == "hf4"
    with pytest.raises(ValueError, match="mixes transformers 4.x and 5.x"):
        get_profile("qwen3_vl", mrope_rule="hf5", video_layout="hf4")
    with pytest.raises(ValueError, match="video_layout must be one of"):
        get_profile("qwen3_vl", video_layout="hf6")


CHAT_VIDEOS = [
    [MediaMeta(kind="video", height=240, width=320, num_frames=13, fps=10.0)],
    [
        MediaMeta(kind="video", height=96, width=160, num_frames=61, fps=29.97),
        MediaMeta(kind="video", height=360, width=200, num_frames=1, fps=24.0),
    ],
]


@pytest.mark.parametrize("layout", ["hf5", "hf4"])
@pytest.mark.parametrize("metas", CHAT_VIDEOS)
def test_qwen3_video_sample_ids_and_mrope_match_processor(demo_tokenizer, layout, metas):
    """Whole-sample token ids (template -> processor replacement -> tokenizer) and get_rope_index."""
    import torch
    from transformers import AutoTokenizer

    from omnipack.text.chat import ChatTokenizer

    mod = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    prof = get_profile("qwen3_vl", mrope_rule=layout)
    chat = ChatTokenizer(demo_tokenizer, prof, mrope=True)
    plans = [prof.plan(m) for m in metas]
    content = [{"type": "text", "text": "Watch:"}]
    for i in range(len(plans)):
        content += [{"type": "video", "video": f"v{i}.mp4"}, {"type": "text", "text": f" clip {i}."}]
    messages = [{"role": "user", "content": content}, {"role": "assistant", "content": "A ball moves."}]
    enc = chat.encode(messages, plans)

    tok = AutoTokenizer.from_pretrained(demo_tokenizer)
    proc = _qwen3vl_processor(
        tok, image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )  # fmt: skip
    text = _hf_video_text(proc, tok.apply_chat_template(messages, tokenize=False), plans, layout)
    want_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert enc.input_ids.tolist() == want_ids
    n_vs = want_ids.count(tok.convert_tokens_to_ids("<|vision_start|>"))
    frames = sum(p.grid_thw[0] for p in plans)
    assert n_vs == frames + (len(plans) if layout == "hf5" else 0)

    mm = torch.tensor(proc.create_mm_token_type_ids([want_ids]))
    stub = types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=types.SimpleNamespace(spatial_merge_size=2))
    )
    stub.get_vision_position_ids = types.MethodType(mod.Qwen3VLModel.get_vision_position_ids, stub)
    pos, _ = mod.Qwen3VLModel.get_rope_index(
        stub, torch.tensor([want_ids]), mm, video_grid_thw=torch.tensor([p.grid_thw for p in plans])
    )
    np.testing.assert_array_equal(enc.mrope_position_ids, pos[:, 0].numpy())


def test_one_frame_video_is_padded():
    for name in ("qwen2_5_vl", "qwen3_vl"):
        plan = get_profile(name).plan(MediaMeta(kind="video", height=64, width=64, num_frames=1, fps=25.0))
        assert plan.frame_indices == (0, 0) and plan.grid_thw[0] == 1


def test_video_rejects():
    prof = get_profile("qwen3_vl")
    with pytest.raises(MediaRejected):
        prof.plan(MediaMeta(kind="video", height=64, width=64, num_frames=0, fps=25.0))
    with pytest.raises(MediaRejected):
        prof.plan(MediaMeta(kind="video", height=64, width=64, num_frames=10, fps=0.0))


# ---- mRoPE ----

IMG, VID, VS, VE, TXT = 151655, 151656, 151652, 151653, 100


def _build(prof, items):
    """A token sequence with text runs and expanded media; returns ids, spans, grids."""
    ids: list[int] = [TXT] * 3
    spans = []
    for _kind, meta in items:
        plan = prof.plan(meta)
        start = len(ids)
        ph = None
        for seg in prof.expand(plan):
            if seg.text is not None:
                ids += [TXT + 1] * (len(seg.text) // 3)  # stand-in for the tokenized timestamp
                continue
            tok = {"<|vision_start|>": VS, "<|vision_end|>": VE, "<|image_pad|>": IMG, "<|video_pad|>": VID}[
                seg.token
            ]
            if seg.placeholder and ph is None:
                ph = len(ids)
            ids += [tok] * seg.count
        spans.append(MediaSpan(plan, start, len(ids), ph, plan.num_tokens))
        ids += [TXT] * 5
    return np.array(ids), spans


def _hf_rope(module, cls, prof, ids, spans, tps=None):
    import torch

    vc = types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=tps)
    stub = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vc))
    stub.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, stub)
    tt = np.where(ids == IMG, 1, np.where(ids == VID, 2, 0))
    img = [sp.plan.grid_thw for sp in spans if sp.plan.kind == "image"]
    vid = [sp.plan.grid_thw for sp in spans if sp.plan.kind == "video"]
    spg = [sp.plan.info["second_per_grid"] for sp in spans if sp.plan.kind == "video"]
    kw = {}
    if tps is not None:
        kw["second_per_grid_ts"] = torch.tensor(spg) if spg else None
    pos, _ = cls.get_rope_index(
        stub,
        torch.tensor(ids)[None],
        torch.tensor(tt)[None],
        image_grid_thw=torch.tensor(img) if img else None,
        video_grid_thw=torch.tensor(vid) if vid else None,
        **kw,
    )
    return pos[:, 0].numpy()


ITEMS = [
    [("image", MediaMeta(kind="image", height=480, width=640))],
    [("video", MediaMeta(kind="video", height=240, width=320, num_frames=61, fps=29.97))],
    [
        ("image", MediaMeta(kind="image", height=100, width=900)),
        ("video", MediaMeta(kind="video", height=64, width=96, num_frames=13, fps=10.0)),
        ("video", MediaMeta(kind="video", height=360, width=200, num_frames=1, fps=24.0)),
        ("image", MediaMeta(kind="image", height=56, width=56)),
    ],
    [("video", MediaMeta(kind="video", height=128, width=128, num_frames=300, fps=30.0))],
]


@pytest.mark.parametrize("items", ITEMS)
def test_qwen25_mrope_hf5_matches_get_rope_index(items):
    mod = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")
    prof = get_profile("qwen2_5_vl", mrope_rule="hf5")
    ids, spans = _build(prof, items)
    want = _hf_rope(mod, mod.Qwen2_5_VLModel, prof, ids, spans, tps=2)
    got = prof.mrope_position_ids(ids, spans)
    assert got.dtype == np.int32 and got.shape == (3, len(ids))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("items", ITEMS)
def test_qwen3_mrope_matches_get_rope_index(items):
    mod = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    for rule in ("hf4", "hf5"):  # the rules agree for Qwen3-VL (t = 1 per block)
        prof = get_profile("qwen3_vl", mrope_rule=rule)
        ids, spans = _build(prof, items)
        want = _hf_rope(mod, mod.Qwen3VLModel, prof, ids, spans)
        np.testing.assert_array_equal(prof.mrope_position_ids(ids, spans), want)


def test_qwen25_mrope_hf4_video():
    """4.x rule: next text position = max(block) + 1; differs from hf5 when t > 1."""
    prof = get_profile("qwen2_5_vl", mrope_rule="hf4", video_min_pixels=3136)
    meta = MediaMeta(
        kind="video", height=56, width=84, num_frames=8, fps=2.0
    )  # 8 frames at 2 fps, 2 fps sampling
    ids, spans = _build(prof, [("video", meta)])
    pos = prof.mrope_position_ids(ids, spans)
    plan = spans[0].plan
    assert plan.grid_thw == (4, 4, 6) and plan.info["second_per_grid"] == 1.0
    p0 = spans[0].placeholder_start  # 4 text tokens before: 3 + vision_start
    block = pos[:, p0 : p0 + plan.num_tokens]
    assert block[0].tolist() == [p0 + 2 * t for t in range(4) for _ in range(6)]  # interval 2*1.0
    assert block[1].max() == p0 + 1 and block[2].max() == p0 + 2
    assert pos[0, p0 + plan.num_tokens] == p0 + 6 + 1  # max T = p0+6 -> vision_end at max+1
    hf5 = get_profile("qwen2_5_vl", mrope_rule="hf5", video_min_pixels=3136).mrope_position_ids(ids, spans)
    assert hf5[0, p0 + plan.num_tokens] == p0 + 3  # p + max(h', w') = p0 + 3


# ---- frame sampling defaults of the video processor classes ----


@pytest.mark.parametrize(
    "name,module,cls_name",
    [
        ("qwen2_5_vl", "models.qwen2_vl.video_processing_qwen2_vl", "Qwen2VLVideoProcessor"),
        ("qwen3_vl", "models.qwen3_vl.video_processing_qwen3_vl", "Qwen3VLVideoProcessor"),
        ("qwen3_omni", "models.qwen2_vl.video_processing_qwen2_vl", "Qwen2VLVideoProcessor"),
    ],
)
def test_do_sample_frames_reproduces_the_class_default(name, module, cls_name):
    """``do_sample_frames=<class default>`` (and the class fps) picks the frames the class picks.

    Qwen2VLVideoProcessor samples nothing by default (every decoded frame); omnipack's own default
    samples at 2 fps as qwen-vl-utils does, so it differs there, as the README says.
    """
    cls = getattr(import_hf(module), cls_name)
    proc = object.__new__(cls)  # class defaults, as an instance without a config has them
    proc.fps = getattr(cls, "fps", None)
    proc.num_frames = getattr(cls, "num_frames", None)
    opts = {"do_sample_frames": cls.do_sample_frames}
    if cls.do_sample_frames and proc.fps is not None:
        opts["video_fps"] = proc.fps
    prof = get_profile(name, **opts)
    for total, fps in itertools.product(TOTALS, FPS):
        if cls.do_sample_frames:
            want = [int(i) for i in cls.sample_frames(proc, _meta(total, fps))]
        else:
            want = list(range(total))  # the processor does not call sample_frames
        assert prof.sample_video_frames(total, fps) == want, (name, total, fps)
    if not cls.do_sample_frames:  # the qwen-vl-utils default differs from the class
        assert get_profile(name).sample_video_frames(300, 30.0) != list(range(300))


def test_do_sample_frames_options():
    every = get_profile("qwen3_vl", do_sample_frames=False)
    assert every.video.fps is None and every.sample_video_frames(3, 30.0) == [0, 1, 2]
    plan = every.plan(MediaMeta(kind="video", height=64, width=64, num_frames=3, fps=30.0))
    assert plan.frame_indices == (0, 1, 2, 2) and plan.info["second_per_grid"] == 2 / 30.0
    with pytest.raises(ValueError, match="contradicts video_fps"):
        get_profile("qwen2_5_vl", do_sample_frames=False, video_fps=1.0)
    assert get_profile("qwen2_5_vl", do_sample_frames=True).video.fps == 2.0
