"""Model folders named by Hugging Face Hub id (``Qwen/Qwen2.5-VL-7B-Instruct``, optionally ``@REVISION``),
found in the local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``) and never downloaded: a run reads the same files on every machine, offline."""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache_dir() -> Path:
    """The Hub cache folder as huggingface_hub finds it, read from the environment now (its own constant is
    fixed when it is first imported)."""
    cache = os.environ.get("HF_HUB_CACHE")
    if cache:
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def is_hub_id(name: str) -> bool:
    """Whether ``name`` (without an ``@revision``) is spelled as a Hub repository id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


class NotCached(ValueError):
    """A Hub id whose files are not in the local cache; the message (to follow "NAME ") says how to fetch
    them."""


def cached_snapshot(hub_id: str) -> Path:
    """The cached snapshot folder of ``hub_id`` (``ORG/NAME`` or ``ORG/NAME@REVISION``): the revision the
    cache's ``refs`` name (``main`` by default), or a commit hash. Raises ``NotCached`` naming the download
    command when it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, _, revision = hub_id.partition("@")
    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo_id, revision=revision or None, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        rev = f" --revision {revision}" if revision else ""
        raise NotCached(
            f"is not a local folder nor in the local Hugging Face cache ({cache}; HF_HOME or HF_HUB_CACHE choose "
            f"another): fetch its tokenizer and config files with `hf download {repo_id}{rev} --include '*.json' "
            "'*.jinja' '*.txt' '*.model'` (`huggingface-cli download` before huggingface_hub 1.0), or give a "
            "local folder"
        ) from None


def resolve_model_dir(name: str | Path) -> Path:
    """``name`` as a local folder: itself when it exists, else the cached snapshot of the Hub id it spells
    (``NotCached`` when that is not cached); ``name`` unchanged when it is neither (callers say why)."""
    path = Path(name).expanduser()
    if path.exists() or not is_hub_id(str(name).partition("@")[0]):
        return path
    return cached_snapshot(str(name))
