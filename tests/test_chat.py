"""Chat-template tokenization: exact placeholder expansion and assistant-only labels."""

from __future__ import annotations

import re

import numpy as np
import pytest

from omnipack.dataset.contract import IGNORE_INDEX
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
    from omnipack.profiles.qwen2_5_vl import Qwen25VLProfile

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


def _labels_by_prefix_renders(chat, messages):
    """The reference: spans from rendering every prefix, tokens selected by their start offsets."""
    from omnipack.text.chat import template_messages

    msgs = template_messages(messages)
    full = chat.render(msgs)
    spans = chat._spans_by_prefixes(msgs, full)
    enc = chat.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"])
    starts = np.asarray([o[0] for o in enc["offset_mapping"]])
    mask = np.zeros(len(ids), dtype=bool)
    for a, b in spans:
        mask |= (starts >= a) & (starts < b)
    labels = np.full(len(ids), IGNORE_INDEX)
    labels[:-1] = np.where(mask[1:], ids[1:], IGNORE_INDEX)
    return ids, labels


CONVERSATIONS = [
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    [
        {"role": "system", "content": "Sys tem."},
        {"role": "user", "content": "é😀中文 question"},
        {"role": "assistant", "content": "😀 starts with an emoji, ends with one 🎉"},
        {"role": "user", "content": [{"type": "text", "text": "  spaced  "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "\n\n  leading newlines"}]},
        {"role": "user", "content": "e\u0301 combining"},
        {"role": "assistant", "content": "中文答案。"},
    ],
    [{"role": "user", "content": "x" * 300}, {"role": "assistant", "content": "y " * 200}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_one_render_gives_the_labels_of_prefix_renders(chat, monkeypatch, messages):
    assert chat._turn_prompt == "<|im_start|>assistant\n"
    renders = []
    original = ChatTokenizer.render
    monkeypatch.setattr(
        ChatTokenizer, "render", lambda self, *a, **k: renders.append(1) or original(self, *a, **k)
    )
    enc = chat.encode(messages, [])
    assert len(renders) == 1  # the template is rendered once per sample
    monkeypatch.undo()
    ids, labels = _labels_by_prefix_renders(chat, messages)
    assert np.array_equal(enc.input_ids, ids) and np.array_equal(enc.labels, labels)


def _chat_with_template(tmp_path, demo_tokenizer, template):
    from transformers import AutoTokenizer

    from omnipack.profiles.qwen2_5_vl import Qwen25VLProfile

    tok = AutoTokenizer.from_pretrained(demo_tokenizer)
    tok.chat_template = template
    tok.save_pretrained(tmp_path)

    class TextOnly(Qwen25VLProfile):
        template_blocks = {}

    return ChatTokenizer(tmp_path, TextOnly())


THINK_STRIPPING = (
    "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n"
    "{%- set c = m['content'] if m['content'] is string else m['content'] | map(attribute='text') | join('') -%}"
    "{%- if m['role'] == 'assistant' and not loop.last -%}{{ c.split('</think>')[-1] | trim }}"
    "{%- else -%}{{ c }}{%- endif -%}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def test_think_stripping_template_is_exact_from_one_render(tmp_path, demo_tokenizer, monkeypatch):
    chat = _chat_with_template(tmp_path, demo_tokenizer, THINK_STRIPPING)
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>a</think>  first"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>b</think>second"},
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": "<think>c</think>third"},
    ]
    calls = []
    original = ChatTokenizer.render
    monkeypatch.setattr(
        ChatTokenizer, "render", lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    )
    enc = chat.encode(messages, [])
    assert len(calls) == 1
    targets = chat.tokenizer.decode(enc.labels[enc.labels != IGNORE_INDEX])
    assert targets == "first<|im_end|>second<|im_end|><think>c</think>third<|im_end|>"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # the generation prompt is plain text, which a sample could type: prefixes are rendered instead
        (
            "{%- for m in messages -%}### {{ m['role'] }}:\n{{ m['content'] }}<|im_end|>\n{%- endfor -%}"
            "{%- if add_generation_prompt -%}### assistant:\n{% endif -%}",
            "first<|im_end|>second<|im_end|>",
        ),
        # forced thinking: the generation prompt opens a <think> block earlier turns never show
        (
            "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_start|>assistant\n<think>\n{%- endif -%}",
            "first<|im_end|>second<|im_end|>",
        ),
    ],
)
def test_templates_without_a_usable_turn_prompt_fall_back_exactly(
    tmp_path, demo_tokenizer, template, expected
):
    chat = _chat_with_template(tmp_path, demo_tokenizer, template)
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "second"},
    ]
    assert chat._turn_prompt is None
    enc = chat.encode(messages, [])
    assert chat.tokenizer.decode(enc.labels[enc.labels != IGNORE_INDEX]) == expected
    ids, labels = _labels_by_prefix_renders(chat, messages)
    assert np.array_equal(enc.input_ids, ids) and np.array_equal(enc.labels, labels)


def test_sample_that_cannot_fit_is_rejected_before_tokenizing(chat, monkeypatch):
    import time

    tokenized = []
    original = ChatTokenizer._tokenize_many
    monkeypatch.setattr(
        ChatTokenizer,
        "_tokenize_many",
        lambda self, texts: tokenized.extend(map(len, texts)) or original(self, texts),
    )
    huge = "word " * 1_000_000  # 5 MB of text
    t0 = time.perf_counter()
    with pytest.raises(
        SampleRejected, match="over-length: .* over seq_length 4096; rejected before tokenizing"
    ):
        chat.encode([{"role": "user", "content": huge}, {"role": "assistant", "content": "ok"}], [], 4096)
    assert time.perf_counter() - t0 < 5
    assert tokenized == []


def test_early_length_bound_never_rejects_a_sample_that_fits(chat):
    """The worst case for the bound: text made of the vocabulary's longest tokens."""
    vocab = chat.tokenizer.get_vocab()
    added = {t.content for t in chat.tokenizer.added_tokens_decoder.values()}
    longest = max(
        (t for t in vocab if t not in added), key=lambda t: len(chat.tokenizer.convert_tokens_to_string([t]))
    )
    word = chat.tokenizer.convert_tokens_to_string([longest])
    for k in (1, 50, 400):
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": word * k}]
        n = chat.encode(messages, []).num_tokens
        assert chat.encode(messages, [], n).num_tokens == n  # exactly full: not rejected
        with pytest.raises(SampleRejected):
            chat.encode(messages, [], n // chat.max_chars_per_token - 1)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_direct_render_is_apply_chat_template(chat, messages):
    from omnipack.text.chat import template_messages

    assert chat._compiled is not None
    msgs = template_messages(messages)
    for gen in (False, True):
        assert chat.render(msgs, gen) == chat.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen
        )


def test_batches_are_split_by_characters_and_keep_order(chat, monkeypatch):
    import omnipack.text.chat as chat_module

    monkeypatch.setattr(chat_module, "TOKENIZE_BATCH_CHARS", 100)
    calls = []
    encode_batch = chat._encoder.encode_batch_fast  # the byte-level demo tokenizer needs no offsets
    monkeypatch.setattr(
        chat,
        "_encoder",
        type(
            "Spy",
            (),
            {
                "encode_batch_fast": lambda self, texts, **k: (
                    calls.append(sum(map(len, texts))) or encode_batch(texts, **k)
                ),
            },
        )(),
    )
    texts = ["a" * 60, "b" * 30, "c" * 30, "d" * 300, "e"]
    encs = chat._tokenize_many(texts)
    assert calls == [90, 30, 300, 1]
    assert [chat.tokenizer.decode(e.ids) for e in encs] == texts


def test_reserved_token_prefilter_matches_the_full_scan(chat):
    """The one-scan prefilter (texts joined by a character no reserved token holds) finds exactly what
    scanning every text for every reserved token finds: the same message, the same (longest) token,
    nothing across two texts, and texts that hold the first character but no token pass."""
    assert chat._text_joint is not None and all(chat._text_joint not in t for t in chat._reserved)

    def full_scan(messages):
        for i, m in enumerate(messages):
            c = m["content"]
            for text in [c] if isinstance(c, str) else [p["text"] for p in c if p["type"] == "text"]:
                hit = next((t for t in chat._reserved if t in text), None)
                if hit is not None:
                    return f"text of messages/{i} contains the special token {hit!r}"
        return None

    cases = [
        [{"role": "user", "content": "a < b and x <| y"}, {"role": "assistant", "content": "<i>ok</i>"}],
        [{"role": "user", "content": "ends with <|im_"}, {"role": "assistant", "content": "end|> starts"}],
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "<|vision_"}, {"type": "text", "text": "end|>"}],
            }
        ],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x <|image_pad|> y <|im_end|>"}],
        [
            {"role": "system", "content": "fine"},
            {"role": "user", "content": [{"type": "image"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a</img>"}]},
        ],
    ]
    for messages in cases:
        expected = full_scan(messages)
        try:
            chat._check_text(messages)
            got = None
        except SampleRejected as e:
            got = str(e)
        assert got == expected, messages
    assert [full_scan(m) is None for m in cases] == [True, True, True, False, False]


def test_text_only_and_media_samples_keep_their_ids_labels_and_spans(chat):
    """The text-only path (no re-assembly) and the media path give the ids the tokenizer gives, as int32."""
    text_only = [
        {"role": "user", "content": "plain question"},
        {"role": "assistant", "content": "plain answer"},
    ]
    enc = chat.encode(text_only, [])
    rendered = chat.render(text_only)
    assert enc.input_ids.dtype == np.int32 and enc.labels.dtype == np.int32
    assert enc.input_ids.tolist() == chat.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    plan = _plan(chat, 56, 84)
    with_image = [
        {
            "role": "user",
            "content": [{"type": "image", "image": "a"}, {"type": "text", "text": "plain question"}],
        },
        {"role": "assistant", "content": "plain answer"},
    ]
    enc2 = chat.encode(with_image, [plan])
    assert enc2.input_ids.dtype == np.int32 and enc2.labels.dtype == np.int32
    (span,) = enc2.spans
    assert span.num_placeholders == plan.num_tokens
    # outside the expanded block the ids are the text-only conversation's, with the same labels
    tail = enc2.input_ids[span.end :]
    assert tail.tolist() == enc.input_ids[-len(tail) :].tolist()
    assert enc2.labels[span.end : -1].tolist() == enc.labels[-len(tail) : -1].tolist()


def test_the_direct_render_stays_sandboxed_with_its_attribute_check_memoized(chat):
    """The direct render's environment is a copy of transformers' sandbox (its cached one untouched) whose
    attribute check is memoized: unsafe attributes and mutating methods stay refused on every call."""
    from jinja2.exceptions import SecurityError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from omnipack.text.render import memoized_sandbox as _memoized_sandbox

    assert chat._compiled.environment is not _compile_jinja_template(chat.tokenizer.get_chat_template()).environment
    source = "{% for m in messages %}{{ loop.first }}{{ m['content'].upper() }}{% endfor %}"
    template = _memoized_sandbox(_compile_jinja_template(source), source)
    for _ in range(2):  # the second call answers from the memo
        assert template.render(messages=[{"content": "a"}, {"content": "b"}]) == "TrueAFalseB"
    for unsafe in ("{{ x.__class__.__mro__ }}", "{{ x.append(1) }}", "{{ f.__globals__.keys() }}"):
        bad = _memoized_sandbox(_compile_jinja_template(unsafe), unsafe)
        for _ in range(2):
            with pytest.raises(SecurityError):
                bad.render(x=[1], f=_plan)
