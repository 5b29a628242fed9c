"""The processor-backed profile (``hf``) on videos: GLM-4.6V, whose processor samples a video's frames from its
metadata and writes each frame's time into the prompt. Opt-in (``pytest -m hf_processors``), skipped where
torchvision does not import (transformers builds video processors only with it).

The model folder is built from the transformers 5.24 classes (test_profile_hf_vision.py's, its chat template
writing GLM's ``<|begin_of_video|><|video|><|end_of_video|>``) and a corpus of lossless mp4 files (and a few
images) is prepared without ``--profile``: the run falls back to ``hf``. The oracle is the processor the way a
user gives it a video file: ``transformers.video_utils.load_video(path, backend="decord")`` (every frame, and
the file's ``VideoMetadata``), then ``AutoProcessor.from_pretrained(folder)(text, videos, video_metadata)``,
for each sample alone. Every packed sample's token ids (frame timestamps included), labels and stored tensors
equal it; verify and the trainer-only loader work.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.hf_oracles import require_torchvision

pytestmark = pytest.mark.hf_processors
pytest.importorskip("transformers")
pytest.importorskip("megatron.energon")
pytest.importorskip("decord")
require_torchvision()

from omnipack.cli import main  # noqa: E402
from omnipack.media.errors import MediaRejected  # noqa: E402
from omnipack.media.meta import MediaMeta  # noqa: E402
from omnipack.profiles import get_profile  # noqa: E402
from tests.family_kit import chat_samples, noise_images, prepare, val_batches, write_manifest  # noqa: E402
from tests.test_profile_hf_payload import (  # noqa: E402
    assert_each_sample_is_the_processors,
    assert_trainer_only_loads_the_same,
    joined,
)
from tests.test_profile_hf_vision import (  # noqa: E402
    assert_loader_hands_the_processor_tensors,
    build_glm46v_model_dir,
)
from tests.test_profiles_qwen3_5 import _write_textured_video  # noqa: E402

# The processor's outputs per kind and their item axes (one video's patches, then the next's; a grid row each).
AXES = {"pixel_values": 0, "image_grid_thw": 0, "pixel_values_videos": 0, "video_grid_thw": 0}
# (file, frames, fps, width, height): GLM samples 3 frames a second (twice, for its temporal patch) of a
# clip up to 30 s long, a frame's time in the prompt. Widths decord copies (it fails on some, e.g. 96 px).
VIDEOS = [("a.mp4", 23, 10, 128, 64), ("b.mp4", 12, 4, 64, 64), ("c.mp4", 9, 25, 64, 128)]
SAME_SHAPE = ("a2.mp4", "a.mp4")  # a second file of a.mp4's shape, other pixels: one processor call for both


def _corpus(root: Path) -> tuple[Path, Path, dict[str, list[dict]]]:
    media = root / "media"
    media.mkdir(parents=True)
    for name, n, fps, w, h in VIDEOS:
        _write_textured_video(media / name, n, fps, w, h)
    _write_textured_video(media / SAME_SHAPE[0], *VIDEOS[0][1:])
    shutil.copy(media / "a.mp4", media / "a-copy.mp4")
    videos = [v[0] for v in VIDEOS] + [SAME_SHAPE[0], "a-copy.mp4"]
    samples = chat_samples(
        "v", 10, "video", videos, "What happens in clip {}?", "The colours drift to the right.",
        follow_up=("b.mp4", "It loops."),
    )  # fmt: skip
    images = noise_images(media, np.random.default_rng(2), [("p.png", 60, 90)])
    samples.update(chat_samples("i", 3, "image", images, "Describe picture {}.", "Noise."))
    return write_manifest(root, samples), media, samples


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_glm46v_model_dir(tmp_path_factory.mktemp("glm46v_video") / "model")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("hf_video")
    manifest, media, samples = _corpus(root / "src")
    out = prepare(manifest, media, root / "ds", "--model", str(model_dir), "--seq-length", "512", "--shard-max-rows", "2", "--cp", "2")
    return media, samples, out


def processor_alone(proc, media: Path, messages: list[dict]) -> dict[str, np.ndarray]:
    """The processor's outputs for one sample alone, its videos given as transformers' decord reader loads the
    files (every frame and the file's metadata; the processor samples them)."""
    from transformers.video_utils import load_video

    text = proc.apply_chat_template(messages, tokenize=False)
    parts = [p for m in messages for p in m["content"] if p["type"] in ("image", "video")]
    images = [Image.open(media / p["image"]).convert("RGB") for p in parts if p["type"] == "image"]
    loaded = [load_video(str(media / p["video"]), backend="decord") for p in parts if p["type"] == "video"]
    kw: dict = {"images": images} if images else {}
    if loaded:
        kw.update(videos=[v for v, _ in loaded], video_metadata=[m for _, m in loaded])
    return dict(proc(text=[text], add_special_tokens=False, return_tensors="np", **kw))


def _uses(samples: dict[str, list[dict]], kind: str) -> list[str]:
    return [p[kind] for msgs in samples.values() for m in msgs for p in m["content"] if p["type"] == kind]


def test_videos_are_planned_by_the_processor_once_per_shape(prepared, proc):
    """The run records video among the processor's kinds, its features ``<|image|>`` (GLM writes a video's
    frames as images), its stored keys, the ``mm_token_type_ids`` value of those tokens between the video's
    marks (2; 1 elsewhere); one processor call per distinct (frames, size, fps), a cache hit for every other
    video."""
    _, samples, out = prepared
    rec = json.loads((out / ".nv-meta" / "omnipack.json").read_text())
    settings = rec["profile"]["settings"]
    assert (rec["profile"]["name"], rec["profile"]["source"]) == ("hf", "fallback")
    assert settings["template_blocks"] == {"image": ["<|image|>"], "video": ["<|video|>"]}
    assert settings["placeholder_tokens"] == {"image": ["<|image|>"], "video": ["<|image|>"]}
    assert settings["media_arrays"]["video"] == {"pixel_values_videos": 0, "video_grid_thw": 0}
    assert settings["unplanned"] == {}
    begin, end, image = proc.tokenizer.convert_tokens_to_ids(["<|begin_of_video|>", "<|end_of_video|>", "<|image|>"])
    assert settings["token_inputs"] == {"mm_token_type_ids": [[image, 1]]}
    assert settings["token_regions"] == {"mm_token_type_ids": [[begin, end, [[image, 2]]]]}
    assert rec["counts"]["packed"] == len(samples) and rec["counts"]["rejected"] == 0
    used = _uses(samples, "video")
    shapes = {name: (n, fps, w, h) for name, n, fps, w, h in VIDEOS}
    shapes[SAME_SHAPE[0]] = shapes["a-copy.mp4"] = shapes["a.mp4"]
    distinct = len({shapes[u] for u in used})
    assert distinct == len(VIDEOS) < len(set(used))
    cache = rec["processor_cache"]["video"]
    assert (cache["processor_calls"], cache["cache_hits"]) == (distinct, len(used) - distinct)


def test_every_sample_equals_the_processor_given_the_file(prepared, proc):
    """Token ids (each frame's timestamp text included), labels and every stored tensor (the video's
    ``pixel_values_videos`` and ``video_grid_thw``, float32 and int64 as the processor gives them) equal the
    processor's for the sample alone, bit for bit."""
    media, samples, out = prepared
    alone = lambda sid: processor_alone(proc, media, samples[sid])  # noqa: E731
    seen = assert_each_sample_is_the_processors(out, samples, alone, lambda parts: joined(parts, AXES), proc.tokenizer)
    with_video = [sid for sid, msgs in samples.items() if any(p["type"] == "video" for m in msgs for p in m["content"])]
    assert sum(seen[sid] > 0 for sid in with_video) >= 6
    some = processor_alone(proc, media, samples["v-001"])  # a clip's frame times are in the text
    assert " seconds" in proc.tokenizer.decode(some["input_ids"][0].tolist())


def test_verify_and_the_loader_hand_the_processor_tensors(prepared, proc):
    """``omnipack verify`` re-plans with the processor and finds every row as written; the loader's
    micro-batches of two rows hold every sample's video and image tensors under the processor's keys, in stream
    order, and the per-token ``mm_token_type_ids`` as the processor gives them (2 on a video's frames, 1 on an
    image's)."""
    media, samples, out = prepared
    assert main(["verify", str(out), "--workers", "1"]) == 0
    alone = lambda sid: processor_alone(proc, media, samples[sid])  # noqa: E731
    assert assert_loader_hands_the_processor_tensors(out, samples, alone, AXES) == {0, 1, 2}


def test_a_cp_rank_gets_its_slice_of_the_rows_mm_token_type_ids(prepared):
    """Under context parallelism (cp=2) each rank's ``mm_token_type_ids`` are the whole rows' values at its
    tokens: a video's 2s are read off its marks in the whole stream, also where a rank's chunks hold part of a
    video's block without its ``<|begin_of_video|>`` (the values read off the rank's own tokens would differ)."""
    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    out = prepared[2]
    whole = [b.as_dict() for b in val_batches(out, batch_size=2)]
    assert any((d["mm_token_type_ids"] == 2).any() for d in whole)
    local_differs = 0
    for rank in (0, 1):
        te = OmnipackTaskEncoder.from_dataset(out, cp=2, cp_rank=rank)
        for d, b in zip(whole, val_batches(out, te, batch_size=2), strict=True):
            got = b.as_dict()
            assert got["mm_token_type_ids"].tolist() == d["mm_token_type_ids"][:, b.cp_token_indices].tolist()
            local = te.model_inputs.token_inputs(got["tokens"], te.placeholder_ids)["mm_token_type_ids"]
            local_differs += local.tolist() != got["mm_token_type_ids"].tolist()
    assert local_differs


def test_the_trainer_only_install_loads_them(prepared, tmp_path):
    assert_trainer_only_loads_the_same(prepared[2], tmp_path)


def test_the_processor_runs_once_per_video_shape(model_dir, proc):
    """300 videos of 20 distinct (frames, size, fps): 20 processor calls, 280 cache hits; a real video's
    count, frames and stored shapes are the processor's for its file's metadata."""
    prof = get_profile("hf", model_dir=str(model_dir))
    rng = np.random.default_rng(0)
    shapes = {(int(n), 28 * int(h), 28 * int(w), float(f)) for n, h, w, f in rng.integers(2, 6, (60, 4))}
    shapes = sorted(shapes)[:20]
    assert len(shapes) == 20
    plans = {}
    for k in rng.integers(0, 20, 280).tolist() + list(range(20)):
        n, h, w, fps = shapes[k]
        plans[shapes[k]] = prof.plan(MediaMeta("video", width=w, height=h, num_frames=n, fps=fps))
    assert prof.cache_stats() == {"video": {"processor_calls": 20, "cache_hits": 280}}
    from transformers.video_utils import VideoMetadata

    image_id = proc.tokenizer.convert_tokens_to_ids("<|image|>")
    for n, h, w, fps in shapes[:4]:  # real frames with decord's metadata: the planned count and frames
        meta = VideoMetadata(total_num_frames=n, fps=fps, width=w, height=h, duration=n / fps, video_backend="decord")
        frames = rng.integers(0, 255, (n, h, w, 3), dtype=np.uint8)
        out = proc(text=["<|video|>"], videos=[frames], video_metadata=[meta], return_metadata=True, return_tensors="np")
        plan = plans[(n, h, w, fps)]
        assert plan.num_tokens == int((out["input_ids"][0] == image_id).sum())
        assert plan.frame_indices == tuple(int(i) for i in out["video_metadata"][0].frames_indices)
        assert plan.info["stored_arrays"]["pixel_values_videos"][0] == list(out["pixel_values_videos"].shape)


def test_marks_apart_from_the_placeholder_refuse_unlike_token_values(tmp_path):
    """A template writing ``<|begin_of_video|>\\n<|video|>``: the marks are not right beside the placeholder,
    so no region is read off them; the check on a sample of every kind as the template writes it sees the
    processor's ``mm_token_type_ids`` (2 on a video's frames) unlike the derived ones (1) and refuses it,
    instead of recording values the trainer half would get wrong."""
    model_dir = build_glm46v_model_dir(tmp_path / "model", video_block="<|begin_of_video|>\n<|video|><|end_of_video|>")
    with pytest.raises(ValueError, match="per-token 'mm_token_type_ids'"):
        get_profile("hf", model_dir=str(model_dir))


def test_a_video_whose_outputs_depend_on_other_videos_is_refused(model_dir, monkeypatch):
    """The per-sample layout plans images and audio only: a video kind whose outputs depend on the sample's
    other videos is refused with that reason, not given the per-sample layout."""
    from omnipack.profiles import hf

    prof = get_profile("hf", model_dir=str(model_dir))
    item_axes = hf.HFProfile._find_item_axes

    def sample_dependent_videos(self, kind):
        if kind == "video":
            raise hf._SampleDependent("profile hf: its videos' outputs depend on the sample's other videos")
        return item_axes(self, kind)

    monkeypatch.setattr(hf.HFProfile, "_find_item_axes", sample_dependent_videos)
    with pytest.raises(ValueError, match="not supported for videos"):
        prof._find_media_layout("video")
    assert "video" not in prof.media_joint
    assert prof._find_media_layout("image") == {"pixel_values": 0, "image_grid_thw": 0}


def test_a_processor_giving_no_sampled_frames_keeps_its_images(model_dir, monkeypatch):
    """A processor that ignores ``return_metadata`` names no frames it samples: its videos are unplanned at
    start with that reason (a video is a reject saying so), its images planned as before."""
    import transformers

    call = transformers.Glm46VProcessor.__call__

    def without_metadata(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        out.pop("video_metadata", None)
        return out

    monkeypatch.setattr(transformers.Glm46VProcessor, "__call__", without_metadata)
    prof = get_profile("hf", model_dir=str(model_dir))
    settings = prof.settings()
    assert settings["unplanned"]["video"].startswith("ValueError: profile hf: the Glm46VProcessor returns no video_metadata")
    assert "video" not in settings["template_blocks"]
    assert prof.plan(MediaMeta("image", width=90, height=60)).num_tokens > 0
    with pytest.raises(MediaRejected, match="cannot plan video inputs: .*frames_indices"):
        prof.plan(MediaMeta("video", width=64, height=64, num_frames=12, fps=4.0))
