"""Varied conversations for a profile's demo tokenizer: multi-turn text, every media kind the profile takes,
tool use where the template writes it, list and string contents. Shared by the chat reference test and
``benchmarks/bench_chat.py``."""

from __future__ import annotations

import random
from typing import Any

from omnipack.profiles.base import MediaMeta, MediaPlan, ModelProfile

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
_WORDS = ["the", "a", "cat", "sat", "on", "mat", "é", "中文", "😀", "\n\n", "", "tab\t", "value", "12345", "3.14",
          "why?", "yes!", "no.", ""]  # fmt: skip


def media_meta(kind: str, rng: random.Random) -> MediaMeta:
    """A probed-looking item of ``kind`` (no file: plans need only these facts)."""
    if kind == "image":
        return MediaMeta("image", width=rng.randrange(28, 900), height=rng.randrange(28, 700))
    if kind == "video":
        return MediaMeta("video", width=128, height=96, num_frames=rng.randrange(32, 80), fps=16.0)
    return MediaMeta("audio", num_samples=rng.randrange(8000, 48000), sample_rate=16000)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).strip() or "x"


def conversation(
    profile: ModelProfile, rng: random.Random, *, tools: bool, words: int = 12
) -> tuple[list[dict[str, Any]], list[MediaPlan], list[dict[str, Any]] | None]:
    """(messages, plans, tools) of one random conversation."""
    messages: list[dict[str, Any]] = []
    plans: list[MediaPlan] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": _text(rng, 5)})
    for turn in range(rng.randrange(1, 4)):
        items = [
            ({"type": kind, kind: f"{kind}{n}"}, profile.plan(media_meta(kind, rng)))
            for kind in profile.kinds
            for n in range(rng.randrange(0, 2 if turn else 3))
        ]
        rng.shuffle(items)  # media items in any order; plans in conversation order
        content: list[dict[str, Any]] = [item for item, _ in items]
        plans += [plan for _, plan in items]
        content.insert(rng.randrange(len(content) + 1), {"type": "text", "text": _text(rng, words)})
        user: Any = content if len(content) > 1 or rng.random() < 0.5 else content[0]["text"]
        messages.append({"role": "user", "content": user})
        if tools and rng.random() < 0.5:
            call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": _text(rng, 1)}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": '{"temperature": 23}'})
        answer = _text(rng, words)
        if rng.random() < 0.3:
            answer = f"<think>{_text(rng, 4)}</think>{answer}"
        messages.append(
            {"role": "assistant", "content": answer if rng.random() < 0.5 else [{"type": "text", "text": answer}]}
        )
    return messages, plans, ([WEATHER_TOOL] if tools else None)
