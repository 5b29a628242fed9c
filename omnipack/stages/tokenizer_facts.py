"""What a run takes from its tokenizer outside the measure stage (its fingerprint, pad token and placeholder
ids), recorded under ``stages/`` so that a repack (``--from-stage pack``) with the same tokenizer files,
profile and options does not load the tokenizer at all: loading it imports transformers and torch, which
costs more than the repack itself. The tokenizer loaded for them is offered to the run's workers
(``offer_tokenizer``), so a Ray actor does not load it again."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..profiles.hf_config import placeholder_token_ids
from ..text.chat import ChatTokenizer, load_tokenizer
from .model_files import ShippedModel
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
    key = digest({"tokenizer": files_digest, **profile_key, "transformers": package_version("transformers")})
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
def package_version(name: str) -> str | None:
    """The installed version of the distribution ``name``; None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


TOKENIZER_OFFER = "tokenizer"  # the kind of a worker's offered tokenizer (``WorkerContext.offered``)


def tokenizer_offer_key(shipped: ShippedModel) -> str:
    """What an offered tokenizer stands in for a worker's own load of: the shipped files, with the versions of
    the libraries that load them and unpickle it (a node with other versions, e.g. under a Ray Client driver on
    a laptop, loads its own)."""
    versions = {name: package_version(name) for name in ("transformers", "tokenizers")}
    return digest({"files": shipped.digest, **versions})


def offer_tokenizer(executor: Any, shipped: ShippedModel, tokenizer: Any) -> None:
    """Offer ``executor``'s workers ``tokenizer``, loaded by ``load_tokenizer`` from ``shipped``'s files (or
    from the folder they were copied from just before), for the measurers they make from those files
    (``measure.worker_measurer``): a worker in a fresh process (a Ray actor) then need not load it again,
    importing torch. It may have been set up by a ``ChatTokenizer`` already, which only turns off its
    truncation and padding, as every worker's ``ChatTokenizer`` does."""
    executor.offer(TOKENIZER_OFFER, tokenizer_offer_key(shipped), tokenizer)
