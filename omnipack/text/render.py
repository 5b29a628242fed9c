"""Rendering a conversation with the tokenizer's own chat template: the messages a template is given, the
tool-use probe, and a direct path to transformers' compiled template that skips its per-call copying."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TOOL_KEYS = ("tool_calls", "name", "tool_call_id")  # message keys templates read for tool use


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: media items keep only their type (no paths leak); an
    assistant's tool calls and a tool result's name/call id pass through."""
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            content = [
                {"type": "text", "text": part["text"]} if part["type"] == "text" else {"type": part["type"]}
                for part in content
            ]
        msg = {"role": m["role"], "content": content}
        if len(m) > 2:
            msg.update((k, m[k]) for k in TOOL_KEYS if m.get(k) is not None)
        out.append(msg)
    return out


def uses_tools(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> tuple[bool, bool, bool]:
    """Whether a conversation offers tools, calls tools, and holds tool results."""
    return (
        bool(tools),
        any(m.get("tool_calls") for m in messages),
        any(m["role"] == "tool" for m in messages),
    )


def is_plain(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> bool:
    """Whether a conversation has no tool use at all (no tools offered, no tool keys, no tool role)."""
    return tools is None and not any(len(m) > 2 or m["role"] == "tool" for m in messages)


# A conversation with one tool offered, called and answered, with names a template can only write if it
# renders each of them.
TOOL_PROBE_TOOLS = [
    {"type": "function", "function": {"name": "omnipack_probe_tool", "description": "d",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
TOOL_PROBE = [
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "omnipack_probe_call",
                                                      "arguments": {"omnipack_probe_arg": 1}}}]},
    {"role": "tool", "content": "omnipack_probe_result"},
    {"role": "assistant", "content": "a"},
]  # fmt: skip


def memoized_sandbox(template: Any, source: str) -> Any:
    """``template`` (compiled from ``source``) compiled again in a copy of its sandbox whose attribute check is memoized per (object type,
    attribute, value type): jinja's check reads nothing else (underscore names, internal attributes of
    functions/frames/generators, methods that mutate known mutable types), and it ran for every
    ``loop.first`` of every message. The template stays sandboxed; transformers' own cached environment is
    not touched."""
    env = template.environment.overlay()
    check = env.is_safe_attribute
    memo: dict[tuple[type, str, type], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr, type(value))
        safe = memo.get(key)
        if safe is None:
            safe = memo[key] = bool(check(obj, attr, value))
        return safe

    env.is_safe_attribute = is_safe_attribute
    return env.from_string(source)


class TemplateRenderer:
    """The tokenizer's chat template, rendered directly where that is provably what ``apply_chat_template``
    gives (on probe conversations, with the profile's media ``kinds``), else through it."""

    def __init__(self, tokenizer: Any, kinds: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.compiled, self.variables = None, None
        compiled, variables = self._direct_template()
        if compiled is not None and self._direct_matches(compiled, variables, kinds):
            self.compiled, self.variables = compiled, variables

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The chat template's text for ``messages`` (plain dicts, see ``template_messages``) offering
        ``tools`` (function schemas)."""
        # A tokenizer with several named templates may pick another one when tools are given.
        if self.compiled is not None and (tools is None or not isinstance(self.tokenizer.chat_template, dict)):
            return self.compiled.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.variables,
            )
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _direct_template(self) -> tuple[Any, dict[str, Any]] | tuple[None, None]:
        """transformers' compiled template and the variables ``apply_chat_template`` gives it, to render
        plain messages without its per-call copying (a third of a sample's non-tokenizer time)."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data

            source = self.tokenizer.get_chat_template()
            compiled = memoized_sandbox(_compile_jinja_template(source), source)
            variables = _plain_template_data(dict(self.tokenizer.special_tokens_map))
        except Exception:  # another transformers version: its public path is always right
            return None, None
        return compiled, variables

    def _direct_matches(self, compiled: Any, variables: dict[str, Any], kinds: Sequence[str]) -> bool:
        """Whether the direct render is ``apply_chat_template``'s on probe conversations (and tool use, where
        the template takes it and ``render`` uses the direct path for it)."""
        probes = [
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            [
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": k} for k in kinds] + [{"type": "text", "text": "t"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
                {"role": "user", "content": "r"},
            ],
        ]
        cases: list[tuple[list[dict[str, Any]], Any]] = [(p, None) for p in probes]
        try:
            if not isinstance(self.tokenizer.chat_template, dict):
                self.tokenizer.apply_chat_template(TOOL_PROBE, tools=TOOL_PROBE_TOOLS, tokenize=False)
                cases.append((TOOL_PROBE, TOOL_PROBE_TOOLS))
        except Exception:
            pass
        for probe, tools in cases:
            for gen in (False, True):
                try:
                    direct = compiled.render(
                        messages=probe, tools=tools, documents=None, add_generation_prompt=gen, **variables
                    )
                except Exception:
                    return False
                if direct != self.tokenizer.apply_chat_template(
                    probe, tools=tools, tokenize=False, add_generation_prompt=gen
                ):
                    return False
        return True
