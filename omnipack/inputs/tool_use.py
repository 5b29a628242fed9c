"""Tool use in records: an assistant's tool calls and the tools a conversation offers, normalized to the shape
chat templates read (transformers' convention, the OpenAI one): a call is ``{"type": "function", "function":
{"name", "arguments": {...}}}``, a tool is ``{"type": "function", "function": {"name", "description",
"parameters"}}``.

Accepted as written by LLaMA-Factory (a ``function_call`` turn's text is the JSON of ``{"name", "arguments"}``
or a list of them; the ``tools`` column is the JSON of a list of function schemas) and by OpenAI-style
records (``tool_calls`` lists with ``arguments`` as a JSON string)."""

from __future__ import annotations

import json
from typing import Any

from .markers import ConvertError


def _json(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ConvertError(f"{what} is not valid JSON ({e.msg} at character {e.pos}): {value[:80]!r}") from None


def parse_tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """The tool calls of one assistant turn (a JSON string, one call or a list of calls) in template shape."""
    calls = _json(value, f"tool calls of {where}")
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not calls:
        raise ConvertError(f"tool calls of {where} must be a call object or a non-empty list of them")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ConvertError(f"tool call {k} of {where} has no function name: {str(call)[:80]!r}")
        args = _json(fn.get("arguments", {}), f"arguments of tool call {name!r} in {where}")
        if not isinstance(args, dict):
            raise ConvertError(f"arguments of tool call {name!r} in {where} must be a JSON object")
        norm: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
        if isinstance(call.get("id"), str):  # templates that pair results with calls read it
            norm["id"] = call["id"]
        out.append(norm)
    return out


def parse_tools(value: Any) -> list[dict[str, Any]] | None:
    """The tools a record offers (a JSON string, one schema or a list; bare function schemas are wrapped as
    ``{"type": "function", "function": schema}``, as LLaMA-Factory does); None when it offers none."""
    if value is None or value == "" or value == []:
        return None
    tools = _json(value, "tools")
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise ConvertError(f"tools must be a list of function schemas, got {type(tools).__name__}")
    out = []
    for k, tool in enumerate(tools):
        if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            fn = tool["function"]
        elif isinstance(tool, dict) and "type" not in tool:
            fn = tool
            tool = {"type": "function", "function": tool}
        else:
            raise ConvertError(f"tools/{k} is not a function schema: {str(tool)[:80]!r}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ConvertError(f"tools/{k} has no function name")
        out.append(tool)
    return out or None


def normalize_tool_use(out: dict[str, Any]) -> None:
    """The record's tools and its messages' tool calls in the shape chat templates read (in place: ``out`` is
    the layout's new record; a message with calls is copied before it changes)."""
    if "tools" in out:
        tools = parse_tools(out.pop("tools"))
        if tools is not None:
            out["tools"] = tools
    msgs = out.get("messages")
    if not isinstance(msgs, list) or not any(isinstance(m, dict) and "tool_calls" in m for m in msgs):
        return
    out["messages"] = msgs = list(msgs)
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "tool_calls" not in m:
            continue
        calls = m["tool_calls"]
        msgs[i] = {k: v for k, v in m.items() if k != "tool_calls"}
        if calls is not None and calls != []:  # OpenAI exports write null/[] for "no calls"
            msgs[i]["tool_calls"] = parse_tool_calls(calls, f"messages/{i}")
            if msgs[i].get("content") is None:  # and null content beside calls
                msgs[i]["content"] = ""

