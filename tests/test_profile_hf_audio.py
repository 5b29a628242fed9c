"""The processor-backed profile (``hf``) on audio: Qwen2-Audio, a model omnipack has no native family for. A
tiny model folder is built from the transformers 5.24 classes (``WhisperFeatureExtractor`` with a 2 s window
and 16 mel bins, ``Qwen2AudioProcessor`` over the demo vocabulary with its audio tokens), prepared without
``--profile``: the run falls back to ``hf``, decodes each clip with omnipack's loader at the extractor's
``sampling_rate``, and every packed sample's token ids, labels and stored tensors (``input_features``,
``feature_attention_mask``) equal the processor's for that sample alone, its clips loaded by the reference
loader (``librosa.load(path, sr=16000)``). Counts depend on a clip's length only: one processor call per
distinct length. Verify, the trainer-only loader and a tiny random Qwen2-Audio model's per-sample logits on
packed rows hold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnipack.cli import main
from omnipack.dataset.codec import decode_row
from omnipack.loader.media import decode_payload
from omnipack.media.audio import resampled_length
from omnipack.profiles import get_profile
from omnipack.profiles.base import MediaMeta
from tests.family_kit import (
    assert_each_samples_own_logits,
    chat_samples,
    encoder_inputs_by_batch,
    prepare,
    prepare_args,
    run_meta,
    trainer_only_encoder_inputs,
    val_batches,
    write_manifest,
)
from tests.test_pipeline import read_rows_from_tars
from tests.test_profile_hf_payload import assert_each_sample_is_the_processors, assert_same_bits, joined

pytest.importorskip("megatron.energon")
sf = pytest.importorskip("soundfile")
librosa = pytest.importorskip("librosa")
ROOT = Path(__file__).resolve().parents[1]
AUDIO_TOKENS = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]
RATE = 16000
# (seconds, source rate, channels): 16 kHz mono (stored int16 as decoded), resampled and mixed clips, and a
# 3 s clip the extractor cuts to its 2 s window (its count capped, as the processor caps it).
CLIPS = [(0.5, 16000, 1), (1.3, 16000, 1), (3.0, 16000, 1), (1.0, 22050, 2), (0.7, 8000, 1)]
ITEM_AXES = {"audio": {"input_features": 0, "feature_attention_mask": 0}}
TEXT_KEYS = ("input_ids", "attention_mask")


def build_qwen2_audio_model_dir(out: Path) -> Path:
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": AUDIO_TOKENS})
    features = transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=2, sampling_rate=RATE)
    transformers.Qwen2AudioProcessor(feature_extractor=features, tokenizer=tok).save_pretrained(out)
    config = transformers.Qwen2AudioConfig()
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    config.save_pretrained(out)
    return out


def _corpus(root: Path, n: int = 12) -> tuple[Path, Path, dict[str, list[dict]]]:
    rng = np.random.default_rng(3)
    media = root / "media"
    media.mkdir(parents=True)
    for k, (secs, rate, channels) in enumerate(CLIPS):
        wave = (0.3 * rng.standard_normal((int(secs * rate), channels))).clip(-1, 1)
        sf.write(media / f"clip{k}.wav", wave, rate, subtype="PCM_16")
    samples = chat_samples(
        "a", n, "audio", [f"clip{k}.wav" for k in range(len(CLIPS))], "What do you hear in {}?",
        "A bird sings.", follow_up=("clip2.wav", "Rain."),
    )  # fmt: skip
    return write_manifest(root, samples), media, samples


def clip_paths(messages: list[dict]) -> list[str]:
    return [p["audio"] for m in messages for p in m["content"] if p["type"] == "audio"]


def processor_alone(proc, media: Path, messages: list[dict]) -> dict[str, np.ndarray]:
    """The processor's outputs for one sample alone, its clips loaded by the reference loader."""
    text = proc.apply_chat_template(messages, tokenize=False)
    audio = [librosa.load(media / p, sr=RATE)[0] for p in clip_paths(messages)]
    kw = {"audio": audio, "sampling_rate": RATE} if audio else {}
    return dict(proc(text=[text], add_special_tokens=False, return_tensors="np", **kw))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_qwen2_audio_model_dir(tmp_path_factory.mktemp("qwen2_audio") / "model")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, model_dir):
    root = tmp_path_factory.mktemp("hf_audio")
    manifest, media, samples = _corpus(root / "src")
    out = prepare(
        manifest, media, root / "ds", "--model", str(model_dir),
        "--seq-length", "512", "--shard-max-rows", "2",
    )
    return media, samples, out


def test_an_audio_model_falls_back_to_its_processor(prepared, model_dir):
    _, samples, out = prepared
    meta = run_meta(out)
    rec = meta["profile"]
    assert rec["name"] == "hf" and rec["source"] == "fallback" and rec["model_type"] == "qwen2_audio"
    settings = rec["settings"]
    assert settings["processor_class"] == "Qwen2AudioProcessor" and settings["turn_end"] == "<|im_end|>"
    assert settings["placeholder_tokens"] == {"audio": ["<|AUDIO|>"]}
    assert settings["media_arrays"] == ITEM_AXES and settings["sampling_rate"] == RATE
    assert rec["processor_files"] == {"audio": f"{model_dir / 'processor_config.json'}#feature_extractor"}
    assert meta["counts"]["packed"] == len(samples) and meta["counts"]["rejected"] == 0
    # one processor call per distinct clip (each of a distinct length), every other clip a cache hit
    used = [p for msgs in samples.values() for p in clip_paths(msgs)]
    cache = meta["processor_cache"]["audio"]
    assert cache["processor_calls"] == len(set(used)) and cache["cache_hits"] == len(used) - len(set(used))


def test_every_sample_equals_the_processor_alone(prepared, proc):
    """Token ids, labels and every stored tensor (joined along the processor's clip axis) are the
    processor's for the sample alone, bit for bit."""
    media, samples, out = prepared
    end = proc.tokenizer.convert_tokens_to_ids("<|im_end|>")
    seen, with_audio = [], 0
    for parts in read_rows_from_tars(out).values():
        row, _ = decode_row(parts)
        for k, sid in enumerate(row.sample_ids):
            want = processor_alone(proc, media, samples[sid])
            a, b = int(row.cu_seqlens[k]), int(row.cu_seqlens[k + 1])
            start = int(row.cu_seqlens_padded[k])
            assert row.tokens[start : start + b - a].tolist() == want["input_ids"][0].tolist(), sid
            labels = row.labels[start : start + b - a]
            targets = labels[labels >= 0].tolist()
            answers = [p["text"] for m in samples[sid] if m["role"] == "assistant" for p in m["content"]]
            assert proc.tokenizer.decode(targets) == "".join(f"{t}<|im_end|>" for t in answers), sid
            assert targets.count(end) == len(answers)
            items = sorted((m for m in row.media if m.sample_index == k), key=lambda m: m.token_start)
            assert [m.kind for m in items] == ["audio"] * len(clip_paths(samples[sid]))
            stored = [dict(decode_payload(m.part, parts[m.part])) for m in items]
            assert_same_bits(joined(stored, ITEM_AXES["audio"]), {k: v for k, v in want.items() if k not in TEXT_KEYS}, sid)
            seen.append(sid)
            with_audio += bool(items)
    assert sorted(seen) == sorted(samples) and with_audio >= 6


def test_the_processor_runs_once_per_clip_length(model_dir, proc):
    """1000 clips of 50 distinct lengths (at several source rates): 50 processor calls, and each count the
    processor's for a real clip of that length at its rate."""
    prof = get_profile("hf", model_dir=str(model_dir))
    rng = np.random.default_rng(0)
    rates = [8000, 16000, 22050, 44100]
    shapes = [(300 + 997 * k, rates[k % 4]) for k in range(50)]  # 0.01 s .. 6 s, some past the 2 s window
    assert len({resampled_length(n, r, RATE) for n, r in shapes}) == 50  # 50 lengths at 16 kHz too
    counts = {}
    for k in rng.integers(0, 50, 1000).tolist() + list(range(50)):
        n, rate = shapes[k]
        plan = prof.plan(MediaMeta("audio", num_samples=n, sample_rate=rate))
        assert plan.sample_rate == RATE and plan.num_audio_samples == resampled_length(n, rate, RATE)
        counts[(n, rate)] = plan.num_tokens
    assert prof.cache_stats() == {"audio": {"processor_calls": 50, "cache_hits": 1000}}
    audio_id = proc.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    for n, rate in shapes[::6]:  # a real (non-silent) clip of that length gives the same count
        wave = rng.standard_normal(resampled_length(n, rate, RATE)).astype(np.float32)
        ids = proc(text=["<|AUDIO|>"], audio=[wave], sampling_rate=RATE)["input_ids"][0]
        assert counts[(n, rate)] == sum(int(i) == audio_id for i in ids)


def test_verify_and_the_loader_hand_the_processor_tensors_batched(prepared, proc):
    """``omnipack verify`` re-measures with the processor and finds every row as written; the loader's
    micro-batches of two rows hold every sample's processor outputs, in stream order, joined per clip."""
    media, samples, out = prepared
    assert main(["verify", str(out), "--workers", "1"]) == 0
    audio_id = proc.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    seen = []
    for batch in val_batches(out, batch_size=2):
        sids = [s for row in batch.sample_ids for s in row]
        seen += sids
        want = joined([processor_alone(proc, media, samples[s]) for s in sids], ITEM_AXES["audio"])
        got = {k: v.numpy() for k, v in (batch.encoder_inputs or {}).items()}
        assert_same_bits(got, want, sids)
        clips = sum(len(r["media"]) for r in batch.row_meta)
        assert (clips == 0 and not got) or got["input_features"].shape[0] == clips
        assert int((batch.tokens == audio_id).sum()) == sum(m["num_tokens"] for r in batch.row_meta for m in r["media"])
    assert sorted(seen) == sorted(samples)


def test_the_trainer_only_install_loads_them(prepared, tmp_path):
    """With transformers, tokenizers and the decoders blocked, the loader gives the same tensors."""
    out = prepared[2]
    unimported = ("transformers", "tokenizers", "av", "decord", "soundfile", "soxr", "librosa")
    got = trainer_only_encoder_inputs(out, tmp_path, unimported)
    want = encoder_inputs_by_batch(val_batches(out, batch_size=2))
    assert want and got.keys() == want.keys()
    assert all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)


def test_a_clip_unlike_its_plan_is_rejected_at_write(model_dir):
    """The write stage's processor run checks the decoded clip against the plan: a clip decoded to another
    length (the file changed since it was measured) is a reject with the reason, never stored."""
    from omnipack.media.errors import MediaRejected

    prof = get_profile("hf", model_dir=str(model_dir))
    plan = prof.plan(MediaMeta("audio", num_samples=16000, sample_rate=RATE))
    stored = prof.store_media(plan, np.zeros(16000, np.int16))
    assert {k: [list(v.shape), v.dtype.str] for k, v in stored.items()} == plan.info["stored_arrays"]
    with pytest.raises(MediaRejected, match="decoded to 12000 samples"):
        prof.store_media(plan, np.zeros(12000, np.float32))


def build_gemma3n_model_dir(out: Path) -> Path:
    """Gemma3n (image + audio): its feature extractor pads every clip's waveform to the longest of the call
    before computing features and their mask, so a clip's features depend on the other clips beside it."""
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out)
    extra = {
        "image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
        "audio_token": "<audio_soft_token>", "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>",
    }  # fmt: skip
    tok = AutoTokenizer.from_pretrained(out, extra_special_tokens=extra)
    tok.add_special_tokens({"additional_special_tokens": list(extra.values())})
    template = tok.chat_template.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image_soft_token>")
    template = template.replace("{%- elif item['type'] == 'audio' -%}", "{%- elif item['type'] == 'audio' -%}<audio_soft_token>")
    transformers.Gemma3nProcessor(
        feature_extractor=transformers.Gemma3nAudioFeatureExtractor(),
        image_processor=transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32}),
        tokenizer=tok, chat_template=template, audio_seq_length=6, image_seq_length=4,
    ).save_pretrained(out)  # fmt: skip
    config = transformers.Gemma3nConfig()
    config.architectures = ["Gemma3nForConditionalGeneration"]
    config.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def gemma3n(tmp_path_factory):
    """(processor, media, samples, dataset): the audio corpus prepared with a Gemma3n folder."""
    from transformers import AutoProcessor

    root = tmp_path_factory.mktemp("gemma3n")
    folder = build_gemma3n_model_dir(root / "model")
    manifest, media, samples = _corpus(root / "src")
    out = prepare(manifest, media, root / "ds", "--model", str(folder), "--seq-length", "512", "--shard-max-rows", "2")
    return AutoProcessor.from_pretrained(str(folder)), media, samples, out


GEMMA3N_AXES = {"input_features": 0, "input_features_mask": 0}


def test_clips_whose_features_depend_on_the_others_are_stored_from_their_sample_together(gemma3n):
    """Gemma3n pads a sample's clips to the longest before computing their features: its clips are processed
    per sample's clip set (the count and the tensors of that set, cached by the tuple of clip lengths), and
    each clip stores its rows of the processor's output. Every sample's token ids, labels and stored tensors
    equal the processor's for the sample alone, bit for bit; verify and the loader's micro-batches of two
    rows hold them (other samples' clips padded with zeros and a false mask, as the processor pads)."""
    proc, media, samples, out = gemma3n
    meta = run_meta(out)
    settings = meta["profile"]["settings"]
    assert (meta["profile"]["name"], meta["profile"]["source"]) == ("hf", "fallback")
    assert settings["media_arrays"]["audio"] == GEMMA3N_AXES
    assert settings["media_joint"] == {"audio": {"per_sample": [], "masks": {}}}
    assert meta["counts"]["packed"] == len(samples) and meta["counts"]["rejected"] == 0
    sets = [tuple(clip_paths(m)) for m in samples.values() if clip_paths(m)]  # each clip of its own length
    cache = meta["processor_cache"]["audio"]
    assert cache["processor_calls"] == len(set(sets)) and cache["cache_hits"] == len(sets) - len(set(sets))
    seen = assert_each_sample_is_the_processors(
        out, samples, lambda sid: processor_alone(proc, media, samples[sid]),
        lambda parts: joined(parts, GEMMA3N_AXES), proc.tokenizer,
    )  # fmt: skip
    assert sum(n > 1 and len(set(clip_paths(samples[sid]))) > 1 for sid, n in seen.items()) >= 2
    assert main(["verify", str(out), "--workers", "1"]) == 0
    for batch in val_batches(out, batch_size=2):
        sids = [s for row in batch.sample_ids for s in row]
        want = joined([processor_alone(proc, media, samples[s]) for s in sids], GEMMA3N_AXES)
        assert_same_bits({k: v.numpy() for k, v in (batch.encoder_inputs or {}).items()}, want, sids)


def test_a_mask_given_for_several_clips_only_is_built_where_a_micro_batch_joins_several():
    """Phi-4-multimodal's extractor gives ``audio_attention_mask`` for two clips or more, none for one. Two
    samples of one clip each, stored as the extractor gives them alone, joined in one micro-batch: the trainer
    half builds the mask the extractor gives for the two together (true over each clip's own frames), whose
    frames equal the extractor's, and gives none for a micro-batch of one clip."""
    import transformers

    from omnipack.profiles.hf import HFInputs
    from omnipack.profiles.model_inputs import MediaInputOptions

    extractor = transformers.Phi4MultimodalFeatureExtractor()
    rng = np.random.default_rng(0)
    clips = [(0.3 * rng.standard_normal(n)).astype(np.float32) for n in (16000, 4813)]
    alone = [dict(extractor([c], sampling_rate=RATE, return_tensors="np")) for c in clips]
    both = extractor(clips, sampling_rate=RATE, return_tensors="np")
    axes = {"audio_attention_mask": 0, "audio_embed_sizes": 0, "audio_input_features": 0}
    masks = {"audio_attention_mask": ["audio_input_features", "|b1", 2]}
    inputs = HFInputs({
        "placeholder_tokens": {"audio": ["<|audio|>"]}, "media_arrays": {"audio": axes},
        "media_joint": {"audio": {"per_sample": [], "masks": masks}},
    })  # fmt: skip
    got = {k: v.numpy() for k, v in inputs.collate_media(alone, MediaInputOptions()).items()}
    assert "audio_attention_mask" not in alone[0]
    small = ("audio_attention_mask", "audio_embed_sizes")
    assert_same_bits({k: got[k] for k in small}, {k: both[k] for k in small}, "two clips")
    mask = got["audio_attention_mask"]
    assert got["audio_input_features"].shape == both["audio_input_features"].shape
    assert np.array_equal(got["audio_input_features"][mask], both["audio_input_features"][mask])
    assert set(inputs.collate_media(alone[:1], MediaInputOptions())) == {"audio_embed_sizes", "audio_input_features"}


def test_a_processor_that_takes_one_clip_per_text_is_refused_at_start(tmp_path, capsys):
    """AudioFlamingo3's processor (torch tensors only, read back as numpy) takes one clip per text: a sample
    of two clips cannot be processed, so the model is refused at start with the processor's own reason."""
    import transformers
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    folder = build_demo_tokenizer(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": ["<sound>"]})
    template = tok.chat_template.replace("{%- elif item['type'] == 'audio' -%}", "{%- elif item['type'] == 'audio' -%}<sound>")
    features = transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=2)
    transformers.AudioFlamingo3Processor(features, tok, chat_template=template).save_pretrained(folder)
    config = transformers.AudioFlamingo3Config()
    config.architectures = ["AudioFlamingo3ForConditionalGeneration"]
    config.save_pretrained(folder)
    manifest, media, _ = _corpus(tmp_path / "src", n=2)
    args = prepare_args(manifest, media, tmp_path / "ds", "--model", str(folder))
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "profile hf: AudioFlamingo3Processor" in err, err
    assert "cannot process a sample's audios offline" in err and "must match 1:1" in err, err
    assert not (tmp_path / "ds").exists()


# ---- a tiny random Qwen2-Audio model on the loader's packed rows ----


@pytest.fixture(scope="module")
def tiny_model(proc):
    """A random Qwen2-Audio whose encoder takes the extractor's 200 frames of 16 mel bins (100 positions
    after its stride-2 conv, pooled by 2: the processor's counts)."""
    import transformers

    audio = dict(
        num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64,
        max_source_positions=100,
    )  # fmt: skip
    text = dict(
        model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=len(proc.tokenizer), initializer_range=0.3,
    )  # fmt: skip
    config = transformers.Qwen2AudioConfig(
        audio_config=audio, text_config=text, audio_token_id=proc.tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    )
    torch.manual_seed(0)
    return transformers.Qwen2AudioForConditionalGeneration._from_config(config, attn_implementation="eager").eval()


def test_a_packed_row_gives_each_samples_own_logits(prepared, proc, tiny_model):
    """Each loader row (position resets, block-diagonal causal mask, the stored tensors under the processor's
    keys) gives, on every sample's tokens, the logits of that sample alone through the processor and model
    (within float noise relative to the logits: the clips' encoder batch differs)."""
    media, samples, out = prepared
    checked = assert_each_samples_own_logits(
        tiny_model, out, lambda sid: processor_alone(proc, media, samples[sid]), rel=1e-6
    )
    assert checked  # a sample after the first of its row holds clips
