"""Energon round trips of a Qwen3-Omni demo dataset (images, video, audio) through the omnipack encoder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_savable_loader, get_train_dataset, get_val_dataset
from megatron.energon.errors import FatalSampleError

from omnipack.dataset.codec import decode_row
from omnipack.loader.compat import DatasetAlignmentError
from omnipack.loader.media import MediaMismatchError, decode_payload
from omnipack.loader.sample import cook_packed_row
from omnipack.loader.task_encoder import OmnipackTaskEncoder
from omnipack.profiles import get_profile
from omnipack.profiles.model_inputs import MediaInputOptions
from tests.test_pipeline import read_rows_from_tars

PLAIN = MediaInputOptions()  # float32 pixels, built eagerly, private memory

PROFILE = "qwen3_omni"
PIXEL_KEYS = {"pixel_values", "pixel_values_videos"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare
    from omnipack.profiles import get_profile

    root = tmp_path_factory.mktemp("omni")
    tok = build_demo_tokenizer(root / "tok", profile=PROFILE)
    manifest, media = build_demo_corpus(root / "src", num_samples=20, kinds=get_profile(PROFILE).kinds)
    out = root / "ds"
    run_prepare(
        PrepareConfig(
            manifest=[str(manifest)],
            media_root=str(media),
            tokenizer=str(tok),
            output=str(out),
            profile=PROFILE,
            seq_length=1024,
            cp=2,
            shard_max_rows=3,
            progress=False,
        )
    )
    return out


def _wc(n: int) -> WorkerConfig:
    return WorkerConfig(rank=0, world_size=1, num_workers=n)


def _val(path: Path, te, workers: int = 0, mbs: int = 2):
    ds = get_val_dataset(
        str(path), split_part="train", worker_config=_wc(workers), batch_size=mbs, task_encoder=te
    )
    return get_loader(ds)


def _expected_media(te: OmnipackTaskEncoder, rows: list[dict[str, bytes]]) -> dict[str, torch.Tensor]:
    per_item = []
    for parts in rows:
        row, _ = decode_row(parts)
        per_item += [
            te.model_inputs.media_inputs(m, decode_payload(m.part, parts[m.part]), PLAIN) for m in row.media
        ]
    return te.model_inputs.collate_media(per_item, PLAIN) if per_item else {}


def test_from_dataset_checks_alignment(dataset):
    te = OmnipackTaskEncoder.from_dataset(dataset, cp=2, cp_rank=1)
    assert te.model_inputs.name == PROFILE and te.cp_size == 2 and te.placeholder_ids["audio"]
    with pytest.raises(DatasetAlignmentError, match="alignment 4.*need a multiple of 8"):
        OmnipackTaskEncoder.from_dataset(dataset, cp=4)
    with pytest.raises(DatasetAlignmentError):
        OmnipackTaskEncoder.from_dataset(dataset, fp8="fp8")


def test_model_inputs_takes_the_family_trainer_half_and_profile_is_its_deprecated_name():
    planner = get_profile("qwen2_5_vl")
    inputs = planner.inputs()
    te = OmnipackTaskEncoder(model_inputs=inputs, decode_media=True)
    assert te.model_inputs is inputs and te.pixel_dtype == "uint8" and te.check_media
    assert type(OmnipackTaskEncoder(model_inputs=planner).model_inputs) is type(inputs)  # reduced to its half
    with pytest.warns(DeprecationWarning, match="pass model_inputs="):
        old = OmnipackTaskEncoder(profile=inputs, decode_media=True)
    assert old.model_inputs is inputs and old.pixel_dtype == te.pixel_dtype
    assert old.pixel_mean.tolist() == te.pixel_mean.tolist() and old.check_media
    with pytest.warns(DeprecationWarning, match="read model_inputs"):
        assert old.profile is inputs
    with pytest.raises(TypeError, match="model_inputs= only"):
        OmnipackTaskEncoder(model_inputs=inputs, profile=inputs)


def test_two_workers_mbs2_batches_carry_media_in_placeholder_order(dataset):
    te = OmnipackTaskEncoder.from_dataset(dataset)
    tars = read_rows_from_tars(dataset)
    seen, kinds = [], set()
    for batch in _val(dataset, te, workers=2, mbs=2):
        keys = list(batch.__key__)
        seen += keys
        assert batch.tokens.shape == (1, 1024 * len(keys)) and batch.media is None
        expect = _expected_media(te, [tars[k] for k in keys])  # float32, as the HF processors give them
        assert all(batch.media_inputs()[k].dtype == torch.uint8 for k in PIXEL_KEYS & set(expect))
        if "input_features" in expect:  # the workers ship the clips' stored samples, not their log-mel
            shipped = batch.encoder_inputs["input_features_waves"]  # under their own key, never the features'
            assert shipped.ndim == 2 and shipped.dtype in (torch.int16, torch.float32)
            assert "input_features" not in batch.encoder_inputs
            assert set(batch.wave_features) == {"input_features"}
        got = batch.normalized_media_inputs()  # default uint8 pixels, normalized as the trainer does
        assert set(got) == set(expect)
        for k, v in expect.items():
            assert torch.equal(got[k], v), k  # bit-identical after the workers' shared-memory hand-over
        d = batch.as_dict()
        assert all(d[k].dtype == torch.float32 for k in PIXEL_KEYS & set(d))
        toks = d["tokens"][0]
        if "image_grid_thw" in got:  # one image_pad per merged patch, across the whole micro-batch
            assert (
                int((toks == te.placeholder_ids["image"][0]).sum())
                == int(got["image_grid_thw"].prod(1).sum()) // 4
            )
        kinds |= {k for k in got}
    assert sorted(seen) == sorted(tars)
    assert {"pixel_values", "pixel_values_videos", "input_features"} <= kinds


def test_uint8_pixels_normalize_to_the_float32_batches(dataset):
    f32 = list(_val(dataset, OmnipackTaskEncoder.from_dataset(dataset, pixel_dtype="float32"), workers=0))
    te = OmnipackTaskEncoder.from_dataset(dataset, pixel_dtype="uint8")
    u8 = list(_val(dataset, te, workers=0, mbs=2))
    assert len(u8) == len(f32)
    seen = set()
    for a, b in zip(f32, u8, strict=True):
        assert b.pixel_mean.tolist() == pytest.approx(list(te.model_inputs.image_mean))
        assert b.pixel_std.tolist() == pytest.approx(list(te.model_inputs.image_std))
        fa, fb = a.media_inputs(), b.normalized_media_inputs()
        assert set(fa) == set(fb)
        if "input_features" in fa:  # float32: model-ready log-mel from the worker; uint8: samples, same bits
            assert a.wave_features is None and a.encoder_inputs["input_features"].ndim == 3
            assert b.wave_features and b.encoder_inputs["input_features_waves"].ndim == 2
            seen.add("input_features")
        for k, v in fa.items():
            if k in ("pixel_values", "pixel_values_videos"):
                assert b.media_inputs()[k].dtype == torch.uint8
                seen.add(k)
            assert torch.equal(fb[k], v), k
    assert seen == {"pixel_values", "pixel_values_videos", "input_features"}
    with pytest.raises(ValueError, match="pixel_dtype"):
        OmnipackTaskEncoder.from_dataset(dataset, pixel_dtype="float16")


def test_worker_audio_features_equal_the_device_ones_with_uint8_pixels(dataset):
    """``audio_features="worker"`` gives ready log-mel in ``encoder_inputs["input_features"]`` with the
    default uint8 pixels; bit for bit (CPU) the features the default ("device") computes in the accessors
    from the samples it ships under ``input_features_waves``, while its ``input_features`` is absent."""
    device_te = OmnipackTaskEncoder.from_dataset(dataset)
    worker_te = OmnipackTaskEncoder.from_dataset(dataset, audio_features="worker")
    assert device_te.audio_features == "device" and worker_te.audio_features == "worker"
    assert worker_te.pixel_dtype == device_te.pixel_dtype == "uint8"  # pixels stay uint8 either way
    clips = 0
    for dev, work in zip(_val(dataset, device_te, mbs=2), _val(dataset, worker_te, mbs=2), strict=True):
        if "audio_feature_lengths" not in dev.encoder_inputs:
            continue
        ready = work.encoder_inputs["input_features"]
        assert work.wave_features is None and "input_features_waves" not in work.encoder_inputs
        assert ready.dtype == torch.float32 and ready.shape[1] == 128
        assert "input_features" not in dev.encoder_inputs  # a direct read fails loudly, never gets samples
        assert dev.encoder_inputs["input_features_waves"].ndim == 2
        assert torch.equal(dev.media_inputs()["input_features"], ready)
        assert torch.equal(dev.as_dict()["input_features"], ready)
        assert all(work.encoder_inputs[k].dtype == torch.uint8 for k in PIXEL_KEYS & set(work.encoder_inputs))
        for k in ("feature_attention_mask", "audio_feature_lengths"):
            assert torch.equal(dev.encoder_inputs[k], work.encoder_inputs[k]), k
        clips += int(ready.shape[0])
    assert clips
    # float32 pixels may still take the device path; a family without a device front end refuses it
    f32 = OmnipackTaskEncoder.from_dataset(dataset, pixel_dtype="float32", audio_features="device")
    assert f32.audio_features == "device" and f32.media_options.waves
    assert OmnipackTaskEncoder.from_dataset(dataset, pixel_dtype="float32").audio_features == "worker"
    with pytest.raises(ValueError, match="audio_features must be one of"):
        OmnipackTaskEncoder.from_dataset(dataset, audio_features="gpu")
    with pytest.raises(ValueError, match="no device-side audio front end"):
        OmnipackTaskEncoder(model_inputs=get_profile("qwen2_5_vl").inputs(), decode_media=True, audio_features="device")


def test_cp_rank_batches_are_sliced(dataset):
    full = next(iter(_val(dataset, OmnipackTaskEncoder.from_dataset(dataset, decode_media=False), mbs=1)))
    half = next(
        iter(
            _val(
                dataset, OmnipackTaskEncoder.from_dataset(dataset, cp=2, cp_rank=1, decode_media=False), mbs=1
            )
        )
    )
    assert half.tokens.shape == (1, 512) and torch.equal(half.cu_seqlens_q_padded, full.cu_seqlens_q_padded)
    assert full.media is not None and full.encoder_inputs is None  # text-only consumers get bytes, no decode
    # the rank's tokens are the full stream at cp_token_indices (media placeholders located through them)
    assert full.cp_token_indices is None
    assert torch.equal(half.tokens[0], full.tokens[0, half.cp_token_indices])
    assert torch.equal(half.position_ids[0], full.position_ids[0, half.cp_token_indices])


def test_val_order_is_deterministic(dataset):
    te = OmnipackTaskEncoder.from_dataset(dataset, decode_media=False)
    passes = [[k for b in _val(dataset, te, mbs=2) for k in b.__key__] for _ in range(2)]
    assert passes[0] == passes[1] and len(passes[0]) == len(read_rows_from_tars(dataset))


def test_savable_loader_restores_to_the_same_next_batches(dataset):
    def loader():
        ds = get_train_dataset(
            str(dataset),
            worker_config=_wc(2),
            batch_size=2,
            shuffle_buffer_size=4,
            max_samples_per_sequence=2,
            packing_buffer_size=None,
            task_encoder=OmnipackTaskEncoder.from_dataset(dataset),
        )
        return get_savable_loader(ds)

    a = loader()
    it = iter(a)
    for _ in range(3):
        next(it)
    state = a.save_state_rank()
    after = [next(it) for _ in range(3)]
    # Ended here, not by a later garbage collection: a partly read savable loader found in a reference cycle
    # stops its workers only at their 5 s join timeout each (~20 s of the next test's Energon gc.collect).
    it.close()
    b = loader()
    b.restore_state_rank(state)
    it_b = iter(b)
    restored = [next(it_b) for _ in range(3)]
    it_b.close()
    assert [x.__key__ for x in restored] == [x.__key__ for x in after]
    assert torch.equal(restored[-1].tokens, after[-1].tokens)
    for x, y in zip(restored, after, strict=True):
        assert set(x.media_inputs()) == set(y.media_inputs())
        assert all(torch.equal(x.media_inputs()[k], v) for k, v in y.media_inputs().items())


def test_a_row_whose_media_disagrees_with_its_placeholders_fails_loudly(dataset):
    te = OmnipackTaskEncoder.from_dataset(dataset)
    key, parts = next((k, p) for k, p in read_rows_from_tars(dataset).items() if b"image" in p["meta.json"])
    row, meta = decode_row(parts)
    img = next(m for m in row.media if m.kind == "image")
    from omnipack.dataset.codec import npy_bytes

    bad = dict(parts)
    wrong = (32, 1024, 3)  # a stored size whose feature count differs from the plan's
    assert tuple(img.info["target_hw"]) != wrong[:2]
    bad[img.part] = npy_bytes(np.zeros(wrong, np.uint8))
    if img.part.endswith(".png"):  # keep the part name, store a different-size png
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.zeros(wrong, np.uint8)).save(buf, format="PNG")
        bad[img.part] = buf.getvalue()
    sample = cook_packed_row(
        {"__key__": key, "__restore_key__": (), "__subflavors__": {}, "__sources__": (), **bad}
    )
    sid = meta["sample_ids"][img.sample_index]
    with pytest.raises(MediaMismatchError, match=rf"row '{key}', sample '{sid}'") as e:
        te.encode_sample(sample)
    assert isinstance(e.value, FatalSampleError)  # Energon's error handler must not skip it


def test_import_omnipack_stays_light_and_needs_no_av_or_decord():
    code = (
        "import sys\n"
        "import omnipack\n"
        "heavy = [m for m in ('torch', 'megatron', 'av', 'decord', 'PIL', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        # megatron-energon imports PyAV itself when installed (optional); block both to prove omnipack's
        # trainer side never needs them.
        "sys.modules['av'] = None; sys.modules['decord'] = None\n"
        "te = omnipack.OmnipackTaskEncoder\n"
        "assert omnipack.get_train_loader and omnipack.PackedBatch\n"
        "import omnipack.loader.media, omnipack.profiles\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_loader_factories(dataset):
    import omnipack
    from omnipack.loader.compat import DatasetAlignmentError

    w = json.loads((dataset / ".nv-meta" / "omnipack.json").read_text())["seq_length"]
    train = omnipack.get_train_loader(dataset, num_workers=0, cp=2, cp_rank=1, decode_media=False)
    batch = next(iter(train))
    assert batch.tokens.shape == (1, w // 2) and batch.cp_token_indices is not None
    assert hasattr(train, "save_state_rank")
    keys = [
        b.__key__[0]
        for b in omnipack.get_val_loader(dataset, split_part="train", num_workers=0, decode_media=False)
    ]
    assert sorted(keys) == sorted(read_rows_from_tars(dataset))
    with pytest.raises(DatasetAlignmentError):
        omnipack.get_train_loader(dataset, num_workers=0, cp=8)
