"""Mixed corpora (text, image, video, audio, audio-in-video) pack into rows whose media blocks match."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from omnipack.dataset.codec import decode_row, load_npy
from omnipack.dataset.contract import row_invariant_errors
from omnipack.demo.corpus import build_demo_corpus
from omnipack.demo.tokenizer import build_demo_tokenizer
from omnipack.pipeline import PrepareConfig, run_prepare
from omnipack.profiles import get_profile
from omnipack.text.chat import ChatTokenizer
from tests.test_pipeline import read_rows_from_tars

PLACEHOLDERS = {
    "qwen3_omni": {
        "image": ["<|image_pad|>"],
        "video": ["<|video_pad|>", "<|audio_pad|>"],
        "audio": ["<|audio_pad|>"],
    },
    "nemotron_omni": {"image": ["<image>"], "video": ["<image>"], "audio": ["<so_embedding>"]},
}


def _stored(part: str, data: bytes) -> dict[str, np.ndarray]:
    if part.endswith(".png"):
        with Image.open(io.BytesIO(data)) as img:
            return {"image": np.asarray(img.convert("RGB"))}
    if part.endswith(".npz"):
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    return {"array": load_npy(data)}


@pytest.mark.parametrize(
    ("profile", "options", "mrope"),
    [("qwen3_omni", {"use_audio_in_video": True}, True), ("nemotron_omni", {}, False)],
)
def test_mixed_corpus_rows_match_their_media(tmp_path, profile, options, mrope):
    tok_dir = build_demo_tokenizer(tmp_path / "tok", profile=profile)
    prof = get_profile(profile, **options)
    manifest, media = build_demo_corpus(tmp_path / "src", num_samples=45, kinds=prof.kinds)
    cfg = PrepareConfig(
        manifest=[str(manifest)],
        media_root=str(media),
        tokenizer=str(tok_dir),
        output=str(tmp_path / "ds"),
        profile=profile,
        profile_options=options,
        mrope=mrope,
        seq_length=4096,
        cp=2,
        progress=False,
    )
    summary = run_prepare(cfg)
    assert summary["counts"]["packed"] == 45  # only the six deliberately broken samples are rejected
    chat = ChatTokenizer(tok_dir, prof)
    ids = {k: [chat.tokenizer.convert_tokens_to_ids(t) for t in v] for k, v in PLACEHOLDERS[profile].items()}
    kinds_seen = set()
    for key, parts in read_rows_from_tars(tmp_path / "ds").items():
        row, meta = decode_row(parts)
        assert row_invariant_errors(row, summary["align"]) == [], key
        for m in row.media:
            kinds_seen.add(m.kind)
            if "audio" in _stored(m.part, parts[m.part]):
                kinds_seen.add("video+audio")
            assert row.tokens[m.token_start] in ids[m.kind]  # the block's first placeholder
            stored = _stored(m.part, parts[m.part])
            if m.kind == "image":
                assert list(stored.get("image", stored.get("array")).shape[:2]) == m.info["target_hw"]
            elif m.kind == "video":
                frames = stored.get("frames", stored.get("array"))
                assert frames.shape[0] == len(m.info["frame_indices"])
                assert list(frames.shape[1:3]) == m.info["target_hw"]
                if "audio" in stored:
                    assert (
                        stored["audio"].dtype in (np.int16, np.float32)
                        and len(stored["audio"]) == m.info["num_audio_samples"]
                    )
            else:
                assert (
                    stored["array"].dtype in (np.int16, np.float32)
                    and len(stored["array"]) == m.info["num_audio_samples"]
                )
        # every placeholder token in the row belongs to exactly one media item's count
        all_ids = sorted({i for v in ids.values() for i in v})
        assert int(np.isin(row.tokens, all_ids).sum()) == sum(m.num_tokens for m in row.media)
        if mrope:
            assert row.mrope_position_ids.shape == (3, row.seq_length)
            for a, b, n in zip(
                row.cu_seqlens_padded[:-1], row.cu_seqlens_padded[1:], np.diff(row.cu_seqlens), strict=True
            ):
                seq = row.mrope_position_ids[:, a : a + n]
                assert (seq[:, 0] == 0).all()  # positions restart per sample
                gap = row.mrope_position_ids[:, a + n : b]
                assert (gap >= seq.max()).all()
    assert {"image", "video", "audio"} <= kinds_seen
    if options.get("use_audio_in_video"):
        assert "video+audio" in kinds_seen
    from omnipack.tools.verify import run_verify

    results = run_verify(str(tmp_path / "ds"), workers=1, progress=False)
    assert [r.name for r in results if r.status != "pass"] == []
    meta = json.loads((tmp_path / "ds" / ".nv-meta" / "omnipack.json").read_text())
    assert meta["profile"]["options"] == options and meta["mrope_position_ids"] is mrope
