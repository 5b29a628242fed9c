"""Token starts from the ids alone (byte-level BPE) equal the tokenizer's own offsets, and the measure stage
gives the same ids, labels and spans with them as with offsets, for every tokenizer setup it sees."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.profiles import MediaMeta, get_profile
from omnipack.text.chat import ChatTokenizer
from omnipack.text.token_starts import TokenByteStarts

TEXTS = [
    "plain text",
    "é😀中文 question 🎉",
    "e\u0301 combining and \u00e9 composed",  # not NFC: an NFC normalizer changes it
    "  spaced  \n\n  leading newlines\t",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 family, \u0928\u092e\u0938\u094d\u0924\u0947",
    "",
]

CONVERSATIONS = [
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    [
        {"role": "system", "content": "Sys tem."},
        {"role": "user", "content": "é😀中文 question"},
        {"role": "assistant", "content": "😀 starts with an emoji, ends with one 🎉"},
        {"role": "user", "content": "e\u0301 combining"},
        {"role": "assistant", "content": " leading space, e\u0301 not NFC"},
    ],
    [{"role": "user", "content": "  "}, {"role": "assistant", "content": "\n\n  中文答案。  "}],
]


def _variant(tmp_path, demo_tokenizer, name: str, change) -> str:
    """The demo tokenizer with one component changed (a setup seen in released checkpoints)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_tokenizer)
    change(tok.backend_tokenizer)
    out = tmp_path / name
    tok.save_pretrained(out)
    return str(out)


def _qwen_like(backend) -> None:
    """Qwen2's setup: NFC, a regex split then byte mapping, a ByteLevel post-processor that keeps offsets."""
    from tokenizers import Regex, normalizers, pre_tokenizers, processors

    backend.normalizer = normalizers.NFC()
    pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)


def _trimming(backend) -> None:
    """GPT-2's post-processor: offsets trimmed of a token's leading spaces."""
    from tokenizers import processors

    backend.post_processor = processors.ByteLevel(trim_offsets=True)


def _metaspace(backend) -> None:
    """A SentencePiece-style pre-tokenizer: spaces become '▁', so byte lengths do not add up."""
    from tokenizers import pre_tokenizers

    backend.pre_tokenizer = pre_tokenizers.Metaspace()


def _stripping_added_token(backend) -> None:
    from tokenizers import AddedToken

    backend.add_special_tokens([AddedToken("<|strip|>", lstrip=True, special=True)])


def _char_starts(text: str, byte_starts: np.ndarray) -> list[int]:
    char_of_byte = np.repeat(np.arange(len(text)), [len(c.encode("utf-8")) for c in text])
    return char_of_byte[byte_starts].tolist()


@pytest.mark.parametrize("setup", [None, _qwen_like])
def test_byte_starts_equal_the_tokenizers_offsets(tmp_path, demo_tokenizer, setup):
    from transformers import AutoTokenizer

    path = demo_tokenizer if setup is None else _variant(tmp_path, demo_tokenizer, "v", setup)
    backend = AutoTokenizer.from_pretrained(path).backend_tokenizer
    starts = TokenByteStarts.for_tokenizer(backend)
    assert starts is not None
    placed = 0
    for text in TEXTS:
        enc = backend.encode(text, add_special_tokens=False)
        got = starts.starts(np.asarray(enc.ids, dtype=np.int64), text)
        if got is None:  # only a text the normalizer changes is left to the offsets
            assert setup is _qwen_like and backend.normalizer.normalize_str(text) != text
            continue
        placed += 1
        assert _char_starts(text, got) == [a for a, _ in enc.offsets]
    assert placed >= len(TEXTS) - 1


@pytest.mark.parametrize("setup", [_trimming, _metaspace, _stripping_added_token])
def test_setups_where_ids_do_not_place_tokens_keep_the_offsets(tmp_path, demo_tokenizer, setup):
    from transformers import AutoTokenizer

    path = _variant(tmp_path, demo_tokenizer, setup.__name__, setup)
    assert TokenByteStarts.for_tokenizer(AutoTokenizer.from_pretrained(path).backend_tokenizer) is None


def _encoded(chat: ChatTokenizer, samples) -> list[tuple[list[int], list[int], list[tuple]]]:
    out = []
    for enc in chat.encode_many(samples):
        assert not isinstance(enc, Exception), enc
        spans = [(s.start, s.end, s.placeholder_start, s.num_placeholders) for s in enc.spans]
        out.append((enc.input_ids.tolist(), enc.labels.tolist(), spans))
    return out


@pytest.mark.parametrize("setup", [None, _qwen_like, _trimming])
def test_measure_gives_the_same_samples_with_and_without_offsets(tmp_path, demo_tokenizer, setup):
    """ids, labels and media spans from the fast batch encode equal the offsets path's (which the other
    chat tests check against prefix renders), also where a sample falls back to offsets (not NFC)."""
    path = demo_tokenizer if setup is None else _variant(tmp_path, demo_tokenizer, "v", setup)
    profile = get_profile("qwen2_5_vl")
    fast = ChatTokenizer(path, profile)
    assert (fast._byte_starts is None) == (setup is _trimming)
    plan = profile.plan(MediaMeta("image", width=84, height=56))
    image_sample = [
        {"role": "user", "content": [{"type": "image", "image": "a"}, {"type": "text", "text": "é what?"}]},
        {"role": "assistant", "content": "an image 😀"},
    ]
    samples = [(m, []) for m in CONVERSATIONS] + [(image_sample, [plan])]
    with_offsets = ChatTokenizer(path, profile)
    with_offsets._byte_starts = None
    assert _encoded(fast, samples) == _encoded(with_offsets, samples)


def test_fast_batch_encode_is_what_the_measure_stage_calls(demo_tokenizer, monkeypatch):
    chat = ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))
    calls = []
    encoder = chat._encoder

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(encoder, name)

    monkeypatch.setattr(chat, "_encoder", Spy())
    chat.encode_many([(CONVERSATIONS[0], [])])
    assert calls == ["encode_batch_fast"]
