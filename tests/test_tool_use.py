"""Chat roles people have: ShareGPT's other assistant names, LLaMA-Factory's function_call/observation turns
and tools column (through the chat template's tool support, labels on the assistant's calls and answers),
OpenAI-style tool_calls, and LLaMA-Factory's dataset_info.json."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest

from omnipack.cli import main
from omnipack.dataset.codec import decode_row
from omnipack.dataset.contract import IGNORE_INDEX
from omnipack.dataset.meta import read_omnipack_meta
from omnipack.inputs import InputError, InputSpec
from omnipack.inputs.llama_factory import dataset_info_settings
from omnipack.inputs.read import to_sample_record
from omnipack.manifest import ManifestError, read_manifest, validate_record
from omnipack.profiles import get_profile
from omnipack.text.chat import ChatTokenizer, SampleRejected, template_messages

from .inputs_helpers import write_images
from .tool_template import build_tool_tokenizer

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _glaive(i: int) -> dict:
    """A LLaMA-Factory tool-use record (as in its glaive_toolcall data): the call and the tools as JSON text."""
    return {
        "conversations": [
            {"from": "human", "value": f"<image>What is the weather in city {i}?"},
            {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": f"c{i}"}})},
            {"from": "observation", "value": json.dumps({"temperature": 20 + i})},
            {"from": "gpt", "value": f"It is {20 + i} degrees in city {i}."},
        ],
        "tools": json.dumps([WEATHER]),
        "images": [f"imgs/img{i}.jpg"],
    }


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    return build_tool_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"))


@pytest.fixture(scope="module")
def tool_chat(tool_tokenizer):
    return ChatTokenizer(tool_tokenizer, get_profile("qwen2_5_vl"))


def _record(rec: dict, **spec) -> dict:
    out = to_sample_record(rec, InputSpec(**spec))
    out.setdefault("id", "x")
    validate_record(out)
    return out


def test_sharegpt_assistant_role_names_are_assistant():
    for name in ("chatgpt", "bing", "bard", "gpt"):
        rec = _record({"conversations": [{"from": "human", "value": "hi"}, {"from": name, "value": "hello"}]})
        assert [m["role"] for m in rec["messages"]] == ["user", "assistant"]
    with pytest.raises(ManifestError, match=r"unknown role 'narrator'"):
        _record({"conversations": [{"from": "human", "value": "hi"}, {"from": "narrator", "value": "x"}]})
    # a role named by the user
    rec = _record(
        {"conversations": [{"from": "q", "value": "hi"}, {"from": "a", "value": "hello"}]},
        roles={"q": "user", "a": "assistant"},
    )
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant"]
    with pytest.raises(InputError, match="unknown role in the role mapping q=boss"):
        InputSpec(roles={"q": "boss"})


def test_function_call_and_observation_turns_become_tool_calls_and_results():
    rec = _record(_glaive(3))
    user, call, result, answer = rec["messages"]
    assert user["content"][0] == {"type": "image", "image": "imgs/img3.jpg"}
    assert call == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "c3"}}}],
    }
    assert result == {"role": "tool", "content": '{"temperature": 23}'}
    assert answer == {"role": "assistant", "content": "It is 23 degrees in city 3."}
    # the tools column (JSON text of bare function schemas) wrapped as chat templates take them
    assert rec["tools"] == [{"type": "function", "function": WEATHER}]
    # parallel calls: a list; OpenAI-style calls with JSON-text arguments and a call id
    parallel = _glaive(0)
    parallel["conversations"][1]["value"] = json.dumps(
        [{"name": "get_weather", "arguments": {"city": "a"}}, {"name": "get_weather", "arguments": {"city": "b"}}]
    )
    assert [c["function"]["arguments"] for c in _record(parallel)["messages"][1]["tool_calls"]] == [
        {"city": "a"},
        {"city": "b"},
    ]
    openai = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
            {"role": "assistant", "content": "Cold.", "tool_calls": None},
        ],
        "tools": [{"type": "function", "function": WEATHER}],
    }  # fmt: skip
    msgs = _record(openai)["messages"]
    assert msgs[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}, "id": "call_1"}
    ]
    assert "tool_calls" not in msgs[3] and msgs[2]["tool_call_id"] == "call_1"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{not json", "tool calls of messages/1 is not valid JSON"),
        (json.dumps({"arguments": {}}), "tool call 0 of messages/1 has no function name"),
        (json.dumps({"name": "f", "arguments": [1]}), "arguments of tool call 'f' in messages/1 must be a JSON object"),
        ("", "empty function_call turn at conversations/1"),
        ("[]", "tool calls of messages/1 must be a call object or a non-empty list"),
    ],
)
def test_broken_tool_calls_are_rejected_with_their_reason(value, reason):
    rec = _glaive(0)
    rec["conversations"][1]["value"] = value
    with pytest.raises(ManifestError, match=reason):
        _record(rec)


def test_broken_tools_column_is_rejected():
    rec = _glaive(0)
    rec["tools"] = "[{"
    with pytest.raises(ManifestError, match="tools is not valid JSON"):
        _record(rec)
    rec["tools"] = json.dumps([{"type": "retrieval"}])
    with pytest.raises(ManifestError, match="tools/0 is not a function schema"):
        _record(rec)


def test_labels_cover_exactly_the_assistants_calls_and_answers(tool_chat):
    rec = _record(_glaive(1))
    msgs = [{**m, "content": m["content"] if isinstance(m["content"], str) else "w?"} for m in rec["messages"]]
    enc = tool_chat.encode(msgs, [], tools=rec["tools"])
    tok = tool_chat.tokenizer
    # the tokens are the template's own rendering, tools and calls included (transformers' public path)
    want = tok.apply_chat_template(template_messages(msgs), tools=rec["tools"], tokenize=False)
    assert tok.decode(enc.input_ids) == want
    assert '"name": "get_weather"' in want and "<tool_response>" in want and "The weather in a city" in want
    # supervised: each assistant turn (the call, the answer) through its turn end; never the tool's result
    targets = tok.decode(enc.labels[enc.labels != IGNORE_INDEX])
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "c1"}}\n</tool_call><|im_end|>'
    assert targets == call + "It is 21 degrees in city 1.<|im_end|>"
    # the same labels when spans come from prefix renders (the path of templates without a marked turn start)
    prefix = tool_chat._spans_by_prefixes(template_messages(msgs), want, rec["tools"])
    assert tool_chat.supervised_char_spans(template_messages(msgs), want, rec["tools"]) == prefix
    assert [want[a:b] for a, b in prefix] == [call, "It is 21 degrees in city 1.<|im_end|>"]


def test_direct_render_with_tools_is_apply_chat_template(tool_chat):
    assert tool_chat._compiled is not None and tool_chat._tool_support == (True, True, True)
    msgs = template_messages(_record(_glaive(2))["messages"])
    tools = [{"type": "function", "function": WEATHER}]
    for gen in (False, True):
        assert tool_chat.render(msgs, gen, tools=tools) == tool_chat.tokenizer.apply_chat_template(
            msgs, tools=tools, tokenize=False, add_generation_prompt=gen
        )


def test_template_without_tool_support_rejects_tool_samples(demo_tokenizer):
    chat = ChatTokenizer(demo_tokenizer, get_profile("qwen2_5_vl"))
    assert chat._tool_support == (False, False, True)  # the demo template writes any role's text, no calls
    rec = _record(_glaive(0))
    msgs = [{**m, "content": m["content"] if isinstance(m["content"], str) else "w?"} for m in rec["messages"]]
    with pytest.raises(SampleRejected, match="does not render tools"):
        chat.encode(msgs, [], tools=rec["tools"])
    with pytest.raises(SampleRejected, match="does not render tool calls"):
        chat.encode(msgs, [])


def test_special_tokens_in_tool_calls_and_tools_are_rejected(tool_chat):
    rec = _record(_glaive(0))
    msgs = [{**m, "content": m["content"] if isinstance(m["content"], str) else "w?"} for m in rec["messages"]]
    msgs[1]["tool_calls"][0]["function"]["arguments"] = {"city": "x<|im_end|>"}
    with pytest.raises(SampleRejected, match=r"text of messages/1 contains the special token '<\|im_end\|>'"):
        tool_chat.encode(msgs, [], tools=rec["tools"])
    rec = _record(_glaive(0))
    msgs = [{**m, "content": m["content"] if isinstance(m["content"], str) else "w?"} for m in rec["messages"]]
    tools = [{"type": "function", "function": {**WEATHER, "description": "<|image_pad|>"}}]
    with pytest.raises(SampleRejected, match="text of tools contains the special token"):
        tool_chat.encode(msgs, [], tools=tools)


def test_alpaca_history_and_query_columns():
    rec = _record(
        {"q": "Translate", "extra": "chat", "a": "Katze", "history": [["Hello", "Hallo"]], "system": "Be brief."},
        fields={"prompt": "q", "query": "extra", "response": "a"},
        layout="prompt_response",
    )
    assert rec["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hallo"},
        {"role": "user", "content": "Translate\nchat"},
        {"role": "assistant", "content": "Katze"},
    ]


def _write_info(folder, entries: dict) -> str:
    path = folder / "dataset_info.json"
    path.write_text(json.dumps(entries))
    return str(path)


def test_dataset_info_entries_become_input_settings(tmp_path):
    info = _write_info(
        tmp_path,
        {
            "glaive": {"file_name": "glaive.json", "formatting": "sharegpt",
                       "columns": {"messages": "conversations", "tools": "tools", "images": "images"}},
            "openai": {"file_name": "oa.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
                       "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                "assistant_tag": "assistant", "system_tag": "system"}},
            "alpaca": {"file_name": "a.json", "columns": {"prompt": "q", "response": "a", "history": "h"}},
            "hub": {"hf_hub_url": "org/data"},
            "dpo": {"file_name": "d.json", "ranking": True},
        },
    )  # fmt: skip
    with pytest.raises(InputError, match="has 5 datasets: choose one with --dataset-name"):
        dataset_info_settings(info)
    glaive = dataset_info_settings(info, "glaive")
    assert glaive["manifest"] == [str(tmp_path / "glaive.json")] and glaive["media_root"] == str(tmp_path)
    assert glaive["input_layout"] == "sharegpt"
    assert glaive["input_fields"] == {"conversations": "conversations", "role": "from", "content": "value",
                                      "tools": "tools", "images": "images"}  # fmt: skip
    assert glaive["input_roles"]["function_call"] == "function_call"
    openai = dataset_info_settings(tmp_path, "openai")  # the folder holding dataset_info.json
    assert openai["input_fields"]["conversations"] == "messages" and openai["input_roles"]["user"] == "user"
    alpaca = dataset_info_settings(info, "alpaca")
    assert alpaca["input_layout"] == "prompt_response"
    assert alpaca["input_fields"] == {"prompt": "q", "query": "input", "response": "a", "history": "h"}
    with pytest.raises(InputError, match="loaded from hf_hub_url 'org/data'.*download it"):
        dataset_info_settings(info, "hub")
    with pytest.raises(InputError, match="preference"):
        dataset_info_settings(info, "dpo")
    with pytest.raises(InputError, match="no dataset 'nope'"):
        dataset_info_settings(info, "nope")
    # the OpenAI-tagged records read with the entry's settings
    (tmp_path / "oa.jsonl").write_text(json.dumps({"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}) + "\n")  # fmt: skip
    spec = {k: openai[k] for k in ("input_layout", "input_fields")}
    (sample,) = read_manifest(openai["manifest"], input_layout=spec["input_layout"], input_fields=spec["input_fields"])
    assert sample.error is None and [m["role"] for m in sample.messages] == ["system", "user", "assistant"]


def _rows(root) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """sample id -> (tokens, labels) as the dataset stores them (one sample per row)."""
    out = {}
    for tar_path in sorted((root / "shards").rglob("*.tar")):
        with tarfile.open(tar_path) as tf:
            rows: dict[str, dict[str, bytes]] = {}
            for m in tf.getmembers():
                key, part = m.name.split(".", 1)
                rows.setdefault(key, {})[part] = tf.extractfile(m).read()
        for parts in rows.values():
            row, _ = decode_row(parts)
            (sid,) = row.sample_ids
            n = int(row.cu_seqlens[1])
            out[sid] = (row.tokens[:n], row.labels[:n])
    return out


def test_prepare_a_llama_factory_tool_dataset_from_its_dataset_info(tmp_path, tool_tokenizer):
    """End to end: `omnipack prepare --dataset-info` (no --manifest, no --media-root) on LLaMA-Factory
    ShareGPT records with tool calls, tool results, a tools column, chatgpt turns and images."""
    from transformers import AutoTokenizer

    data = tmp_path / "lf_data"
    write_images(data / "imgs", 4)
    records = [_glaive(i) for i in range(3)]
    records.append({"conversations": [{"from": "human", "value": "<image>Hi"}, {"from": "chatgpt", "value": "Hello."}],
                    "images": ["imgs/img3.jpg"]})  # fmt: skip
    (data / "glaive.json").write_text(json.dumps(records))
    _write_info(data, {
        "other": {"file_name": "missing.json"},
        "glaive": {"file_name": "glaive.json", "formatting": "sharegpt",
                   "columns": {"messages": "conversations", "tools": "tools", "images": "images"}},
    })  # fmt: skip
    out = tmp_path / "ds"
    rc = main(["prepare", "--dataset-info", str(data / "dataset_info.json"), "--dataset-name", "glaive",
               "--tokenizer", str(tool_tokenizer), "-o", str(out), "--seq-length", "1024",
               "--max-samples-per-row", "1", "--no-progress", "--no-shuffle"])  # fmt: skip
    assert rc == 0
    meta = read_omnipack_meta(out)
    assert meta["counts"]["input"] == meta["counts"]["packed"] == 4
    tok = AutoTokenizer.from_pretrained(tool_tokenizer)
    rows = _rows(out)
    for i in range(3):
        tokens, labels = rows[f"glaive.json#{i}"]
        text = tok.decode(tokens)
        assert "<tool_response>\n" + json.dumps({"temperature": 20 + i}) in text  # the result, in context
        assert '"name": "get_weather"' in text.split("<|im_start|>user")[0]  # the tools, in the system turn
        targets = tok.decode(labels[labels != IGNORE_INDEX])
        call = json.dumps({"name": "get_weather", "arguments": {"city": f"c{i}"}})
        assert targets == f"<tool_call>\n{call}\n</tool_call><|im_end|>It is {20 + i} degrees in city {i}.<|im_end|>"
    tokens, labels = rows["glaive.json#3"]
    assert tok.decode(labels[labels != IGNORE_INDEX]) == "Hello.<|im_end|>"


def test_convert_llava_writes_tool_use_as_prepare_reads_it():
    from omnipack.tools.convert import convert_record

    rec = _glaive(5)
    line = convert_record(rec, 0)
    validate_record(line)
    assert line["tools"] == [{"type": "function", "function": WEATHER}]
    assert line["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"city": "c5"}
    assert line["messages"] == _record(rec)["messages"]


def test_cli_dataset_info_settings_under_explicit_flags(tmp_path, demo_tokenizer):
    from omnipack.cli import _prepare_config, build_parser

    _write_info(tmp_path, {"lf": {"file_name": "d.json", "formatting": "sharegpt", "tags": {"user_tag": "q"}}})
    base = ["prepare", "--tokenizer", str(demo_tokenizer), "-o", str(tmp_path / "out")]
    cfg = _prepare_config(build_parser().parse_args([*base, "--dataset-info", str(tmp_path)]))
    assert cfg.manifest == [str(tmp_path / "d.json")] and cfg.media_root == str(tmp_path)
    assert cfg.input_layout == "sharegpt" and cfg.input_roles["q"] == "user"
    assert cfg.input_spec.roles == cfg.input_roles
    explicit = [*base, "--dataset-info", str(tmp_path), "--manifest", "other.json", "--media-root", "m",
                "--input-role", "q=assistant", "--input-field", "images=pics"]  # fmt: skip
    cfg = _prepare_config(build_parser().parse_args(explicit))
    assert cfg.manifest == ["other.json"] and cfg.media_root == "m"
    assert cfg.input_roles["q"] == "assistant" and cfg.input_fields["images"] == "pics"
    assert cfg.input_fields["role"] == "from"  # the entry's mapping, under the flags
    with pytest.raises(ValueError, match="--dataset-name needs --dataset-info"):
        _prepare_config(build_parser().parse_args([*base, "--manifest", "x", "--media-root", "m",
                                                   "--dataset-name", "lf"]))  # fmt: skip
    with pytest.raises(ValueError, match="--input-role expects VALUE=ROLE"):
        _prepare_config(build_parser().parse_args([*explicit, "--input-role", "q"]))
