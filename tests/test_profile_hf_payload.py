"""The processor-backed profile's payloads: the write stage stores the tensors the model's own processor
returns for each image (``ModelProfile.store_media``), and the loader hands them to the trainer under the
processor's keys, joined per micro-batch as the processor joins one sample's images, with no transformers
in the trainer process. Idefics3 (tiles: ``pixel_values [1, tiles, 3, H, W]``, joined along axis 1) and
LLaVA (``[images, 3, H, W]``, axis 0) and LLaVA-NeXT (anyres: ``[images, patches, 3, H, W]``, a sample's
images padded to its most patches), model folders from ``tests/test_profile_hf.py``; a tiny random model
of each, fed the loader's packed rows, gives each sample's own logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnipack.dataset.codec import decode_row
from omnipack.loader.media import MediaMismatchError, check_row_media, decode_payload
from tests.family_kit import (
    assert_each_samples_own_logits,
    encoder_inputs_by_batch,
    trainer_only_encoder_inputs,
    val_batches,
)
from tests.test_pipeline import read_rows_from_tars
from tests.test_profile_hf import family, model_dir, prepared  # noqa: F401  (fixtures)

pytest.importorskip("megatron.energon")
ROOT = Path(__file__).resolve().parents[1]
# The axis along which each model's processor joins a sample's images, per key (read off its outputs here).
ITEM_AXES = {
    "idefics3": {"pixel_values": 1, "pixel_attention_mask": 1},
    "llava": {"pixel_values": 0},
    "llava_next": {"pixel_values": 0, "image_sizes": 0},  # [images, patches, 3, H, W]: patches padded
}
TEXT_KEYS = ("input_ids", "attention_mask")


def processor_alone(proc, media: Path, messages: list[dict]) -> dict[str, np.ndarray]:
    """The processor's non-text outputs for one sample alone (numpy, in the processor's dtypes)."""
    paths = [p["image"] for m in messages for p in m["content"] if p["type"] == "image"]
    if not paths:
        return {}
    text = proc.apply_chat_template(messages, tokenize=False)
    images = [Image.open(media / p).convert("RGB") for p in paths]
    out = proc(text=[text], images=[images], add_special_tokens=False, return_tensors="np")
    return {k: v for k, v in out.items() if k not in TEXT_KEYS}


def joined(
    parts: list[dict[str, np.ndarray]], axes: dict[str, int], fills: dict[str, float] | None = None
) -> dict[str, np.ndarray]:
    """Each key's arrays concatenated along its item axis, the other axes padded to the largest (with 0, or
    the key's value in ``fills``)."""
    out = {}
    for k, axis in axes.items():
        arrays = [p[k] for p in parts if k in p]
        if arrays:
            top = np.max([a.shape for a in arrays], axis=0)
            pads = [[(0, 0 if d == axis else int(top[d]) - a.shape[d]) for d in range(a.ndim)] for a in arrays]
            fill = (fills or {}).get(k, 0)
            out[k] = np.concatenate(
                [np.pad(a, p, constant_values=fill) for a, p in zip(arrays, pads, strict=True)], axis=axis
            )
    return out


def assert_same_bits(got: dict[str, np.ndarray], want: dict[str, np.ndarray], where: str) -> None:
    assert got.keys() == want.keys(), where
    for k in want:
        g, w = np.asarray(got[k]), want[k]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (where, k, g.dtype, g.shape, w.dtype, w.shape)
        assert g.tobytes() == w.tobytes(), (where, k)


def assert_each_sample_is_the_processors(out: Path, samples: dict, alone, join, tokenizer) -> dict[str, int]:
    """Every packed sample of the dataset ``out``: its token ids, its labels (each answer through its end of
    turn) and its stored tensors (its items' arrays put together by ``join``) are ``alone(sample id)``'s, the
    processor's outputs for the sample alone, bit for bit (the keys ``join`` knows). {sample id: items}."""
    seen = {}
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for k, sid in enumerate(row.sample_ids):
            want = alone(sid)
            start, n = int(row.cu_seqlens_padded[k]), int(row.cu_seqlens[k + 1] - row.cu_seqlens[k])
            assert row.tokens[start : start + n].tolist() == want["input_ids"][0].tolist(), sid
            labels = row.labels[start : start + n]
            answers = [p["text"] for m in samples[sid] if m["role"] == "assistant" for p in m["content"]]
            assert tokenizer.decode(labels[labels >= 0].tolist()) == "".join(f"{a}<|im_end|>" for a in answers), sid
            items = sorted((m for m in row.media if m.sample_index == k), key=lambda m: m.token_start)
            stored = join([dict(decode_payload(m.part, parts[m.part])) for m in items])
            assert_same_bits(stored, {key: want[key] for key in join([want])}, sid)
            seen[sid] = len(items)
    assert sorted(seen) == sorted(samples)
    return seen


def test_the_item_axes_are_read_off_the_processor(prepared, family):  # noqa: F811
    meta = json.loads((prepared[2] / ".nv-meta" / "omnipack.json").read_text())
    assert meta["profile"]["settings"]["media_arrays"] == {"image": ITEM_AXES[family]}


def test_every_stored_tensor_is_the_processors_for_its_sample_alone(prepared, proc, family):  # noqa: F811
    media, samples, out = prepared
    with_images = 0
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for k, sid in enumerate(row.sample_ids):
            items = sorted((m for m in row.media if m.sample_index == k), key=lambda m: m.token_start)
            assert all(m.part.endswith(".npz") for m in items)
            stored = [dict(decode_payload(m.part, parts[m.part])) for m in items]
            want = processor_alone(proc, media, samples[sid])
            assert_same_bits(joined(stored, ITEM_AXES[family]), want, sid)
            with_images += bool(items)
    assert with_images >= 6


def test_the_loader_hands_the_processor_tensors_batched(prepared, proc, family):  # noqa: F811
    """Micro-batches of two rows: each key is every sample's processor output, in stream order, joined along
    the processor's item axis (what the model's forward takes for the whole stream)."""
    media, samples, out = prepared
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    seen = []
    for batch in val_batches(out, batch_size=2):
        sids = [s for row in batch.sample_ids for s in row]
        seen += sids
        want = joined([processor_alone(proc, media, samples[s]) for s in sids], ITEM_AXES[family])
        got = {k: v.numpy() for k, v in (batch.encoder_inputs or {}).items()}
        assert_same_bits(got, want, sids)
        assert batch.as_dict().keys() >= want.keys()
        n_images = sum(len(r["media"]) for r in batch.row_meta)
        assert int((batch.tokens == image_id).sum()) == sum(m["num_tokens"] for r in batch.row_meta for m in r["media"])
        if family == "llava":  # one [3, H, W] per image
            assert (n_images == 0 and not got) or got["pixel_values"].shape[0] == n_images
    assert sorted(seen) == sorted(samples)


def test_the_trainer_only_install_loads_them(prepared, tmp_path):  # noqa: F811
    """With transformers, tokenizers and omnipack's PIL imports blocked, the loader gives the same tensors."""
    assert_trainer_only_loads_the_same(prepared[2], tmp_path)


def assert_trainer_only_loads_the_same(out: Path, tmp_path: Path) -> None:
    """The loader in a process where transformers, tokenizers, the decoders and omnipack's PIL imports are
    blocked gives the same tensors as here, importing no family but ``hf``."""
    only_hf = """
        fams = sorted(m for m in sys.modules if m.startswith("omnipack.profiles.") and m.count(".") == 2
                      and getattr(sys.modules[m], "PROFILE", None) is not None)  # family modules only
        assert fams == ["omnipack.profiles.hf"], fams
        """
    got = trainer_only_encoder_inputs(out, tmp_path, ("transformers", "tokenizers", "av", "decord"), only_hf)
    want = encoder_inputs_by_batch(val_batches(out, batch_size=2))
    assert want and got.keys() == want.keys()
    assert all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)


def test_a_stored_payload_unlike_the_processors_is_a_mismatch(prepared):  # noqa: F811
    """The loader's media check compares each stored array with the shapes and dtypes the processor gave
    for the image's size: a payload with a tile or an image too few, or another dtype, stops the row."""
    from omnipack.loader.task_encoder import OmnipackTaskEncoder

    out = prepared[2]
    te = OmnipackTaskEncoder.from_dataset(out)
    parts = next(p for p in read_rows_from_tars(out).values() if json.loads(p["meta.json"])["media"])
    row, _ = decode_row(parts)
    payloads = [dict(decode_payload(m.part, parts[m.part])) for m in row.media]
    args = dict(placeholder_ids=te.placeholder_ids, row_key="r", sample_ids=row.sample_ids)
    check_row_media(te.model_inputs, row.media, payloads, row.tokens, **args)  # as stored: sound
    key, axis = next(iter(te.model_inputs.item_axes["image"].items()))
    cut = dict(payloads[0], **{key: np.delete(payloads[0][key], -1, axis=axis)})  # one tile / image less
    for bad in (cut, dict(payloads[0], **{key: payloads[0][key].astype(np.float64)}), {}):
        with pytest.raises(MediaMismatchError, match="stored media unusable"):
            check_row_media(te.model_inputs, row.media, [bad, *payloads[1:]], row.tokens, **args)


# ---- a tiny random model on the loader's packed rows ----

TINY_TEXT = {
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "initializer_range": 0.3,  # large enough for a mask or position error to show in the logits
}
TINY_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


@pytest.fixture(scope="module")
def tiny_model(model_dir, family):  # noqa: F811
    """A random model of the family whose encoder gives the processor's placeholder counts (64 px tiles,
    patch 16: LLaVA's 16 patches, Idefics3's 16 pooled 2x2 into 4)."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = dict(TINY_TEXT, vocab_size=len(tok))
    image_id = tok.convert_tokens_to_ids("<image>")
    if family in ("llava", "llava_next"):
        vision = dict(TINY_VISION, model_type="clip_vision_model", image_size=64, patch_size=16)
        kw = dict(vision_config=vision, text_config=text, image_token_id=image_id,
                  vision_feature_select_strategy="default", vision_feature_layer=-2)  # fmt: skip
        if family == "llava_next":
            kw["image_grid_pinpoints"] = json.loads((model_dir / "config.json").read_text())["image_grid_pinpoints"]
            config, cls = transformers.LlavaNextConfig(**kw), transformers.LlavaNextForConditionalGeneration
        else:
            config, cls = transformers.LlavaConfig(**kw), transformers.LlavaForConditionalGeneration
    else:
        vision = dict(TINY_VISION, model_type="idefics3_vision", image_size=64, patch_size=16)
        config = transformers.Idefics3Config(
            vision_config=vision, text_config=text, image_token_id=image_id, scale_factor=2
        )
        cls = transformers.Idefics3ForConditionalGeneration
    torch.manual_seed(0)
    return cls._from_config(config, attn_implementation="eager").eval()


def test_a_packed_row_gives_each_samples_own_logits(prepared, proc, tiny_model):  # noqa: F811
    """Each row of the loader (position resets, a block-diagonal causal mask from ``cu_seqlens_q_padded``,
    the stored tensors under the processor's keys) gives, on every sample's tokens, the logits of that
    sample alone through the processor and the model."""
    media, samples, out = prepared

    def alone(sid: str):
        text = proc.apply_chat_template(samples[sid], tokenize=False)
        paths = [p["image"] for m in samples[sid] for p in m["content"] if p["type"] == "image"]
        images = [[Image.open(media / p).convert("RGB") for p in paths]] if paths else None
        return proc(text=[text], images=images, add_special_tokens=False, return_tensors="pt")

    assert assert_each_samples_own_logits(tiny_model, out, alone)  # a sample after the first of its row holds images


def test_verify_finds_a_stored_tensor_unlike_the_processors(prepared, tmp_path):  # noqa: F811
    """A payload with one tile / image less (its row re-fingerprinted, shard checksums consistent): verify's
    media check compares the stored shapes with those the processor gave for the image's size."""
    from omnipack.dataset.reader import ShardReader
    from omnipack.stages.write import npz_bytes
    from omnipack.tools.verify import run_verify
    from tests.tools_dataset import copy_dataset, resign, rewrite_shard

    ds = copy_dataset(prepared[2], tmp_path / "ds")
    assert all(r.status == "pass" for r in run_verify(ds))
    axes = json.loads((ds / ".nv-meta" / "omnipack.json").read_text())["profile"]["settings"]["media_arrays"]
    key, axis = next(iter(axes["image"].items()))

    def has_media(r) -> bool:
        return bool(json.loads(r.parts["meta.json"])["media"])

    shard = next(
        str(p.relative_to(ds)) for p in sorted((ds / "shards").glob("*.tar")) if any(map(has_media, ShardReader(p)))
    )

    def cut(rows):
        r = next(r for r in rows if has_media(r))
        part = json.loads(r.parts["meta.json"])["media"][0]["part"]
        arrays = dict(decode_payload(part, r.parts[part]))
        arrays[key] = np.delete(arrays[key], -1, axis=axis)
        r.parts[part] = npz_bytes(arrays)
        resign(r)
        return rows

    rewrite_shard(ds, shard, cut)
    fails = {r.name: r.failures for r in run_verify(ds) if r.status == "fail"}
    assert set(fails) == {"media"}, fails
    assert any(shard in m and key in m and "the processor gives" in m for m in fails["media"]), fails


def test_the_shard_layout_counts_the_stored_tensors(prepared):  # noqa: F811
    """The pack stage cuts shards by estimated bytes: for the hf profile those of the processor's tensors
    (float32 tiles, many times the source image), as stored, less the npz headers."""
    from omnipack.profiles.base import MediaPlan
    from omnipack.stages.measure import media_bytes_estimate

    for parts in read_rows_from_tars(prepared[2]).values():
        for m in json.loads(parts["meta.json"])["media"]:
            plan = MediaPlan(kind=m["kind"], num_tokens=m["num_tokens"], info=m["info"]["info"])
            assert 0 <= len(parts[m["part"]]) - media_bytes_estimate(plan) < 512 * len(plan.info["stored_arrays"])


def test_verify_source_finds_features_changed_in_place(prepared, tmp_path):  # noqa: F811
    """A processor tensor changed by one value (same shape, its row re-fingerprinted, checksums consistent):
    only re-deriving the sample from its image finds it, naming the sample and the tensor."""
    from omnipack.dataset.codec import decode_row
    from omnipack.dataset.reader import ShardReader
    from omnipack.stages.write import npz_bytes
    from omnipack.tools.verify import SourceOptions, run_verify
    from tests.tools_dataset import copy_dataset, resign, rewrite_shard

    ds = copy_dataset(prepared[2], tmp_path / "ds")
    assert run_verify(ds, source=SourceOptions())[-1].status == "pass"
    shard = next(
        str(p.relative_to(ds)) for p in sorted((ds / "shards").glob("*.tar"))
        if any(decode_row(r.parts)[0].media for r in ShardReader(p))
    )  # fmt: skip
    seen = {}

    def nudge(rows):
        r = next(r for r in rows if decode_row(r.parts)[0].media)
        row, _ = decode_row(r.parts)
        m = row.media[0]
        arrays = {k: np.array(v) for k, v in decode_payload(m.part, r.parts[m.part]).items()}
        key = next(k for k, v in arrays.items() if v.dtype.kind == "f")
        arrays[key].reshape(-1)[0] += 1
        r.parts[m.part] = npz_bytes(arrays)
        seen.update(sid=row.sample_ids[m.sample_index], key=key)
        resign(r)
        return rows

    rewrite_shard(ds, shard, nudge)
    results = {r.name: r for r in run_verify(ds, source=SourceOptions())}
    assert results["content"].status == "pass" and results["media"].status == "pass"
    hits = [m for m in results["source"].failures if f"sample {seen['sid']} " in m]
    assert hits and f"payload[{seen['key']!r}] differs" in hits[0] and shard in hits[0], results["source"].failures
