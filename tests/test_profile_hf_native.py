"""Native profile vs processor-backed profile, side by side on the same data (issue 23, item 4).

A Gemma 3 model folder (the released preprocessor settings at a 224 px view, Gemma's tokenizer layout,
``config.json`` model_type ``gemma3``) is prepared twice from one manifest: by its native family (chosen
from the checkpoint) and by ``--profile hf`` (its own ``Gemma3Processor``). Every sample gets the same token
ids and labels, and the loader hands the same ``pixel_values`` (the native family's stored uint8 views
normalized by its trainer half; the processor's float32 tensors as stored), bit for bit, with and without
pan-and-scan.

Gemma 3 is the native family whose processor transformers builds without torchvision: the Qwen-VL,
Qwen3-Omni, Gemma 4 and Nemotron-Omni processors hold a video processor, which transformers 5.x builds only
with torchvision (not installable beside the CPU torch wheel; README, "Model profiles").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from omnipack.cli import main
from tests.family_kit import chat_samples, noise_images, prepare, val_batches, write_manifest
from tests.test_profiles_gemma3 import RELEASED_PREPROCESSOR_CONFIG, build_gemma_model_dir

pytest.importorskip("transformers")
pytest.importorskip("megatron.energon")

# (height, width): landscape and portrait that pan-and-scan crops, a mild one, a tiny one.
SIZES = [(300, 900), (900, 300), (480, 640), (20, 30)]
VIEW = 224  # a small view keeps the processor's float32 tensors small; the counts stay 256 per view
IMAGE_SEQ_LENGTH = 256
# how each profile is asked for pan-and-scan: the native family's option, the processor's call keyword
OPTIONS = {
    "default": ([], []),
    "pan_and_scan": (
        ["--profile-option", "do_pan_and_scan=true"],
        ["--profile-option", 'processor_kwargs={"do_pan_and_scan": true}'],
    ),
}


def build_gemma3_checkpoint(out: Path, view: int = VIEW) -> Path:
    """The Gemma 3 tokenizer and released preprocessor settings (at ``view`` px), with the ``config.json``
    a checkpoint carries (its image token index: the soft token the model's features replace)."""
    import transformers
    from transformers import AutoTokenizer

    build_gemma_model_dir(out)
    cfg = dict(RELEASED_PREPROCESSOR_CONFIG, size={"height": view, "width": view})
    (out / "preprocessor_config.json").write_text(json.dumps(cfg))
    soft = AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("<image_soft_token>")
    config = transformers.Gemma3Config(image_token_index=soft)
    config.architectures = ["Gemma3ForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def _corpus(root: Path, n: int = 8) -> tuple[Path, Path, list[str]]:
    media = root / "media"
    files = [(f"img{k}.png", h, w) for k, (h, w) in enumerate(SIZES)]
    images = noise_images(media, np.random.default_rng(3), files)
    samples = chat_samples("s", n, "image", images, "Describe the picture {}.", "A red square.")
    return write_manifest(root, samples), media, list(samples)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_gemma3_checkpoint(tmp_path_factory.mktemp("gemma3") / "model")


@pytest.fixture(scope="module", params=sorted(OPTIONS))
def both(request, tmp_path_factory, model_dir):
    """{profile: dataset} of the same manifest prepared by the native family and by ``--profile hf``."""
    root = tmp_path_factory.mktemp(f"side_by_side_{request.param}")
    manifest, media, ids = _corpus(root / "src")
    out = {}
    for name, extra in zip(["gemma3", "hf"], OPTIONS[request.param], strict=True):
        out[name] = prepare(
            manifest, media, root / name, "--model", str(model_dir), "--seq-length", "4096",
            "--shard-max-rows", "2", *extra, *(["--profile", "hf"] if name == "hf" else []),
        )  # fmt: skip
    return out, ids, request.param


def _per_sample(out: Path, image_id: int) -> dict[str, dict[str, np.ndarray]]:
    """{sample id: its token ids, labels, its images' feature counts and pixel_values} as the loader hands
    them (pixels normalized: each sample's views, split off its row's by its image soft tokens, 256 per
    view); the loader's placeholder ids, the ones the model's features replace, under ``"placeholder_ids"``."""
    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    found = {"placeholder_ids": {"ids": np.asarray(OmnipackTaskEncoder.from_dataset(out).placeholder_ids["image"])}}
    for batch in val_batches(out):
        d = batch.as_dict()
        pixels = d.get("pixel_values")
        cup, cu = d["cu_seqlens_q_padded"], d["cu_seqlens_q"]
        at = 0
        for k, sid in enumerate(batch.sample_ids[0]):
            a, n = int(cup[k]), int(cu[k + 1] - cu[k])
            tokens = d["tokens"][0, a : a + n].numpy()
            views = int((tokens == image_id).sum()) // IMAGE_SEQ_LENGTH
            found[sid] = {key: d[key][0, a : a + n].numpy() for key in ("tokens", "labels", "token_type_ids")}
            items = [m for m in batch.row_meta[0]["media"] if m["sample_index"] == k]
            found[sid]["num_tokens"] = np.asarray([m["num_tokens"] for m in items], np.int64)
            if views:
                found[sid]["pixel_values"] = pixels[at : at + views].numpy()
            at += views
        assert at == (0 if pixels is None else pixels.shape[0])
    return found


def test_the_profiles_are_the_checkpoints_and_the_processors(both, model_dir):
    out, ids, option = both
    native = json.loads((out["gemma3"] / ".nv-meta" / "omnipack.json").read_text())
    hf = json.loads((out["hf"] / ".nv-meta" / "omnipack.json").read_text())
    assert (native["profile"]["name"], native["profile"]["source"]) == ("gemma3", "checkpoint")
    assert (hf["profile"]["name"], hf["profile"]["source"]) == ("hf", "explicit")
    settings = hf["profile"]["settings"]
    assert settings["processor_class"] == "Gemma3Processor"
    # the text holds <start_of_image>; the features replace the soft tokens its expansion holds
    assert settings["template_blocks"] == {"image": ["<start_of_image>"]}
    assert settings["placeholder_tokens"] == {"image": ["<image_soft_token>"]}
    assert native["counts"]["packed"] == hf["counts"]["packed"] == len(ids)
    assert main(["verify", str(out["hf"]), "--workers", "1"]) == 0  # re-measured by the processor, as written


def test_token_ids_labels_and_pixels_equal_the_native_familys(both, model_dir):
    from transformers import AutoTokenizer

    out, ids, option = both
    image_id = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("<image_soft_token>")
    native, hf = (_per_sample(out[name], image_id) for name in ("gemma3", "hf"))
    assert sorted(native) == sorted(hf) == ["placeholder_ids", *ids]
    assert native["placeholder_ids"]["ids"].tolist() == [image_id]
    views = 0
    for sid in ["placeholder_ids", *ids]:
        assert native[sid].keys() == hf[sid].keys(), sid
        for key, want in native[sid].items():
            got = hf[sid][key]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (sid, key, got.shape, want.shape)
            assert got.tobytes() == want.tobytes(), (sid, key)
        views += len(native[sid].get("pixel_values", ()))
        assert native[sid].get("num_tokens", np.zeros(0)).sum() == IMAGE_SEQ_LENGTH * len(native[sid].get("pixel_values", ()))
    images = sum(i % 3 for i in range(len(ids)))
    assert views >= images and (views > images) == (option == "pan_and_scan")
