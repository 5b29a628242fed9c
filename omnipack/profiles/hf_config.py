"""What a profile reads from a Hugging Face checkpoint: its ``preprocessor_config.json`` and the ids of its
placeholder tokens (transformers is imported only where a tokenizer must be loaded)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class HasPlaceholders(Protocol):
    """A planner (``ModelProfile``) or a trainer half (``EncoderInputs``): both name their placeholders."""

    @property
    def placeholder_tokens(self) -> Mapping[str, tuple[str, ...]]: ...


def dataset_placeholder_ids(
    meta: Mapping[str, Any], profile: HasPlaceholders, tokenizer_path: str | None = None
) -> tuple[dict[str, list[int]] | None, str]:
    """A dataset's placeholder token ids per kind and where they came from: recorded in omnipack.json,
    else (or when ``tokenizer_path`` is given) from the tokenizer; None when neither is available."""
    tok = meta.get("tokenizer") or {}
    if tok.get("placeholder_token_ids") and tokenizer_path is None:
        return {k: [int(i) for i in v] for k, v in tok["placeholder_token_ids"].items()}, "omnipack.json"
    path = tokenizer_path or tok.get("path")
    if not path or not Path(path).exists():
        return None, f"not recorded in omnipack.json and no tokenizer at {path!r}"
    from transformers import AutoTokenizer

    return placeholder_token_ids(profile, AutoTokenizer.from_pretrained(path)), f"tokenizer {path}"


def placeholder_token_ids(profile: HasPlaceholders, tokenizer: Any) -> dict[str, list[int]]:
    """{kind: token ids} of ``profile.placeholder_tokens`` under an HF ``tokenizer``."""
    out = {}
    for kind, toks in profile.placeholder_tokens.items():
        ids = [tokenizer.convert_tokens_to_ids(t) for t in toks]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError(f"tokenizer lacks a {kind} placeholder token of {toks}")
        out[kind] = [int(i) for i in ids]
    return out


def read_preprocessor_config(path: str | Path | None) -> dict[str, Any]:
    """A local ``preprocessor_config.json`` (file or model directory), or {}."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        p = p / "preprocessor_config.json"
    if not p.exists():
        return {}
    return json.loads(p.read_text())
