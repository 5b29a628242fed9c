"""Gemma 3 profile: exact against ``Gemma3Processor`` / ``Gemma3ImageProcessor`` loaded with ``AutoProcessor``.

The oracle is a model directory built offline: Google's released ``preprocessor_config.json`` for Gemma 3 and
a tiny byte-level BPE tokenizer with Gemma's special tokens and chat template. ``AutoProcessor`` resolves it to
``Gemma3Processor`` with ``Gemma3ImageProcessor``'s PIL backend (no torchvision here), as for a user.

Pixels go the way a dataset's do: the source image is written to a file, materialised by the write stage's
``omnipack.media.probe.materialize`` from its plan (the stored views), decoded by the loader's
``decode_payload``, and turned into ``pixel_values`` by the trainer half.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.loader.media import decode_payload
from omnipack.media.probe import materialize
from omnipack.profiles import MediaMeta, MediaPlan, MediaRejected, get_profile
from omnipack.profiles.gemma3 import (
    CHAT_TEMPLATE,
    PanAndScan,
    image_token_type_ids,
    pan_and_scan_boxes,
)
from omnipack.profiles.model_inputs import MediaInputOptions
from tests.family_kit import byte_level_bpe

PLAIN = MediaInputOptions()  # float32 pixels, built eagerly, private memory

pytest.importorskip("transformers")

GEMMA_SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
# google/gemma-3-4b-it preprocessor_config.json (pan-and-scan values are null: the processor's own apply).
RELEASED_PREPROCESSOR_CONFIG = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}
# (height, width): square, mild and strong landscape/portrait, too thin to crop, tiny, large.
SIZES = [
    (480, 640),
    (300, 900),
    (900, 300),
    (700, 260),
    (100, 1000),
    (896, 896),
    (20, 30),
    (1000, 1300),
    (300, 1200),
]
PAS = {"do_pan_and_scan": True}
PAS_TIGHT = {
    "do_pan_and_scan": True,
    "pan_and_scan_min_crop_size": 128,
    "pan_and_scan_max_num_crops": 3,
    "pan_and_scan_min_ratio_to_activate": 1.5,
}


def build_gemma_model_dir(out_dir: str | Path, *, newline_merges: bool = False) -> Path:
    """Tokenizer (Gemma's special tokens, boi/eoi/image token attributes, chat template) and the released
    preprocessor_config, saved as a model directory. ``newline_merges``: the vocabulary merges runs of
    newlines (as Gemma's real one has tokens for them)."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    newlines = ["Paragraph one.\n\nParagraph two.\n\n\nThree.\n"] * 40 if newline_merges else []
    tok = byte_level_bpe(GEMMA_SPECIAL_TOKENS, newlines)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(RELEASED_PREPROCESSOR_CONFIG))
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_gemma_model_dir(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def processor(model_dir):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(str(model_dir))
    assert type(proc).__name__ == "Gemma3Processor"
    assert type(proc.image_processor).__name__.startswith("Gemma3ImageProcessor")
    return proc


def _stored(frame: np.ndarray, plan: MediaPlan, tmp: Path) -> np.ndarray:
    """The payload the write stage stores for ``frame`` under ``plan``, as the loader decodes it."""
    src = tmp / f"src-{frame.shape[0]}x{frame.shape[1]}.png"
    Image.fromarray(frame).save(src)
    ext, data = materialize(src, MediaPlan.from_json(json.loads(json.dumps(plan.to_json()))))
    return decode_payload(f"media.0.{ext}", data)


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + h * 7 + w)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * y) % 256], -1)
    return (base + rng.integers(0, 40, (h, w, 3))).clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("pas", [{}, PAS, PAS_TIGHT], ids=["default", "pan_and_scan", "pan_and_scan_tight"])
def test_crops_pixels_and_counts_match_the_image_processor(processor, pas, tmp_path):
    import torch

    from omnipack.loader.media import normalize_pixels

    prof = get_profile("gemma3", **pas)
    inputs = prof.inputs()
    crops_seen = set()
    for h, w in SIZES:
        frame = _image(h, w)
        # The processor's own images_kwargs defaults (it passes them on every call) under the call's options.
        kwargs = {**type(processor).images_kwargs, **pas}
        hf = processor.image_processor(images=[Image.fromarray(frame)], return_tensors="np", **kwargs)
        plan = prof.plan(MediaMeta(kind="image", width=w, height=h))
        assert plan.info["num_crops"] == int(hf["num_crops"][0]), (h, w)
        crops_seen.add(plan.info["num_crops"])
        item = {"kind": "image", "info": plan.to_json()}
        stored = _stored(frame, plan, tmp_path)
        assert stored.dtype == np.uint8 and stored.shape[-3:] == (896, 896, 3)
        assert inputs.feature_count(item, stored) == plan.num_tokens == 256 * hf["pixel_values"].shape[0]
        ours = inputs.media_inputs(item, stored, PLAIN)["pixel_values"]
        assert ours.dtype == np.float32 and ours.shape == hf["pixel_values"].shape
        assert np.array_equal(ours, hf["pixel_values"]), (h, w, pas)
        raw = inputs.media_inputs(item, stored, MediaInputOptions(pixel_dtype="uint8"))["pixel_values"]
        mean, std = inputs.pixel_normalization()
        on_device = normalize_pixels(torch.from_numpy(raw), mean, std).numpy()
        assert np.array_equal(on_device, hf["pixel_values"]), (h, w, pas)
    assert crops_seen == {0} if not pas else (0 in crops_seen and len(crops_seen) >= 2)


def test_pan_and_scan_boxes_are_the_image_processors_crops(processor):
    ip = processor.image_processor
    rng = np.random.default_rng(1)
    settings = [
        PanAndScan(True),
        PanAndScan(True, 64, 5, 1.1),
        PanAndScan(True, 256, 5),
        PanAndScan(True, 300, 2, 2.0),
    ]
    # Edges: the long side caps the crop count below the rounded ratio (else the crops would be too small).
    edges = [(70, 315), (315, 70), (260, 1170), (1170, 260), (256, 307), (100, 100), (1, 1600)]
    sizes = edges + [tuple(int(v) for v in rng.integers(16, 1600, 2)) for _ in range(50)]
    for h, w in sizes:
        chw = rng.integers(0, 255, (3, h, w), dtype=np.uint8)
        for pas in settings:
            crops = ip.pan_and_scan(chw, pas.min_crop_size, pas.max_num_crops, pas.min_ratio_to_activate)
            boxes = pan_and_scan_boxes(h, w, pas)
            assert len(boxes) == len(crops), (h, w, pas)
            for (t, left, b, r), crop in zip(boxes, crops, strict=True):
                assert np.array_equal(chw[:, t:b, left:r], crop)
    assert pan_and_scan_boxes(300, 900, PanAndScan(False)) == []


def _conversation(n_images: int) -> list[dict]:
    user: list[dict] = [{"type": "text", "text": "Describe the picture."}]
    for _ in range(n_images):
        user.insert(0, {"type": "image", "image": "x.png"})
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": user},
        {"role": "assistant", "content": "The image shows a red square."},
        {"role": "user", "content": [{"type": "text", "text": "Count the objects."}, {"type": "image"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Five dozen jugs."}]},
    ]


def _encode_both(model_dir, processor, sizes, pas, tmp: Path):
    from omnipack.text.chat import ChatTokenizer

    prof = get_profile("gemma3", **pas)
    chat = ChatTokenizer(model_dir, prof)
    messages = _conversation(len(sizes) - 1)
    frames = [_image(h, w, seed=k) for k, (h, w) in enumerate(sizes)]
    plans = [prof.plan(MediaMeta(kind="image", width=f.shape[1], height=f.shape[0])) for f in frames]
    enc = chat.encode(messages, plans)
    text = processor.tokenizer.apply_chat_template(messages, tokenize=False)
    hf = processor(
        images=[Image.fromarray(f) for f in frames],
        text=text,
        add_special_tokens=False,
        return_tensors="np",
        **pas,
    )
    stored = [_stored(f, p, tmp) for f, p in zip(frames, plans, strict=True)]
    return prof, chat, enc, hf, stored


@pytest.mark.parametrize("pas", [{}, PAS, PAS_TIGHT], ids=["default", "pan_and_scan", "pan_and_scan_tight"])
def test_token_ids_token_types_and_pixels_match_the_processor(model_dir, processor, pas, tmp_path):
    sizes = [(300, 900), (480, 640), (900, 300)]
    prof, chat, enc, hf, stored = _encode_both(model_dir, processor, sizes, pas, tmp_path)
    assert enc.input_ids.tolist() == hf["input_ids"][0].tolist()
    image_id = processor.tokenizer.image_token_id
    assert image_token_type_ids(enc.input_ids, image_id).tolist() == hf["token_type_ids"][0].tolist()
    assert [s.num_placeholders for s in enc.spans] == [p.plan.num_tokens for p in enc.spans]
    inputs = prof.inputs()
    collated = inputs.collate_media([inputs.media_inputs({"kind": "image"}, f, PLAIN) for f in stored], PLAIN)
    assert np.array_equal(collated["pixel_values"].numpy(), hf["pixel_values"])
    if pas:
        assert "Here is the original image" in processor.tokenizer.decode(enc.input_ids)
    assert enc.mrope_position_ids is None  # 1-D positions


@pytest.mark.parametrize("pas", [{}, PAS], ids=["default", "pan_and_scan"])
def test_newline_merging_vocabulary_matches_the_processor(tmp_path, pas):
    """The processor replaces ``<start_of_image>`` in the string, so a block's "\n\n" edges are tokenized
    with the text beside them ("user\n" before, "objects." before the second image): with a vocabulary that
    merges newline runs, as Gemma's does, only in-context tokenization gives its ids."""
    from transformers import AutoProcessor

    model_dir = build_gemma_model_dir(tmp_path / "nl", newline_merges=True)
    proc = AutoProcessor.from_pretrained(str(model_dir))
    tok = proc.tokenizer
    # the vocabulary does merge: tokenizing the pieces apart would give other ids
    assert tok.encode("\n\n\n", add_special_tokens=False) != tok.encode("\n", add_special_tokens=False) + tok.encode(
        "\n\n", add_special_tokens=False
    )
    sizes = [(480, 640), (300, 900)]
    _, _, enc, hf, _ = _encode_both(model_dir, proc, sizes, pas, tmp_path)
    assert enc.input_ids.tolist() == hf["input_ids"][0].tolist()
    assert image_token_type_ids(enc.input_ids, tok.image_token_id).tolist() == hf["token_type_ids"][0].tolist()
    for span in enc.spans:  # each block's span holds its markers and its placeholders, and is never a target
        block = enc.input_ids[span.start : span.end]
        assert int((block == tok.image_token_id).sum()) == span.num_placeholders == span.plan.num_tokens
        assert enc.input_ids[span.placeholder_start] == tok.image_token_id
        assert (enc.labels[max(span.start - 1, 0) : span.end - 1] == -100).all()
    supervised = tok.decode(enc.input_ids[1:][enc.labels[:-1] != -100])
    assert supervised == "The image shows a red square.<end_of_turn>Five dozen jugs.<end_of_turn>"


def test_labels_cover_model_turns_through_end_of_turn(model_dir, processor, tmp_path):
    _, chat, enc, _, _ = _encode_both(model_dir, processor, [(64, 64), (64, 64)], {}, tmp_path)
    tok = processor.tokenizer
    ids, labels = enc.input_ids, enc.labels
    # label[p] is the target of position p, i.e. token p+1: collect the supervised targets as runs.
    runs, cur = [], []
    for p in range(len(ids) - 1):
        if labels[p] != -100:
            assert labels[p] == ids[p + 1]
            cur.append(int(labels[p]))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    assert [tok.decode(r) for r in runs] == [
        "The image shows a red square.<end_of_turn>",
        "Five dozen jugs.<end_of_turn>",
    ]
    rendered = tok.decode(ids)
    assert rendered.startswith(
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\n\n\n<start_of_image>"
    )
    assert "<end_of_turn>\n<start_of_turn>model\nThe image shows" in rendered
    image_id = tok.image_token_id
    assert not np.isin(labels, [image_id, tok.convert_tokens_to_ids("<end_of_image>")]).any()


def test_profile_options_settings_and_rejects(tmp_path, model_dir):
    cfg = dict(RELEASED_PREPROCESSOR_CONFIG, size={"height": 448, "width": 448}, image_mean=[0.4, 0.5, 0.6])
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(cfg))
    prof = get_profile("gemma3", preprocessor_config=str(tmp_path), image_seq_length=64, do_pan_and_scan=True)
    plan = prof.plan(MediaMeta(kind="image", width=900, height=300))
    assert plan.num_tokens == 64 * 4 and plan.info["num_crops"] == 3 and plan.target_hw == (448, 448)
    assert plan.image_views == ((0, 0, 300, 900), (0, 0, 300, 300), (0, 300, 300, 600), (0, 600, 300, 900))
    assert plan.resample == "bilinear"
    assert MediaPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    stored = _stored(_image(300, 900), plan, tmp_path)
    assert stored.shape == (4, 448, 448, 3)
    # the trainer half is built from the recorded settings alone
    inputs = prof.inputs()
    assert inputs.media_inputs({"kind": "image"}, stored, PLAIN)["pixel_values"].shape == (4, 3, 448, 448)
    s = prof.settings()
    assert (
        s["size"] == [448, 448] and s["pan_and_scan"]["enabled"] and s["normalize"]["mean"] == [0.4, 0.5, 0.6]
    )
    assert json.loads(json.dumps(s)) == s
    with pytest.raises(MediaRejected, match="size unknown"):
        prof.plan(MediaMeta(kind="image", width=0, height=10))
    with pytest.raises(MediaRejected, match="does not support video"):
        prof.plan(MediaMeta(kind="video", width=10, height=10, num_frames=2, fps=1.0))
    with pytest.raises(ValueError, match="image_seq_length"):
        get_profile("gemma3", image_seq_length=0)
    with pytest.raises(ValueError, match="expected \\(448, 448\\)"):
        inputs.feature_count({"kind": "image"}, np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="pixel_dtype"):
        inputs.media_inputs({"kind": "image"}, stored, MediaInputOptions(pixel_dtype="float16"))
    with pytest.raises(ValueError, match="lack 'size'"):
        type(inputs).from_settings({"image_seq_length": 256})
    toks = get_profile("gemma3").special_tokens()
    assert toks[0] == "<end_of_turn>" and {"<start_of_image>", "<end_of_image>", "<image_soft_token>"} <= set(
        toks
    )
    assert get_profile("gemma3").turn_start == "<start_of_turn>" and not get_profile("gemma3").uses_mrope()


def test_views_outside_the_image_are_a_decode_error(tmp_path):
    from omnipack.media.errors import MediaError

    prof = get_profile("gemma3")
    plan = prof.plan(MediaMeta(kind="image", width=64, height=64))
    src = tmp_path / "small.png"
    Image.fromarray(_image(32, 32)).save(src)  # the file changed after it was planned
    with pytest.raises(MediaError, match="outside the 32x32 image"):
        materialize(src, plan)


def test_deferred_inputs_fill_the_batch_tensor_like_the_direct_path(tmp_path):
    prof = get_profile("gemma3", do_pan_and_scan=True)
    inputs = prof.inputs()
    stored = [
        _stored(f, prof.plan(MediaMeta("image", f.shape[1], f.shape[0])), tmp_path)
        for f in (_image(300, 900), _image(64, 64))
    ]
    for dtype in ("uint8", "float32"):
        eager = MediaInputOptions(pixel_dtype=dtype)
        late = MediaInputOptions(pixel_dtype=dtype, deferred=True)
        direct = [inputs.media_inputs({"kind": "image"}, f, eager) for f in stored]
        deferred = [inputs.media_inputs({"kind": "image"}, f, late) for f in stored]
        a = inputs.collate_media(direct, PLAIN)["pixel_values"].numpy()
        b = inputs.collate_media(deferred, PLAIN)["pixel_values"].numpy()
        assert a.shape == (5, 3, 896, 896) and a.dtype == np.dtype(dtype) and np.array_equal(a, b)


def test_cost_model_counts_every_view():
    prof = get_profile("gemma3", do_pan_and_scan=True)
    shapes = prof.cost_shapes()
    one = prof.media_cost(prof.plan(MediaMeta(kind="image", width=448, height=448)), shapes)
    four = prof.media_cost(prof.plan(MediaMeta(kind="image", width=1200, height=300)), shapes)
    assert one > 0 and four == pytest.approx(5 * one)
