"""Chat-template tokenization: exact placeholder expansion and assistant-only labels."""

from __future__ import annotations

import numpy as np
import pytest

from omnipack.contract import IGNORE_INDEX
from omnipack.profiles import MediaMeta, get_profile
from omnipack.text.chat import ChatTokenizer, SampleRejected


@pytest.fixture(scope="module")
def chat(demo_tokenizer):
    return ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))


def _plan(chat, h, w):
    return chat.profile.plan(MediaMeta("image", width=w, height=h))


def test_labels_cover_exactly_assistant_turns_including_turn_end(chat):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "second answer"}]},
    ]
    enc = chat.encode(messages, [])
    tok = chat.tokenizer
    targets = enc.labels[enc.labels != IGNORE_INDEX]
    assert tok.decode(targets) == "first answer<|im_end|>second answer<|im_end|>"
    # label p is token p+1; the last token never predicts anything
    sup = np.flatnonzero(enc.labels != IGNORE_INDEX)
    assert np.array_equal(enc.labels[sup], enc.input_ids[sup + 1])
    assert enc.labels[-1] == IGNORE_INDEX
    # the generation prompt "<|im_start|>assistant\n" is never a target
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert im_start not in targets.tolist()


def test_image_block_expands_to_exact_count_and_is_never_supervised(chat):
    plans = [_plan(chat, 480, 640), _plan(chat, 20, 30)]
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    expected = [
        (lambda hw: hw[0] * hw[1] // 28**2)(smart_resize(h, w, 28, 3136, 12845056))
        for h, w in ((480, 640), (20, 30))
    ]
    assert [p.num_tokens for p in plans] == expected
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": "a"},
                {"type": "text", "text": "and"},
                {"type": "image", "image": "b"},
            ],
        },
        {"role": "assistant", "content": "two pictures"},
    ]
    enc = chat.encode(messages, plans)
    pad = chat.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((enc.input_ids == pad).sum()) == sum(expected)
    for span, plan in zip(enc.spans, plans, strict=True):
        block = enc.input_ids[span.placeholder_start : span.placeholder_start + span.num_placeholders]
        assert span.num_placeholders == plan.num_tokens and (block == pad).all()
        assert enc.input_ids[span.start] == chat.tokenizer.convert_tokens_to_ids("<|vision_start|>")
        assert enc.input_ids[span.end - 1] == chat.tokenizer.convert_tokens_to_ids("<|vision_end|>")
        assert (enc.labels[span.start - 1 : span.end] == IGNORE_INDEX).all()


def test_media_count_mismatch_is_rejected(chat):
    messages = [
        {"role": "user", "content": [{"type": "image", "image": "a"}, {"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "ok"},
    ]
    with pytest.raises(SampleRejected, match="references 2 media items"):
        chat.encode(messages, [_plan(chat, 64, 64)] * 2)
    # a literal placeholder typed into the text is an extra block the sample does not reference
    injected = [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>"}, messages[1]]
    with pytest.raises(SampleRejected, match="more media blocks"):
        chat.encode(injected, [])


def test_sample_without_supervised_tokens_is_rejected(chat):
    with pytest.raises(SampleRejected, match="no supervised tokens"):
        chat.encode([{"role": "user", "content": "only a question"}], [])


def test_fingerprint_is_stable(chat, demo_tokenizer):
    other = ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))
    assert chat.fingerprint() == other.fingerprint() and len(chat.fingerprint()) == 16
