"""Native profile vs processor-backed profile on the families whose processors hold a video processor
(transformers builds those only with torchvision): Qwen2.5-VL and Qwen3-VL, images and videos, and Qwen3-Omni,
images (issue 23, item 4; the Gemma 3 pair runs without torchvision in test_profile_hf_native.py). Opt-in
(``pytest -m hf_processors``), skipped where torchvision does not import.

Each model folder (the demo tokenizer of the family, its processor class with the PIL image processor and the
video processor, ``config.json``) is prepared twice from test_profile_hf.py's image corpus: by its native
family (chosen from the checkpoint) and by ``--profile hf`` with ``image_backend=pil`` (the backend the native
families reproduce; with torchvision installed transformers picks its torchvision backend, whose resize rounds
differently). Every sample gets the same token ids and labels, and the loader hands the same ``pixel_values``
(the native family's stored uint8 frames normalized and patched by its trainer half; the processor's float32
patches as stored) and ``image_grid_thw``, bit for bit.

Qwen3-Omni's folder (``Qwen3OmniMoeProcessor``, Whisper features beside the images) is compared the same way,
on images. Nemotron Omni has no hf side to compare: the hf profile refuses its processor at start, with the
reason (``OMNI_REFUSALS``; its native profile prepares the same folder).

Videos (a corpus of lossless mp4 files, both sides decoding with decord): the same token ids, labels, grids,
``second_per_grid_ts`` and mRoPE ids (the native family's against the model's ``get_rope_index`` over hf's
outputs); ``pixel_values_videos`` within a float32 ulp where neither side resizes and at most 2 uint8 steps
apart where both do (PIL bicubic frames vs the processor's torchvision resize, README "Model profiles").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import prepare_hf_corpus
from tests.hf_oracles import require_torchvision

pytestmark = pytest.mark.hf_processors
pytest.importorskip("transformers")
pytest.importorskip("megatron.energon")
require_torchvision()

from tests.family_kit import val_batches  # noqa: E402

# family -> (processor class, config class, patch size, video processor class)
FAMILIES = {
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2_5_VLConfig", 14, "Qwen2VLVideoProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLConfig", 16, "Qwen3VLVideoProcessor"),
}
COMPARED = ("tokens", "labels")  # per sample; pixels and grids per sample's images


def build_qwen_vl_checkpoint(out: Path, family: str) -> Path:
    import transformers

    from omnipack.demo.tokenizer import build_demo_tokenizer

    proc_cls, config_cls, patch, video_cls = FAMILIES[family]
    build_demo_tokenizer(out, profile=family)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    video = getattr(transformers, video_cls)(patch_size=patch)
    # the image processor normalizes as the family's video processor, as in the released checkpoints (CLIP's
    # statistics for Qwen2.5-VL, 0.5 for Qwen3-VL); the native families refuse a folder where they differ
    image = transformers.Qwen2VLImageProcessorPil(patch_size=patch, image_mean=video.image_mean, image_std=video.image_std)
    getattr(transformers, proc_cls)(
        image_processor=image,
        video_processor=video,
        tokenizer=tok,
        chat_template=tok.chat_template,
    ).save_pretrained(out)
    config = getattr(transformers, config_cls)()
    config.architectures = [proc_cls.replace("Processor", "ForConditionalGeneration")]
    config.save_pretrained(out)
    return out


QWEN_OMNI_TOKENS = {
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
}  # fmt: skip


def build_qwen3_omni_checkpoint(out: Path) -> Path:
    """Qwen3-Omni (thinker): the family's demo tokenizer with its multimodal token attributes,
    ``Qwen3OmniMoeProcessor`` over the PIL image processor at patch 16, the video processor and Whisper's
    128-bin extractor (the released layout), ``config.json`` model_type ``qwen3_omni_moe``."""
    import transformers

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out, profile="qwen3_omni")
    tok = transformers.AutoTokenizer.from_pretrained(out, extra_special_tokens=QWEN_OMNI_TOKENS)
    transformers.Qwen3OmniMoeProcessor(
        image_processor=transformers.Qwen2VLImageProcessorPil(patch_size=16),
        video_processor=transformers.Qwen2VLVideoProcessor(patch_size=16),
        feature_extractor=transformers.WhisperFeatureExtractor(feature_size=128),
        tokenizer=tok, chat_template=tok.chat_template,
    ).save_pretrained(out)  # fmt: skip
    config = transformers.Qwen3OmniMoeConfig()
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def build_nemotron_omni_checkpoint(out: Path) -> Path:
    """Nemotron Omni: the family's demo tokenizer, ``NemotronH_Omni_Reasoning_V3Processor`` over its RADIO
    image processor (torchvision only), video processor and ``ParakeetFeatureExtractor`` (class defaults),
    ``config.json`` model_type ``nemotron_h_omni``."""
    import transformers
    from transformers.models import nemotron_h_omni as nemotron

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out, profile="nemotron_omni")
    tok = transformers.AutoTokenizer.from_pretrained(out)
    nemotron.NemotronH_Omni_Reasoning_V3Processor(
        image_processor=nemotron.NemotronH_Omni_Reasoning_V3ImageProcessor(),
        video_processor=nemotron.NemotronH_Omni_Reasoning_V3VideoProcessor(),
        feature_extractor=transformers.ParakeetFeatureExtractor(), tokenizer=tok, chat_template=tok.chat_template,
    ).save_pretrained(out)  # fmt: skip
    config = nemotron.NemotronH_Omni_Reasoning_V3_Config()
    config.architectures = ["NemotronH_Omni_Reasoning_V3"]
    config.save_pretrained(out)
    return out


# family -> its checkpoint folder builder (the native profiles compared with hf; benchmarks/bench_profiles.py)
BUILDERS = {
    "qwen2_5_vl": lambda out: build_qwen_vl_checkpoint(out, "qwen2_5_vl"),
    "qwen3_vl": lambda out: build_qwen_vl_checkpoint(out, "qwen3_vl"),
    "qwen3_omni": build_qwen3_omni_checkpoint,
    "nemotron_omni": build_nemotron_omni_checkpoint,
}
COMPARED_FAMILIES = {  # family -> the processor class hf runs
    "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor", "qwen3_omni": "Qwen3OmniMoeProcessor",
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(COMPARED_FAMILIES))
def both(request, tmp_path_factory):
    """(family, {profile: dataset}, samples) of one corpus prepared by the native family and by ``hf``."""
    family = request.param
    root = tmp_path_factory.mktemp(f"side_by_side_{family}")
    model = BUILDERS[family](root / "model")
    out = {}
    for name, extra in [(family, []), ("hf", ["--profile", "hf", "--profile-option", "image_backend=pil"])]:
        _, samples, out[name] = prepare_hf_corpus(root / name, model, *extra, seq_length=4096)
    return family, out, samples


# kind -> (its pixel key, its grid key), as both profiles hand them
KEYS = {"image": ("pixel_values", "image_grid_thw"), "video": ("pixel_values_videos", "video_grid_thw")}


def _per_sample(
    out: Path, kinds: tuple[str, ...] = ("image",), per_token: tuple[str, ...] = ()
) -> dict[str, dict[str, np.ndarray]]:
    """{sample id: its token ids, labels (and the ``per_token`` keys the batch has: ``[3, tokens]`` for mRoPE
    ids), and its items' pixel rows and grids (and a video's ``second_per_grid_ts``) of each of ``kinds``}
    as the loader hands them."""
    found = {}
    for batch in val_batches(out, batch_size=1):
        d = batch.as_dict()
        cup, cu, media = d["cu_seqlens_q_padded"], d["cu_seqlens_q"], batch.row_meta[0]["media"]
        at = dict.fromkeys(kinds, (0, 0))  # kind -> (its next item, its next pixel row)
        for k, sid in enumerate(batch.sample_ids[0]):
            a, n = int(cup[k]), int(cu[k + 1] - cu[k])
            found[sid] = {key: d[key][0, a : a + n].numpy() for key in COMPARED}
            for key in (key for key in per_token if key in d):
                found[sid][key] = (d[key][:, 0] if d[key].ndim == 3 else d[key][0])[..., a : a + n].numpy()
            for kind in kinds:
                pixels, grids = KEYS[kind]
                items = sum(m["sample_index"] == k and m["kind"] == kind for m in media)
                if items:
                    (item, row), g = at[kind], d[grids][at[kind][0] : at[kind][0] + items].numpy()
                    rows = int(np.prod(g, axis=1).sum())
                    found[sid].update({grids: g, pixels: d[pixels][row : row + rows].numpy()})
                    if kind == "video" and "second_per_grid_ts" in d:
                        found[sid]["second_per_grid_ts"] = d["second_per_grid_ts"][item : item + items].numpy()
                    at[kind] = (item + items, row + rows)
        for kind in kinds:
            assert at[kind][1] == (d[KEYS[kind][0]].shape[0] if KEYS[kind][0] in d else 0)
    return found


def test_the_profiles_are_the_checkpoints_and_the_processors(both):
    family, out, samples = both
    native, hf = (json.loads((out[n] / ".nv-meta" / "omnipack.json").read_text()) for n in (family, "hf"))
    assert (native["profile"]["name"], native["profile"]["source"]) == (family, "checkpoint")
    assert (hf["profile"]["name"], hf["profile"]["source"]) == ("hf", "explicit")
    settings = hf["profile"]["settings"]
    settings["placeholder_tokens"] = dict(settings["placeholder_tokens"])
    audio = settings["placeholder_tokens"].pop("audio", None)  # Qwen3-Omni's clips (the others take none)
    assert audio == (["<|audio_pad|>"] if family == "qwen3_omni" else None)
    assert settings["processor_class"] == COMPARED_FAMILIES[family]
    assert (settings["image_backend"], settings["image_processor_class"]) == ("pil", "Qwen2VLImageProcessorPil")
    # the processor's videos are planned too (hf's video planning: tests/test_profile_hf_video.py)
    assert settings["placeholder_tokens"] == {"image": ["<|image_pad|>"], "video": ["<|video_pad|>"]}
    assert native["counts"]["packed"] == hf["counts"]["packed"] == len(samples)


def test_token_ids_labels_pixels_and_grids_equal_the_native_familys(both):
    family, out, samples = both
    native, hf = _per_sample(out[family]), _per_sample(out["hf"])
    assert sorted(native) == sorted(hf) == sorted(samples)
    images = 0
    for sid in samples:
        assert native[sid].keys() == hf[sid].keys(), sid
        for key, want in native[sid].items():
            got = hf[sid][key]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (sid, key, got.dtype, want.dtype, got.shape)
            assert got.tobytes() == want.tobytes(), (sid, key, float(np.abs(got.astype(float) - want).max()))
        images += len(native[sid].get("image_grid_thw", ()))
    assert images == sum(p["type"] == "image" for m in sum(samples.values(), []) for p in m["content"])


# Nemotron Omni: the hf profile refuses its processor at start, so there is no hf side to compare (README,
# "Model profiles"; benchmarks/README.md, "Profiles benchmark", records the same reason).
OMNI_REFUSALS = {
    # Its own __call__ drops the text_replacement_offsets that get_text_with_replacements returns
    # (``text, _ = ...``): no item's expansion can be read off the processor.
    "nemotron_omni": (
        build_nemotron_omni_checkpoint, "NemotronH_Omni_Reasoning_V3Processor",
        "reports no text replacement for an image",
    ),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(OMNI_REFUSALS))
def test_the_omni_processors_are_refused_at_start_with_their_reason(family, tmp_path, capsys):
    """``--profile hf`` on the checkpoint: refused at start, the one-line reason naming the processor, nothing
    written; without ``--profile`` the same folder is prepared by its native family."""
    from omnipack.cli import main
    from tests.family_kit import prepare, prepare_args, run_meta
    from tests.test_profile_hf import _corpus

    build, proc_cls, reason = OMNI_REFUSALS[family]
    model = build(tmp_path / "model")
    manifest, media, _ = _corpus(tmp_path / "src", n=2)
    assert main(prepare_args(manifest, media, tmp_path / "ds", "--model", str(model), "--profile", "hf")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"profile hf: {proc_cls} of {model}" in err and reason in err, err
    assert not (tmp_path / "ds").exists()
    native = prepare(manifest, media, tmp_path / "native", "--model", str(model))  # the checkpoint's family
    rec = run_meta(native)["profile"]
    assert (rec["name"], rec["source"]) == (family, "checkpoint")


# ---- videos ----

# (file, frames, fps, width, height): the first three are resized by both families (the processor resizes
# with torchvision, the native families store PIL bicubic frames), "kept.mp4" is stored at its decoded size
# by both (its sides multiples of 28 and 32 within both budgets). Widths decord copies (not e.g. 96 px).
VIDEOS = [("a.mp4", 23, 10, 128, 64), ("b.mp4", 12, 4, 64, 64), ("c.mp4", 9, 25, 64, 128), ("kept.mp4", 12, 4, 448, 224)]
KEPT = {"kept.mp4"}


def _video_corpus(root: Path) -> tuple[Path, Path, dict[str, list[dict]]]:
    from tests.family_kit import chat_samples, write_manifest
    from tests.test_profiles_qwen3_5 import _write_textured_video

    media = root / "media"
    media.mkdir(parents=True)
    for name, n, fps, w, h in VIDEOS:
        _write_textured_video(media / name, n, fps, w, h)
    samples = chat_samples(
        "v", 9, "video", [v[0] for v in VIDEOS], "What happens in clip {}?", "The colours drift.",
        follow_up=("kept.mp4", "It loops."),
    )  # fmt: skip
    return write_manifest(root, samples), media, samples


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def videos_both(request, tmp_path_factory):
    """(family, model folder, media, samples, {profile: dataset}): a video corpus prepared by the native family
    (from the checkpoint: the folder's video processor settings, e.g. Qwen2.5-VL's ``do_sample_frames=False``)
    and by ``hf``."""
    from tests.family_kit import prepare

    family = request.param
    root = tmp_path_factory.mktemp(f"videos_{family}")
    model = build_qwen_vl_checkpoint(root / "model", family)
    manifest, media, samples = _video_corpus(root / "src")
    out = {}
    for name, extra in [(family, []), ("hf", ["--profile", "hf", "--profile-option", "image_backend=pil"])]:
        out[name] = prepare(
            manifest, media, root / name, "--model", str(model), "--seq-length", "8192", "--shard-max-rows", "2", *extra
        )  # fmt: skip
    return family, model, media, samples, out


def _videos_of(messages: list[dict]) -> list[str]:
    return [p["video"] for m in messages for p in m["content"] if p["type"] == "video"]


def test_video_token_ids_labels_and_grids_equal_the_native_familys(videos_both):
    """Every sample's token ids (Qwen3-VL's frame timestamps in the text included), labels and
    ``video_grid_thw`` are the same bit for bit; Qwen2.5-VL's ``second_per_grid_ts`` the same values (the
    native family hands float32, the processor float64)."""
    family, _, _, samples, out = videos_both
    native, hf = (_per_sample(out[n], ("video",)) for n in (family, "hf"))
    assert sorted(native) == sorted(hf) == sorted(samples)
    for sid in samples:
        assert native[sid].keys() == hf[sid].keys(), sid
        for key in ("tokens", "labels", "video_grid_thw"):
            if key in native[sid]:
                assert native[sid][key].tobytes() == hf[sid][key].tobytes(), (sid, key)
        if "second_per_grid_ts" in native[sid]:
            assert native[sid]["second_per_grid_ts"].dtype == np.float32
            assert native[sid]["second_per_grid_ts"].tolist() == hf[sid]["second_per_grid_ts"].astype(np.float32).tolist()
        assert len(native[sid].get("video_grid_thw", ())) == len(_videos_of(samples[sid])), sid
    assert ("second_per_grid_ts" in native["v-001"]) == (family == "qwen2_5_vl")


def test_video_pixels_equal_where_neither_resizes(videos_both):
    """``pixel_values_videos`` after the native family's normalization: a video stored at its decoded size is
    the processor's within one float32 ulp of its largest value (its fused ``(x - 255*mean) / (255*std)`` rounds apart from
    ``(x/255 - mean) / std``, as test_profiles_qwen3_5.py shows on Qwen3.5); a resized one differs by the resize (the native frames PIL bicubic, the
    processor's torchvision's antialiased bicubic on tensors), by at most 2 uint8 steps."""
    family, model, _, samples, out = videos_both
    std = np.asarray(json.loads((model / "processor_config.json").read_text())["video_processor"]["image_std"])
    native, hf = (_per_sample(out[n], ("video",)) for n in (family, "hf"))
    kept = resized = 0
    for sid in samples:
        if "video_grid_thw" not in native[sid]:
            continue
        sizes = np.prod(native[sid]["video_grid_thw"], axis=1)
        ours, theirs = (np.split(p[sid]["pixel_values_videos"], np.cumsum(sizes)[:-1]) for p in (native, hf))
        for name, a, b in zip(_videos_of(samples[sid]), ours, theirs, strict=True):
            assert (a.dtype, a.shape) == (b.dtype, b.shape) == (np.float32, a.shape), (sid, name)
            diff = np.abs(a - b)
            if name in KEPT:
                ulp = np.spacing(np.abs(b).max())  # of the largest value: near 0 the two subtract alike
                assert diff.max() <= ulp, (sid, name, float(diff.max()), float(ulp))
                kept += 1
            else:  # in uint8 steps per channel ([rows, C, T, P, P] rows)
                steps = diff.reshape(len(a), 3, -1) * (255 * std)[None, :, None]
                assert 0 < steps.max() <= 2 + 1e-3, (sid, name, float(steps.max()))
                resized += 1
    assert kept >= 2 and resized >= 4


def test_hf_video_pixels_are_the_processors_given_the_file(videos_both):
    """The ``hf`` side is the processor the way a user calls it (``load_video(path, backend="decord")``, then
    ``AutoProcessor.from_pretrained(folder)``), for each sample alone: so where the pixels differ above, the
    native family's resize is the one that departs from the processor."""
    from transformers import AutoProcessor

    from tests.test_profile_hf_payload import assert_each_sample_is_the_processors, joined
    from tests.test_profile_hf_video import AXES, processor_alone

    _, model, media, samples, out = videos_both
    proc = AutoProcessor.from_pretrained(str(model))
    alone = lambda sid: processor_alone(proc, media, samples[sid])  # noqa: E731
    seen = assert_each_sample_is_the_processors(out["hf"], samples, alone, lambda p: joined(p, AXES), proc.tokenizer)
    assert sum(seen.values()) == sum(len(_videos_of(m)) for m in samples.values())


def test_native_mrope_ids_are_the_models_over_the_hf_outputs(videos_both):
    """``hf`` hands no position ids (the processor's ``mm_token_type_ids`` instead, from which the model
    computes them): the model's own ``get_rope_index`` (its config from the folder) over each sample's ``hf``
    token ids, ``mm_token_type_ids``, ``video_grid_thw`` and ``second_per_grid_ts`` gives the native family's
    ``mrope_position_ids`` (Qwen2.5-VL's once it read ``vision_config.tokens_per_second`` off the checkpoint: it
    used its option's default 2 over the folder's 4, every video's temporal positions apart)."""
    import types

    import torch
    import transformers

    family, model, _, samples, out = videos_both
    cls = getattr(transformers, FAMILIES[family][0].replace("Processor", "Model"))
    stub = types.SimpleNamespace(config=transformers.AutoConfig.from_pretrained(model))
    stub.get_vision_position_ids = types.MethodType(cls.get_vision_position_ids, stub)
    if family == "qwen2_5_vl":  # its time scale is the folder's (the config class's 4; the released ones 2)
        settings = json.loads((out[family] / ".nv-meta" / "omnipack.json").read_text())["profile"]["settings"]
        assert settings["tokens_per_second"] == stub.config.vision_config.tokens_per_second == 4
    native = _per_sample(out[family], ("video",), ("mrope_position_ids",))
    hf = _per_sample(out["hf"], ("video",), ("mm_token_type_ids",))
    for sid in samples:
        got, want = hf[sid], native[sid]["mrope_position_ids"]
        kw = {"video_grid_thw": torch.from_numpy(got["video_grid_thw"])} if "video_grid_thw" in got else {}
        if "second_per_grid_ts" in got:
            kw["second_per_grid_ts"] = torch.from_numpy(got["second_per_grid_ts"])
        ids, types_ = (torch.from_numpy(got[k])[None] for k in ("tokens", "mm_token_type_ids"))
        pos, _ = cls.get_rope_index(stub, ids, types_, **kw)
        assert pos[:, 0].tolist() == want.tolist(), sid
    assert sum("video_grid_thw" in hf[sid] for sid in samples) >= 6


def test_native_refuses_a_video_processor_that_normalizes_otherwise(tmp_path):
    """The native families normalize videos with the image processor's statistics (one ``pixel_mean`` /
    ``pixel_std`` per batch): a folder whose video processor normalizes otherwise is refused, not prepared with
    videos unlike the processor's (this test's checkpoints once had CLIP's image statistics beside Qwen3-VL's
    0.5 video statistics: every video pixel differed, up to 1.15)."""
    import transformers

    from omnipack.profiles import get_profile

    model = build_qwen_vl_checkpoint(tmp_path / "model", "qwen3_vl")
    config = model / "processor_config.json"
    saved = json.loads(config.read_text())
    get_profile("qwen3_vl", preprocessor_config=str(model), video_preprocessor_config=str(model))  # alike: fine
    saved["image_processor"]["image_mean"] = list(transformers.utils.constants.OPENAI_CLIP_MEAN)
    config.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"video processor's image_mean \[0.5, 0.5, 0.5\] differs"):
        get_profile("qwen3_vl", preprocessor_config=str(model), video_preprocessor_config=str(model))
