"""Media storage: the default raw payloads are exact against the HF image processor, read as zero-copy views
and described from their headers alone; datasets written with the older PNG / deflated settings still load
through Energon to the very same batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.energon import WorkerConfig, get_loader, get_val_dataset
from PIL import Image

from omnipack.dataset.codec import npy_bytes, view_npy, view_npz
from omnipack.dataset.contract import MediaItem
from omnipack.dataset.payload_header import HeaderError, payload_header
from omnipack.loader.media import decode_payload, expand_temporal, normalize_pixels
from omnipack.loader.task_encoder import OmnipackTaskEncoder
from omnipack.media.image import encode_image
from omnipack.media.probe import materialize, probe
from omnipack.media.video import encode_video
from omnipack.profiles import get_profile
from omnipack.profiles.model_inputs import MediaInputOptions
from tests.hf_oracles import qwen_image_processor

PROFILE = "qwen3_omni"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """The same corpus prepared with the default storage and with the previous default (png, deflated)."""
    from omnipack.demo.corpus import build_demo_corpus
    from omnipack.demo.tokenizer import build_demo_tokenizer
    from omnipack.pipeline import PrepareConfig, run_prepare

    root = tmp_path_factory.mktemp("storage")
    tok = build_demo_tokenizer(root / "tok", profile=PROFILE)
    manifest, media = build_demo_corpus(root / "src", num_samples=16, kinds=get_profile(PROFILE).kinds)
    out = {"media": media}
    for name, kw in {"default": {}, "png": {"image_encoding": "png", "compress_video": True}}.items():
        out[name] = root / name
        run_prepare(
            PrepareConfig(
                manifest=[str(manifest)],
                media_root=str(media),
                tokenizer=str(tok),
                output=str(out[name]),
                profile=PROFILE,
                seq_length=1024,
                shard_max_rows=3,
                progress=False,
                **kw,
            )
        )
    return out


def _batches(path: Path, workers: int = 0, **options) -> list:
    te = OmnipackTaskEncoder.from_dataset(path, **options)
    wc = WorkerConfig(rank=0, world_size=1, num_workers=workers)
    return list(
        get_loader(
            get_val_dataset(str(path), split_part="train", worker_config=wc, batch_size=1, task_encoder=te)
        )
    )


def test_default_storage_is_raw_and_older_storage_loads_to_the_same_batches(datasets) -> None:
    import json

    meta = json.loads((datasets["default"] / ".nv-meta" / "omnipack.json").read_text())
    assert (meta["image_encoding"], meta["compress_video"]) == ("npy", False)
    new = {b.__key__[0]: b for b in _batches(datasets["default"], workers=2)}
    old = {b.__key__[0]: b for b in _batches(datasets["png"])}
    assert sorted(new) == sorted(old) and new
    kinds = set()
    for key, a in new.items():
        b = old[key]
        assert torch.equal(a.tokens, b.tokens)
        ma, mb = a.normalized_media_inputs(), b.normalized_media_inputs()
        assert set(ma) == set(mb)
        for k in ma:
            assert torch.equal(ma[k], mb[k]), k
        kinds |= set(ma)
    assert {"pixel_values", "pixel_values_videos", "input_features"} <= kinds


def test_worker_batches_carry_each_image_slot_once(datasets) -> None:
    """Default (uint8) worker batches hold an image's patches with their identical temporal slots once
    (half the bytes built and handed over); every accessor gives the HF layout, the same as float32
    batches built in full; videos (distinct frames per slot) stay whole."""
    u8 = {b.__key__[0]: b for b in _batches(datasets["default"], workers=2)}
    f32 = {b.__key__[0]: b for b in _batches(datasets["default"], pixel_dtype="float32")}
    images = 0
    for key, b in u8.items():
        full = f32[key].media_inputs()
        raw = b.encoder_inputs or {}
        if "pixel_values" in raw:
            images += 1
            assert b.pixel_repeats == {"pixel_values": 2}
            assert raw["pixel_values"].dtype == torch.uint8
            # built in the worker's shared memory: a reused buffer (aliased here) or a fresh shared one
            assert b.buffer_lease is not None or raw["pixel_values"].is_shared()
            n, width = full["pixel_values"].shape
            assert raw["pixel_values"].shape == (n, width // 2)
            assert b.media_inputs()["pixel_values"].shape == full["pixel_values"].shape
        else:
            assert not b.pixel_repeats
        if "pixel_values_videos" in raw:
            assert raw["pixel_values_videos"].shape == full["pixel_values_videos"].shape
        got = b.as_dict()
        for k, v in full.items():
            assert torch.equal(got[k], v), (key, k)
        assert f32[key].pixel_repeats is None
    assert images >= 2


def test_uint8_batches_carry_the_stored_frames_and_patchify_where_used(datasets) -> None:
    """Default (uint8) batches hold each image's and each video's stored frames byte for byte (a worker only
    copies the stored bytes, no transposing gather), videos padded with their last frame to whole temporal
    patches; every accessor cuts them into patches, the same bits as float32 batches built in full."""
    import json

    from omnipack.loader.media import patchify_frames

    tps = get_profile(PROFILE).image.temporal_patch_size
    u8 = _batches(datasets["default"], workers=2)
    f32 = {b.__key__[0]: b for b in _batches(datasets["default"], pixel_dtype="float32")}
    kinds = set()
    for b in u8:
        raw = b.encoder_inputs or {}
        unpatched = b.unpatched_pixels or {}
        assert set(unpatched) == {k for k in raw if k in b.pixel_keys}
        key = b.__key__[0]
        # The row's stored frames, in placeholder order, read straight from its shard.
        row = _stored_row(datasets["default"], key)
        items = sorted(
            json.loads(row["meta.json"])["media"], key=lambda m: (m["sample_index"], m["token_start"])
        )
        for pixel_key, kind in (("pixel_values", "image"), ("pixel_values_videos", "video")):
            stored = []
            for m in (m for m in items if m["kind"] == kind):
                payload = decode_payload(m["part"], row[m["part"]])
                frames = payload["frames"] if isinstance(payload, dict) else payload[None]
                pad = (-len(frames)) % tps if kind == "video" else 0
                stored.append(np.concatenate([frames, frames[-1:].repeat(pad, 0)]).reshape(-1))
            if not stored:
                assert pixel_key not in raw
                continue
            kinds.add(kind)
            assert np.array_equal(raw[pixel_key].numpy().reshape(-1), np.concatenate(stored)), (key, pixel_key)
            grid_key, ps, merge, frames_per_step = unpatched[pixel_key]
            patches = patchify_frames(raw[pixel_key], raw[grid_key].tolist(), 3, ps, merge, frames_per_step)
            assert patches.shape == raw[pixel_key].shape
        full = f32[key].media_inputs()
        for k, v in b.media_inputs().items():
            assert v.dtype == (torch.uint8 if k in b.pixel_keys else full[k].dtype)
        got = b.as_dict()
        for k, v in full.items():
            assert torch.equal(got[k], v), (key, k)
    assert kinds == {"image", "video"}


def _stored_row(ds: Path, key: str) -> dict[str, bytes]:
    """A row's members (name without the key -> bytes), read with tarfile from the dataset's shards."""
    import tarfile

    for shard in sorted((ds / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = {
                m.name.split(".", 1)[1]: tar.extractfile(m).read()
                for m in tar.getmembers()
                if m.name.split(".", 1)[0] == key
            }
        if members:
            return members
    raise KeyError(key)


def test_stored_pixels_are_what_the_hf_image_processor_gives(datasets) -> None:
    """Source image file -> plan -> stored npy -> loader patches (uint8, normalized as on the GPU) equals
    Qwen2VLImageProcessorPil run on the source file itself, bit for bit."""
    profile = get_profile(PROFILE)
    hf = qwen_image_processor(profile)
    item = MediaItem("image", "media.0.npy", 0, 0, 0, 0, 0)
    checked = 0
    for path in sorted(datasets["media"].glob("*.png")) + sorted(datasets["media"].glob("*.jpg")):
        try:
            plan = profile.plan(probe(path, "image"))
        except Exception:  # the demo's deliberately broken / rejected images
            continue
        ext, data = materialize(path, plan)
        assert ext == "npy"
        payload = decode_payload("media.0.npy", data)
        u8 = profile.inputs().media_inputs(item, payload, MediaInputOptions(pixel_dtype="uint8"))
        got = normalize_pixels(torch.from_numpy(u8["pixel_values"]), *profile.inputs().pixel_normalization())
        with Image.open(path) as img:
            ref = hf(images=[np.asarray(img.convert("RGB"))], return_tensors="np")
        assert u8["image_grid_thw"].tolist() == ref["image_grid_thw"].tolist(), path.name
        assert np.array_equal(got.numpy(), ref["pixel_values"]), path.name
        # The loader's default: each image's temporal slot once, repeated after normalizing on the device.
        compact_options = MediaInputOptions(pixel_dtype="uint8", compact=True)
        compact = profile.inputs().media_inputs(item, payload, compact_options)["pixel_values"]
        assert compact.shape == (ref["pixel_values"].shape[0], ref["pixel_values"].shape[1] // 2)
        norm = normalize_pixels(torch.from_numpy(compact), *profile.inputs().pixel_normalization())
        assert np.array_equal(expand_temporal(norm, 3, 2).numpy(), ref["pixel_values"]), path.name
        checked += 1
    assert checked >= 3


def test_npy_and_stored_npz_payloads_are_zero_copy_views() -> None:
    frames = np.random.default_rng(0).integers(0, 256, (3, 28, 56, 3), dtype=np.uint8)
    data = npy_bytes(frames)
    arr = view_npy(data)
    assert np.array_equal(arr, frames) and not arr.flags.writeable
    assert np.shares_memory(arr, np.frombuffer(data, np.uint8))
    audio = np.arange(100, dtype=np.int16)
    _, stored = encode_video(frames, audio, compress=False)
    z = view_npz(stored)
    assert np.shares_memory(z["frames"], np.frombuffer(stored, np.uint8))
    assert np.array_equal(z["frames"], frames) and np.array_equal(z["audio"], audio)
    _, deflated = encode_video(frames, audio, compress=True)
    assert {k: v.tolist() for k, v in view_npz(deflated).items()} == {k: v.tolist() for k, v in z.items()}
    with pytest.raises(ValueError, match="truncated"):
        view_npy(data[:-1])


def test_payload_header_gives_exact_shapes_without_decoding() -> None:
    img = np.random.default_rng(1).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    frames = np.stack([img, img])
    audio = np.zeros(1600, np.int16)
    u1, i2 = np.dtype(np.uint8), np.dtype(np.int16)
    cases = {
        "media.0.npy": (encode_image(img, "npy")[1], {"": ((56, 84, 3), u1)}),
        "media.1.png": (encode_image(img, "png")[1], {"": ((56, 84, 3), u1)}),
        "media.2.npz": (
            encode_video(frames, audio, compress=False)[1],
            {"frames": ((2, 56, 84, 3), u1), "audio": ((1600,), i2)},
        ),
        "media.3.npz": (encode_video(frames, compress=True)[1], {"frames": ((2, 56, 84, 3), u1)}),
        "media.4.npy": (npy_bytes(audio), {"": ((1600,), i2)}),
    }
    for part, (data, arrays) in cases.items():
        assert payload_header(part, data) == arrays, part
        decoded = decode_payload(part, data)  # the header says what decoding yields
        shapes = (
            {k: v.shape for k, v in decoded.items()} if isinstance(decoded, dict) else {"": decoded.shape}
        )
        assert shapes == {k: v[0] for k, v in arrays.items()}, part
    with pytest.raises(HeaderError, match="npy header says"):
        payload_header("media.0.npy", cases["media.0.npy"][0][:-3])  # a payload short of its header
    assert payload_header("media.0.webp", b"RIFF") is None  # no reader: verify decodes it instead
    with pytest.raises(ValueError, match="re-prepare"):
        decode_payload("media.0.webp", b"RIFF")


def test_worker_batches_share_one_storage_for_their_small_tensors(monkeypatch) -> None:
    """In a worker, tensors not yet shared are copied into one shared storage (one file descriptor to hand
    over), as separate non-overlapping views with their values; outside a worker nothing changes."""
    from omnipack.loader.task_encoder import share_in_one_storage

    values = {
        "tokens": torch.arange(10, dtype=torch.int64).reshape(1, 10),
        "loss_mask": torch.ones(1, 10),
        "padding_mask": torch.zeros(1, 10, dtype=torch.bool),
        "max_seqlen": torch.tensor(7, dtype=torch.int32),
        "grid": torch.tensor([[1, 4, 6]]),
        "none": None,
    }
    assert share_in_one_storage(values) is values
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    out = share_in_one_storage(values)
    tensors = {k: v for k, v in out.items() if v is not None}
    assert out["none"] is None and all(v.is_shared() for v in tensors.values())
    assert len({v.untyped_storage().data_ptr() for v in tensors.values()}) == 1
    for k, v in tensors.items():
        assert v.dtype == values[k].dtype and torch.equal(v, values[k]), k
    out["tokens"].fill_(-1)  # views do not overlap
    assert torch.equal(out["loss_mask"], values["loss_mask"]) and int(out["max_seqlen"]) == 7


def test_each_distinct_npy_header_is_parsed_once(monkeypatch) -> None:
    """Rows repeat the same few npy headers (every token part of a dataset has one shape): numpy's header
    parser (an ``ast.literal_eval``, more than the part's read) runs once per distinct header, and the
    arrays, errors and copies stay what they were."""
    from omnipack.dataset.codec import load_npy, npy_header

    calls = []
    parse = np.lib.format.read_array_header_1_0
    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", lambda fp: calls.append(1) or parse(fp))
    shape = (3, 7, int(np.random.default_rng().integers(1, 1 << 12)))  # a header no other test made
    rows = [np.full(shape, i, np.int32) for i in range(5)]
    for i, arr in enumerate(rows):
        data = npy_bytes(arr)
        h = npy_header(data)
        assert (h.dtype, h.shape, h.data_offset) == (np.dtype(np.int32), shape, len(data) - arr.nbytes)
        got = load_npy(data)
        assert np.array_equal(got, arr) and got.flags.writeable and not np.shares_memory(got, data)
        assert np.array_equal(view_npy(data), np.full(shape, i, np.int32))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="not an npy payload"):
        npy_header(b"\x93NUMPY\x01\x00\x40\x00{'descr': '<i4'")  # header cut short
    with pytest.raises(ValueError, match="not an npy payload"):
        npy_header(b"PK\x03\x04" + bytes(60))
