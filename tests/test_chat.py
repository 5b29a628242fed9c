"""Chat-template tokenization: exact placeholder expansion and assistant-only labels."""

from __future__ import annotations

import re

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
    with pytest.raises(SampleRejected, match="template wrote 0 media blocks"):
        chat.encode([{"role": "user", "content": "hi"}, messages[1]], [_plan(chat, 64, 64)])


@pytest.mark.parametrize(
    ("messages", "token"),
    [
        (
            [{"role": "user", "content": "look <|image_pad|> here"}, {"role": "assistant", "content": "ok"}],
            "<|image_pad|>",
        ),
        (
            [
                {"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|>"},
                {"role": "assistant", "content": "ok"},
            ],
            "<|vision_start|>",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "text", "text": "a <|im_end|> b"}]},
            ],
            "<|im_end|>",
        ),
        (
            [
                {"role": "system", "content": "<|im_start|>user"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a"},
            ],
            "<|im_start|>",
        ),
    ],
)
def test_special_tokens_typed_into_text_are_rejected(chat, messages, token):
    with pytest.raises(SampleRejected, match=f"contains the special token '{re.escape(token)}'"):
        chat.encode(messages, [])


def test_setup_errors_surface_once_at_start(demo_tokenizer):
    with pytest.raises(ValueError, match="has no mRoPE position ids"):
        ChatTokenizer(demo_tokenizer, get_profile("nemotron_omni"), mrope=True)
    # the qwen2_5_vl demo template writes Qwen blocks, not Nemotron's <image>
    with pytest.raises(ValueError, match="does not write profile nemotron_omni's media blocks"):
        ChatTokenizer(demo_tokenizer, get_profile("nemotron_omni"))


def test_templates_that_rewrite_earlier_turns_still_get_exact_labels(tmp_path, demo_tokenizer):
    """A Qwen3-style template drops reasoning from every assistant turn but the last: prefixes differ."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_tokenizer)
    tok.chat_template = (
        "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n"
        "{%- set c = m['content'] if m['content'] is string else m['content'] | map(attribute='text') | join('') -%}"
        "{%- if m['role'] == 'assistant' and not loop.last -%}{{ c.split('</think>')[-1] | trim }}"
        "{%- else -%}{{ c }}{%- endif -%}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    tok.save_pretrained(tmp_path)
    from omnipack.profiles.qwen_vl import Qwen25VLProfile

    class TextOnly(Qwen25VLProfile):
        template_blocks = {}

    chat = ChatTokenizer(tmp_path, TextOnly())
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>hmm</think>first"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>ok</think>second"},
    ]
    enc = chat.encode(messages, [])
    targets = chat.tokenizer.decode(enc.labels[enc.labels != IGNORE_INDEX])
    assert targets == "first<|im_end|><think>ok</think>second<|im_end|>"


def test_sample_without_supervised_tokens_is_rejected(chat):
    with pytest.raises(SampleRejected, match="no supervised tokens"):
        chat.encode([{"role": "user", "content": "only a question"}], [])


def test_fingerprint_is_stable_and_follows_the_template(chat, demo_tokenizer, tmp_path):
    other = ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))
    assert chat.fingerprint() == other.fingerprint() and len(chat.fingerprint()) == 16
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_tokenizer)
    tok.chat_template = tok.chat_template.replace("You are a helpful assistant.", "Be terse.")
    tok.save_pretrained(tmp_path)
    assert ChatTokenizer(tmp_path, get_profile("qwen2_5_vl")).fingerprint() != chat.fingerprint()
