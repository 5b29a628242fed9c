"""What a profile reads from a Hugging Face checkpoint: its ``preprocessor_config.json`` and the ids of its
placeholder tokens (transformers is imported only where a tokenizer must be loaded)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ProcessorSettings:
    """Where one kind of processor settings lives, and the profile option (if any) that names it."""

    section: str  # the section of ``processor_config.json``
    file: str  # the kind's own json file in a model folder
    option: str | None = None  # the profile option naming a settings file or model folder for this kind


# Where transformers (5.x) finds a model folder's processor settings of each kind, in its order: the section of
# ``processor_config.json`` (what ``save_pretrained`` writes since 5.0), else the kind's own file. (A video
# processor without either would fall back to the image file; omnipack keeps the profile's video defaults then.)
PROCESSOR_CONFIG = "processor_config.json"
PROCESSOR_SETTINGS: dict[str, ProcessorSettings] = {
    "image": ProcessorSettings("image_processor", "preprocessor_config.json", "preprocessor_config"),
    "video": ProcessorSettings("video_processor", "video_preprocessor_config.json", "video_preprocessor_config"),
    "audio": ProcessorSettings("feature_extractor", "preprocessor_config.json"),
}
# Profile options that name processor settings (a json file or a model folder) -> the kind each reads there.
PROCESSOR_OPTIONS: dict[str, str] = {s.option: kind for kind, s in PROCESSOR_SETTINGS.items() if s.option}


def processor_config_source(folder: str | Path, kind: str = "image") -> tuple[Path, str | None] | None:
    """Where a model folder keeps its ``kind`` processor settings: (``processor_config.json``, its section),
    (the kind's own json file, None), or None."""
    settings = PROCESSOR_SETTINGS[kind]
    nested = Path(folder) / PROCESSOR_CONFIG
    if nested.is_file() and isinstance(json.loads(nested.read_text()).get(settings.section), dict):
        return nested, settings.section
    own = Path(folder) / settings.file
    return (own, None) if own.is_file() else None


def read_preprocessor_config(path: str | Path | None, kind: str = "image") -> dict[str, Any]:
    """A local preprocessor config: a json file, or a model folder's ``kind`` settings read where transformers
    reads them (``processor_config_source``); {} when there are none."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        found = processor_config_source(p, kind)
        if found is None:
            return {}
        data = json.loads(found[0].read_text())
        return data[found[1]] if found[1] else data
    if not p.exists():
        return {}
    data = json.loads(p.read_text())
    section = PROCESSOR_SETTINGS[kind].section
    if p.name == PROCESSOR_CONFIG and isinstance(data.get(section), dict):
        return data[section]  # transformers 5's file (a folder's, or the run's shipped copy): the kind's section
    return data
