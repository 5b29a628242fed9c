"""The profile comes from the checkpoint: a model folder's config.json ``model_type`` picks the native family,
its processor settings are read from that folder, and a ``--profile`` that disagrees is an error.

The model folders are built with the transformers classes (``Qwen3VLConfig``, the Qwen2-VL image processor
at Qwen3-VL's patch 16) and saved as a checkpoint is; the tokenizer is the demo tokenizer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from omnipack.cli import main
from omnipack.profiles import get_profile

# A size bound no family defaults to: seen in the recorded settings only when the folder's file was read.
LONGEST_EDGE = 200704


def _model_folder(root: Path, model_type: str = "qwen3_vl") -> Path:
    import transformers

    from omnipack.demo.tokenizer import build_demo_tokenizer

    folder = build_demo_tokenizer(root, profile="qwen3_vl")
    config = transformers.Qwen3VLConfig()
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    config.save_pretrained(folder)
    transformers.Qwen2VLImageProcessorPil(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": 4096, "longest_edge": LONGEST_EDGE},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(folder)
    if model_type != "qwen3_vl":
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "model_type": model_type}))
    return folder


@pytest.fixture(scope="module")
def qwen3_vl_folder(tmp_path_factory) -> Path:
    return _model_folder(tmp_path_factory.mktemp("qwen3_vl_model"))


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> tuple[Path, Path]:
    from omnipack.demo.corpus import build_demo_corpus

    return build_demo_corpus(tmp_path_factory.mktemp("corpus"), num_samples=8)


def _prepare(small_corpus, out: Path, *args: str) -> list[str]:
    manifest, media = small_corpus
    return [
        "prepare", "--manifest", str(manifest), "--media-root", str(media), "-o", str(out),
        "--seq-length", "2048", "--no-progress", "--max-reject-fraction", "1", *args,
    ]  # fmt: skip


def _profile_record(out: Path) -> dict:
    return json.loads((out / ".nv-meta" / "omnipack.json").read_text())["profile"]


def test_every_native_family_declares_its_model_types():
    from omnipack.profiles import model_type_families

    families = model_type_families()
    assert families["qwen3_vl"] == ["qwen3_vl"] and families["qwen2_5_vl"] == ["qwen2_5_vl"]
    assert families["gemma3"] == ["gemma3"] and families["qwen3_omni_moe"] == ["qwen3_omni"]
    assert all(len(names) == 1 for names in families.values())  # one native family per model type


def test_prepare_without_profile_uses_the_checkpoints(tmp_path, qwen3_vl_folder, small_corpus, capsys):
    out = tmp_path / "ds"
    assert main(_prepare(small_corpus, out, "--tokenizer", str(qwen3_vl_folder))) == 0
    rec = _profile_record(out)
    assert rec["name"] == "qwen3_vl" and rec["source"] == "checkpoint" and rec["model_type"] == "qwen3_vl"
    assert rec["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert rec["settings"]["image"]["patch_size"] == 16 and rec["settings"]["image"]["max_pixels"] == LONGEST_EDGE
    assert rec["processor_files"] == {"image": str(qwen3_vl_folder / "preprocessor_config.json")}
    assert rec["options"]["preprocessor_config"] == str(qwen3_vl_folder)
    err = capsys.readouterr().err
    assert "profile qwen3_vl (from the checkpoint's model_type qwen3_vl" in err
    assert f"processor settings read from: image {qwen3_vl_folder / 'preprocessor_config.json'}" in err


def test_model_flag_names_the_folder(tmp_path, qwen3_vl_folder, small_corpus, capsys):
    """``--model`` alone: the folder is the tokenizer too; an agreeing --profile is recorded as explicit."""
    out = tmp_path / "ds"
    assert main(_prepare(small_corpus, out, "--model", str(qwen3_vl_folder), "--profile", "qwen3_vl")) == 0
    rec = _profile_record(out)
    assert rec["name"] == "qwen3_vl" and rec["source"] == "explicit" and rec["model_type"] == "qwen3_vl"
    assert rec["settings"]["image"]["max_pixels"] == LONGEST_EDGE
    assert "given explicitly, agrees with model_type qwen3_vl" in capsys.readouterr().err


def test_a_disagreeing_profile_is_an_error(tmp_path, qwen3_vl_folder, small_corpus, capsys):
    out = tmp_path / "ds"
    args = _prepare(small_corpus, out, "--tokenizer", str(qwen3_vl_folder), "--profile", "qwen2_5_vl")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--profile qwen2_5_vl disagrees with the checkpoint" in err
    assert "model_type 'qwen3_vl' (profile qwen3_vl" in err
    assert not out.exists()  # refused before anything is written
    # the same through a --model folder beside a bare tokenizer
    tok = tmp_path / "tok"
    shutil.copytree(qwen3_vl_folder, tok)
    (tok / "config.json").unlink()
    args = _prepare(small_corpus, out, "--tokenizer", str(tok), "--model", str(qwen3_vl_folder), "--profile", "gemma3")
    assert main(args) == 2
    assert "--profile gemma3 disagrees with the checkpoint" in capsys.readouterr().err


def test_a_model_type_without_a_native_profile_is_refused_when_its_processor_cannot_run(
    tmp_path, small_corpus, capsys
):
    """No native family serves llava_onevision: the run falls back to the model's own processor (``hf``),
    which this folder can not build (a Qwen2-VL image processor alone, no LLaVA-OneVision processor)."""
    folder = _model_folder(tmp_path / "llava", model_type="llava_onevision")
    assert main(_prepare(small_corpus, tmp_path / "ds", "--tokenizer", str(folder))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "model_type 'llava_onevision'" in err and "has no native profile" in err
    assert "qwen3_vl (qwen3_vl, qwen3_vl_moe)" in err and "gemma3 (gemma3)" in err
    assert "the fallback profile hf: " in err


def test_a_bare_tokenizer_folder_keeps_the_default(tmp_path, demo_tokenizer, small_corpus, capsys):
    out = tmp_path / "ds"
    assert main(_prepare(small_corpus, out, "--tokenizer", str(demo_tokenizer))) == 0
    rec = _profile_record(out)
    assert rec["name"] == "qwen2_5_vl" and rec["source"] == "default" and rec["model_type"] is None
    assert rec["settings"]["image"]["patch_size"] == 14
    assert "profile qwen2_5_vl (the default" in capsys.readouterr().err


def test_settings_saved_by_transformers_5_are_read_from_processor_config(tmp_path):
    """``save_pretrained`` of a 5.x processor nests each processor's settings in processor_config.json, which
    transformers reads before preprocessor_config.json; so does the profile, for images and for video."""
    from omnipack.profiles.checkpoint import choose_profile

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    (folder / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14}))  # legacy, shadowed
    nested = {
        "processor_class": "Qwen3VLProcessor",
        "image_processor": {"patch_size": 16, "size": {"shortest_edge": 4096, "longest_edge": LONGEST_EDGE}},
        "video_processor": {"fps": 1.0, "min_frames": 2, "max_frames": 64},
    }
    (folder / "processor_config.json").write_text(json.dumps(nested))
    choice, opts = choose_profile(None, folder, {})
    assert choice.name == "qwen3_vl" and choice.processor_files == {
        "image": f"{folder / 'processor_config.json'}#image_processor",
        "video": f"{folder / 'processor_config.json'}#video_processor",
    }
    prof = get_profile(choice.name, **opts)
    assert prof.image.patch_size == 16 and prof.image.max_pixels == LONGEST_EDGE
    assert (prof.video.fps, prof.video.min_frames, prof.video.max_frames) == (1.0, 2, 64)
    # an option given explicitly wins over the folder's
    _, opts = choose_profile("qwen3_vl", folder, {"preprocessor_config": str(folder / "preprocessor_config.json")})
    assert get_profile("qwen3_vl", **opts).image.patch_size == 14


def test_a_run_measures_with_the_settings_of_processor_config(tmp_path, small_corpus):
    """A folder saved by transformers 5 keeps its image settings in processor_config.json only: the measure
    workers, which read the run's shipped copy of that file, count every image with them, as the profile the
    run records does (the copy read as a flat preprocessor config gave the class defaults)."""
    from omnipack.dataset.codec import decode_row
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.media.probe import probe
    from tests.test_pipeline import read_rows_from_tars

    folder = build_demo_tokenizer(tmp_path / "m", profile="qwen3_vl")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    nested = {"image_processor": {"patch_size": 16, "size": {"shortest_edge": 4096, "longest_edge": LONGEST_EDGE}}}
    (folder / "processor_config.json").write_text(json.dumps(nested))
    out = tmp_path / "ds"
    assert main(_prepare(small_corpus, out, "--model", str(folder))) == 0
    manifest, media = small_corpus
    images = {}
    for line in manifest.read_text().splitlines():
        d = json.loads(line)
        parts = [p for m in d["messages"] if isinstance(m["content"], list) for p in m["content"]]
        images[d["id"]] = [p["image"] for p in parts if p["type"] == "image"]
    ours, default = get_profile("qwen3_vl", preprocessor_config=str(folder)), get_profile("qwen3_vl")
    checked = differ = 0
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for k, sid in enumerate(row.sample_ids):
            got = [m.num_tokens for m in sorted(row.media, key=lambda m: m.token_start) if m.sample_index == k and m.kind == "image"]
            metas = [probe(media / p, "image") for p in images[sid]]
            assert got == [ours.plan(m).num_tokens for m in metas], sid
            differ += got != [default.plan(m).num_tokens for m in metas]
            checked += len(got)
    assert checked and differ


def test_a_checkpoint_config_sets_the_model_config_options(tmp_path):
    """A profile chosen from a checkpoint takes the options its config.json sets (``model_config_options``:
    Qwen2.5-VL's ``vision_config.tokens_per_second``, the mRoPE time scale of its videos), not over an option
    given; a family without such an option takes none."""
    from omnipack.profiles.checkpoint import choose_profile

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {"tokens_per_second": 4}}))
    choice, opts = choose_profile(None, tmp_path, {})
    assert (choice.name, choice.source, opts["tokens_per_second"]) == ("qwen2_5_vl", "checkpoint", 4)
    assert choose_profile(None, tmp_path, {"tokens_per_second": 2.0})[1]["tokens_per_second"] == 2.0
    config.write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": {}}))
    assert "tokens_per_second" not in choose_profile(None, tmp_path, {})[1]
    config.write_text(json.dumps({"model_type": "qwen3_vl", "vision_config": {"tokens_per_second": 4}}))
    assert "tokens_per_second" not in choose_profile(None, tmp_path, {})[1]
