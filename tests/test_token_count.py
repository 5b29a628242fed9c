"""Counting a long text's tokens window by window (``text/token_count``): the count over a prefix is exactly
the whole text's tokens in that prefix, for the common kinds of tokenizer (byte-level BPE with a split
pattern, SentencePiece-style Metaspace, WordPiece with a lowercasing normalizer), with added tokens in the
text, and tokenizers that prefix a text's first word (a prefix space, a Metaspace "first" prepend) where a
window starts; and the chat tokenizer rejects a text over the row length without handing it to the tokenizer whole,
while a long text that fits keeps its exact ids and labels."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from omnipack.profiles import get_profile
from omnipack.text import chat as chat_module
from omnipack.text.chat import ChatTokenizer, SampleRejected
from omnipack.text.token_count import WINDOW_CHARS, count_tokens_over

README = (Path(__file__).parents[1] / "README.md").read_text()
ADDED = "<|im_start|>"
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _train(model, trainer, pre, normalizer=None) -> Tokenizer:
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.train_from_iterator([README[:40_000]], trainer)
    tok.add_special_tokens([ADDED])
    return tok


def _tokenizers(demo_tokenizer: Path) -> dict[str, Tokenizer]:
    return {
        "demo byte-level BPE": Tokenizer.from_file(str(demo_tokenizer / "tokenizer.json")),
        "split pattern + byte-level BPE, NFC": _train(
            models.BPE(),
            trainers.BpeTrainer(vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(QWEN_PATTERN), "isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            ),
            normalizers.NFC(),
        ),
        "Metaspace unigram": _train(
            models.Unigram(), trainers.UnigramTrainer(vocab_size=500, unk_token="<unk>", special_tokens=["<unk>"]), pre_tokenizers.Metaspace()
        ),
        "Metaspace 'first' unigram": _train(
            models.Unigram(),
            trainers.UnigramTrainer(vocab_size=500, unk_token="<unk>", special_tokens=["<unk>"]),
            pre_tokenizers.Metaspace(prepend_scheme="first"),
        ),
        "byte-level BPE with a prefix space": _train(
            models.BPE(),
            trainers.BpeTrainer(vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
            pre_tokenizers.ByteLevel(add_prefix_space=True),
        ),
        "lowercased WordPiece": _train(
            models.WordPiece(unk_token="[UNK]"),
            trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[UNK]"]),
            pre_tokenizers.Whitespace(),
            normalizers.Lowercase(),
        ),
    }


TEXT = README[40_000:].replace("\n\n", f"\n{ADDED}user\n") + " caf\u00e9 \u4e2d\u6587 \U0001f600 end"


@pytest.mark.parametrize("window,margin", [(300, 40), (1000, 64), (4096, 1024)])
def test_windowed_count_is_the_whole_texts_count(demo_tokenizer, window, margin):
    for name, tok in _tokenizers(demo_tokenizer).items():
        encode = partial(tok.encode, add_special_tokens=False)
        whole = encode(TEXT)
        n = len(whole.ids)
        ends = np.array([b for _, b in whole.offsets])
        assert count_tokens_over(encode, TEXT, n - 1, window, margin) == (n, len(TEXT)), name
        assert count_tokens_over(encode, TEXT, n, window, margin) is None, name  # exactly n: fits
        for limit in (0, n // 7, n // 3, n // 2, 2 * n // 3, n - 50):
            over = count_tokens_over(encode, TEXT, limit, window, margin)
            assert over is not None, name
            counted, chars = over
            assert counted > limit, name
            # exactly the whole text's tokens that end within the counted characters: never more
            assert counted == int((ends <= chars).sum()), (name, limit)


def test_a_word_longer_than_the_window_stops_the_count(demo_tokenizer):
    tok = Tokenizer.from_file(str(demo_tokenizer / "tokenizer.json"))
    encode = partial(tok.encode, add_special_tokens=False)
    assert count_tokens_over(encode, "a" * 5000, 10, window=1000, margin=100) is None  # undecided, not wrong


@pytest.fixture(scope="module")
def chat(demo_tokenizer):
    return ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))


def test_a_long_text_over_the_row_is_rejected_without_tokenizing_it_whole(chat, monkeypatch):
    text = "Describe the picture in detail, 0 1 2 3. " * 40_000  # 1.6 M characters, ~0.9 M tokens
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    assert len(text) // chat.max_chars_per_token < 100_000  # the character bound alone lets it through
    seen: list[int] = []
    encode = chat._encoder.encode
    monkeypatch.setattr(chat, "_tokenize", lambda t: seen.append(len(t)) or encode(t, add_special_tokens=False))
    monkeypatch.setattr(chat, "_tokenize_many", lambda texts: texts and pytest.fail("tokenized whole"))
    with pytest.raises(SampleRejected, match=r"over-length: .* over seq_length 100000; rejected before tokenizing"):
        chat.encode(messages, [], 100_000)
    assert seen and max(seen) <= WINDOW_CHARS
    assert sum(seen) < 400_000  # stopped once over the row: a fraction of the text


def test_a_long_text_that_fits_keeps_its_ids_and_labels(chat, monkeypatch):
    text = "The quick brown fox jumps over the lazy dog. " * 8_000  # 360 k characters
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]
    plain = chat.encode(messages, [])
    counted: list[int] = []
    count = chat_module.count_tokens_over
    monkeypatch.setattr(chat_module, "count_tokens_over", lambda *a, **k: counted.append(1) or count(*a, **k))
    fitted = chat.encode(messages, [], plain.num_tokens)
    assert counted  # the windowed count ran, and let it through
    np.testing.assert_array_equal(fitted.input_ids, plain.input_ids)
    np.testing.assert_array_equal(fitted.labels, plain.labels)
    with pytest.raises(SampleRejected, match="counted over its first"):
        chat.encode(messages, [], plain.num_tokens - 1)
