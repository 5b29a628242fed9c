"""LLaMA-Factory's ``dataset_info.json``: one entry (``file_name``, ``formatting``, ``columns``, ``tags``) as
the input settings it stands for, so a dataset registered for LLaMA-Factory is read as LLaMA-Factory reads it.

``formatting: alpaca`` is the ``prompt_response`` layout (``prompt``+``query`` columns joined by a newline,
``history`` pairs before them), ``sharegpt`` the ``sharegpt`` layout with the tags' role names (``user_tag``,
``assistant_tag``, ``observation_tag``, ``function_tag``, ``system_tag``) mapped to roles. ``file_name``
resolves against the folder of ``dataset_info.json`` (LLaMA-Factory's ``dataset_dir``), which is also the
default media root (its ``media_dir``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import InputError

# LLaMA-Factory's column names -> omnipack fields, and its defaults (DatasetAttr)
_ALPACA_COLUMNS = {"prompt": "prompt", "query": "query", "response": "response", "history": "history"}
_ALPACA_DEFAULTS = {"prompt": "instruction", "query": "input", "response": "output"}
_SHARED_COLUMNS = {"system": "system", "tools": "tools", "images": "images", "videos": "videos", "audios": "audios"}
_TAG_DEFAULTS = {
    "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
    "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
}  # fmt: skip
_TAG_ROLES = {
    "user_tag": "user", "assistant_tag": "assistant", "observation_tag": "observation",
    "function_tag": "function_call", "system_tag": "system",
}  # fmt: skip
_HUB_SOURCES = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
_PREFERENCE_COLUMNS = ("chosen", "rejected", "kto_tag")


def dataset_info_settings(info_path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The prepare settings (``manifest``, ``media_root``, ``input_layout``, ``input_fields``,
    ``input_roles``) of entry ``name`` of a ``dataset_info.json`` (the only entry when ``name`` is None)."""
    path, name, entry = _dataset_info_entry(info_path, name)
    where = f"dataset {name!r} of {path}"
    hub = [k for k in _HUB_SOURCES if entry.get(k)]
    if hub:
        raise InputError(
            f"{where} is loaded from {hub[0]} {entry[hub[0]]!r}: omnipack reads local files only; download it "
            "and give its folder with --manifest"
        )
    columns = entry.get("columns") or {}
    if entry.get("ranking") or any(columns.get(c) for c in _PREFERENCE_COLUMNS):
        raise InputError(
            f"{where} is a preference (ranking/KTO) dataset: omnipack prepares supervised conversations"
        )
    layout, fields, roles = _layout_fields_roles(entry, columns, where)
    fields.update({ours: columns[col] for col, ours in _SHARED_COLUMNS.items() if columns.get(col)})
    if not entry.get("file_name"):
        raise InputError(f"{where} has no file_name")
    files = entry["file_name"] if isinstance(entry["file_name"], list) else [entry["file_name"]]
    manifest = [str(path.parent / f) for f in files]
    return {
        "manifest": manifest,
        "media_root": str(path.parent),
        "input_layout": layout,
        "input_fields": fields,
        "input_roles": roles,
    }


def _dataset_info_entry(info_path: str | Path, name: str | None) -> tuple[Path, str, dict[str, Any]]:
    """(the ``dataset_info.json`` file, the entry's name, the entry): entry ``name``, or the only one."""
    path = Path(info_path)
    if path.is_dir():
        path = path / "dataset_info.json"
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"dataset info {str(path)!r} not found (--dataset-info)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"dataset info {path} is not JSON: {e}") from None
    if not isinstance(info, dict) or not info or not all(isinstance(v, dict) for v in info.values()):
        raise InputError(f"dataset info {path} must map dataset names to their entries")
    if name is None:
        if len(info) != 1:
            raise InputError(
                f"dataset info {path} has {len(info)} datasets: choose one with --dataset-name "
                f"({', '.join(sorted(info))})"
            )
        name = next(iter(info))
    if name not in info:
        raise InputError(f"dataset info {path} has no dataset {name!r} (it has {', '.join(sorted(info))})")
    return path, name, info[name]


def _layout_fields_roles(
    entry: dict[str, Any], columns: dict[str, Any], where: str
) -> tuple[str, dict[str, str], dict[str, str]]:
    """The input layout, fields and role names that the entry's ``formatting`` (alpaca or sharegpt) stands for."""
    formatting = entry.get("formatting", "alpaca")
    fields: dict[str, str] = {}
    roles: dict[str, str] = {}
    if formatting == "alpaca":
        layout = "prompt_response"
        for col, ours in _ALPACA_COLUMNS.items():
            theirs = columns.get(col, _ALPACA_DEFAULTS.get(col))
            if theirs:
                fields[ours] = theirs
    elif formatting == "sharegpt":
        layout = "sharegpt"
        tags = {**_TAG_DEFAULTS, **(entry.get("tags") or {})}
        fields["conversations"] = columns.get("messages", "conversations")
        fields["role"], fields["content"] = tags["role_tag"], tags["content_tag"]
        roles = {tags[tag]: role for tag, role in _TAG_ROLES.items() if tags.get(tag)}
    else:
        raise InputError(f"{where}: formatting {formatting!r} is not alpaca or sharegpt")
    return layout, fields, roles
