"""A Qwen-style ChatML chat template with tool use (tools in the system turn, ``<tool_call>`` blocks in the
assistant's turn, results as ``<tool_response>`` in a user turn) and Qwen2.5-VL media blocks, written for the
tests after the layout of Qwen's own templates; and a demo tokenizer carrying it."""

from __future__ import annotations

from pathlib import Path

QWEN_TOOLS_TEMPLATE = r"""
{%- macro body(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for item in content -%}
            {%- if item.type == 'image' -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif item.type == 'video' -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif item.type == 'text' -%}
                {{- item.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- body(messages[0].content) -}}
    {%- else -%}
        {{- 'You are a helpful assistant.' -}}
    {%- endif -%}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within ' -}}
    {{- '<tool_call></tool_call> XML tags.<|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + body(messages[0].content) + '<|im_end|>\n' -}}
{%- else -%}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\n' + body(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + body(message.content) -}}
        {%- for call in message.tool_calls or [] -%}
            {%- if call.function is defined -%}
                {%- set call = call.function -%}
            {%- endif -%}
            {%- if not loop.first or message.content -%}
                {{- '\n' -}}
            {%- endif -%}
            {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' + (call.arguments | tojson) + '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + body(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""


def build_tool_tokenizer(out_dir: Path) -> Path:
    """The demo tokenizer (qwen2_5_vl blocks) with the tool-use template, saved to ``out_dir``."""
    from transformers import AutoTokenizer

    from omnipack.demo.tokenizer import build_demo_tokenizer

    build_demo_tokenizer(out_dir)
    tok = AutoTokenizer.from_pretrained(out_dir)
    tok.chat_template = QWEN_TOOLS_TEMPLATE.lstrip("\n")
    tok.save_pretrained(out_dir)
    return out_dir
