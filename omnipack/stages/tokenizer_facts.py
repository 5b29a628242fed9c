"""What a run takes from its tokenizer outside the measure stage (its fingerprint, pad token and placeholder
ids), recorded under ``stages/`` so that a repack (``--from-stage pack``) with the same tokenizer files,
profile and options does not load the tokenizer at all: loading it imports transformers and torch, which
costs more than the repack itself."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..profiles.hf_config import placeholder_token_ids
from ..text.chat import ChatTokenizer, load_tokenizer
from .records import digest, read_record, write_json_atomic

FACTS_FILE = "tokenizer_facts.json"


@dataclass(frozen=True)
class TokenizerFacts:
    fingerprint: str  # ``ChatTokenizer.fingerprint``: part of the measure key
    pad_token_id: int | None  # the pad token, else the end-of-sequence token
    placeholder_token_ids: dict[str, list[int]]  # {kind: ids} of the profile's placeholders


def tokenizer_facts(
    folder: Path,
    files_digest: str,
    profile: Any,
    profile_key: dict[str, Any],
    stages: Any,
    *,
    reuse: bool,
    on_load: Callable[[Any], None] | None = None,
) -> TokenizerFacts:
    """The facts of the tokenizer in ``folder`` (whose shipped files have ``files_digest``) under ``profile``:
    with ``reuse``, those an earlier run recorded for the same files, profile, options and transformers
    version; else read from the loaded tokenizer (and recorded). ``on_load`` is called with the tokenizer
    as loaded (``load_tokenizer``), when it is."""
    key = digest({"tokenizer": files_digest, **profile_key, "transformers": _transformers_version()})
    path = stages / FACTS_FILE
    if reuse and (record := read_record(path, key)) is not None:
        return TokenizerFacts(record["fingerprint"], record["pad_token_id"], record["placeholder_token_ids"])
    loaded = load_tokenizer(folder)
    if on_load is not None:
        on_load(loaded)
    chat = ChatTokenizer(folder, profile, tokenizer=loaded)
    pad = chat.tokenizer.pad_token_id
    facts = TokenizerFacts(
        chat.fingerprint(),
        pad if pad is not None else chat.tokenizer.eos_token_id,
        placeholder_token_ids(profile, chat.tokenizer),
    )
    write_json_atomic(path, {"key": key, **asdict(facts)})
    return facts


@functools.cache  # a metadata lookup: ~10 ms
def _transformers_version() -> str | None:
    try:
        return version("transformers")
    except PackageNotFoundError:
        return None
