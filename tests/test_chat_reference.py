"""The fast encoding paths equal the one reference path (``omnipack.text.reference``) on varied
conversations: every family's demo tokenizer (every media kind it takes, multi-turn, list and string
contents), tool use, think-stripping and fallback templates; with byte starts and with character offsets;
one sample at a time and batched."""

from __future__ import annotations

import random

import numpy as np
import pytest

from omnipack.profiles import available_profiles, get_profile, profile_class
from omnipack.text.chat import ChatTokenizer, SampleRejected
from omnipack.text.reference import reference_encode

from .chat_cases import conversation
from .test_chat import THINK_STRIPPING
from .tool_template import build_tool_tokenizer

# processor-backed families need a model folder, not a demo tokenizer
FAMILIES = [n for n in available_profiles() if not getattr(profile_class(n), "processor_backed", False)]
SAMPLES = 24


def _assert_same(chat: ChatTokenizer, cases: list, *, tools_ok: bool = True) -> int:
    """Every case encodes as the reference does (both batched and alone); returns how many encoded."""
    batch = chat.encode_many(cases)
    done = 0
    for (messages, plans, tools), fast in zip(cases, batch, strict=True):
        try:
            want = reference_encode(chat.tokenizer, chat.profile, messages, plans, tools, mrope=chat.mrope)
        except SampleRejected:
            assert isinstance(fast, SampleRejected), fast
            continue
        if isinstance(fast, Exception):
            raise fast
        alone = chat.encode(messages, plans, tools=tools)
        for got in (fast, alone):
            assert got.input_ids.tolist() == want.input_ids.tolist()
            assert got.labels.tolist() == want.labels.tolist()
            got_spans = [(s.start, s.end, s.placeholder_start, s.num_placeholders) for s in got.spans]
            assert got_spans == [(s.start, s.end, s.placeholder_start, s.num_placeholders) for s in want.spans]
            assert got.assistant_spans.tolist() == want.assistant_spans.tolist()
            if want.mrope_position_ids is not None:
                assert np.array_equal(got.mrope_position_ids, want.mrope_position_ids)
        done += 1
    return done


@pytest.fixture(scope="module", params=FAMILIES)
def family_chat(request, tmp_path_factory):
    from omnipack.demo.tokenizer import build_demo_tokenizer

    profile = get_profile(request.param)
    tok_dir = build_demo_tokenizer(tmp_path_factory.mktemp(request.param), profile=request.param)
    return ChatTokenizer(tok_dir, profile, mrope=profile.uses_mrope())


@pytest.mark.parametrize("offsets", [False, True], ids=["byte_starts", "offsets"])
def test_family_demo_tokenizer_matches_the_reference(family_chat, offsets, monkeypatch):
    if offsets:
        monkeypatch.setattr(family_chat, "_byte_starts", None)
    elif family_chat._byte_starts is None:
        pytest.skip("this tokenizer has no byte starts path")
    rng = random.Random(hash(family_chat.profile.name) % 1000)
    tools = all(family_chat._tool_support)
    cases = [conversation(family_chat.profile, rng, tools=tools and k % 3 == 0) for k in range(SAMPLES)]
    assert any(p for _, p, _ in cases) and _assert_same(family_chat, cases) >= SAMPLES // 2


@pytest.fixture(scope="module")
def tool_chat(tmp_path_factory):
    return ChatTokenizer(build_tool_tokenizer(tmp_path_factory.mktemp("tools")), get_profile("qwen2_5_vl"))


def test_tool_use_matches_the_reference(tool_chat):
    assert all(tool_chat._tool_support) and tool_chat._turn_prompt_tools
    rng = random.Random(1)
    cases = [conversation(tool_chat.profile, rng, tools=True) for _ in range(SAMPLES)]
    assert any(len(m) > 2 for c in cases for m in c[0])  # some assistant turns call the tool
    assert _assert_same(tool_chat, cases) == SAMPLES


FALLBACK_TEMPLATES = {
    "think_stripping": THINK_STRIPPING,
    "plain_text_prompt": (
        "{%- for m in messages -%}### {{ m['role'] }}:\n{{ m['content'] }}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}### assistant:\n{% endif -%}"
    ),
    "forced_thinking": (
        "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n<think>\n{%- endif -%}"
    ),
}


@pytest.mark.parametrize("name", sorted(FALLBACK_TEMPLATES))
def test_label_fallback_templates_match_the_reference(name, tmp_path, demo_tokenizer):
    from transformers import AutoTokenizer

    from omnipack.profiles.qwen2_5_vl import Qwen25VLProfile

    tok = AutoTokenizer.from_pretrained(demo_tokenizer)
    tok.chat_template = FALLBACK_TEMPLATES[name]
    tok.save_pretrained(tmp_path)

    class TextOnly(Qwen25VLProfile):
        template_blocks = {}

    chat = ChatTokenizer(tmp_path, TextOnly())
    rng = random.Random(2)
    cases = [conversation(chat.profile, rng, tools=False) for _ in range(SAMPLES)]
    cases = [([{**m, "content": _as_text(m["content"])} for m in msgs], p, t) for msgs, p, t in cases]
    assert _assert_same(chat, cases) == SAMPLES


def _as_text(content: object) -> str:
    """String content (the fallback templates print it as it is)."""
    return content if isinstance(content, str) else "".join(p["text"] for p in content)  # type: ignore[union-attr]
