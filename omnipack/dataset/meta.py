"""Energon's ``.nv-meta`` files for an omnipack dataset, plus omnipack's own metadata file.

Energon rejects unknown keys in ``.info.json``, so omnipack's metadata lives in ``.nv-meta/omnipack.json``.
``dataset.yaml`` declares a CrudeWebdataset (rows are cooked by omnipack's cooker in the task encoder);
``dataset_typed.yaml`` maps the fixed parts onto a typed sample so stock ``energon info|lint|preview``
work with ``--dataset-config dataset_typed.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from .contract import BOUNDARY_PARTS, META_PART, TOKEN_PARTS, part_name
from .shards import ShardInfo

NV_META = ".nv-meta"
OMNIPACK_META = "omnipack.json"
TYPED_CONFIG = "dataset_typed.yaml"


def _energon_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("megatron-energon")
    except Exception:
        return None


def write_energon_meta(
    root: Path, shards: list[ShardInfo], val_shards: list[ShardInfo] | None = None
) -> None:
    meta = root / NV_META
    meta.mkdir(parents=True, exist_ok=True)
    val_shards = val_shards or []
    info: dict[str, Any] = {"shard_counts": {s.path: s.count for s in shards + val_shards}}
    if (v := _energon_version()) is not None:
        info = {"energon_version": v, **info}
    (meta / ".info.json").write_text(json.dumps(info, indent=2) + "\n")
    split = {
        "split_parts": {
            part: [s.path for s in shards if s.split == part] for part in ("train", "val", "test")
        },
        "exclude": [],
    }
    (meta / "split.yaml").write_text(yaml.safe_dump(split, sort_keys=False))
    (meta / "dataset.yaml").write_text("__module__: megatron.energon\n__class__: CrudeWebdataset\n")
    field_map = {name: part_name(name) for name in TOKEN_PARTS + BOUNDARY_PARTS}
    field_map["meta"] = META_PART
    typed = {
        "sample_type": {"__module__": "omnipack.loader.sample", "__class__": "PackedRowSample"},
        "field_map": field_map,
    }
    (meta / TYPED_CONFIG).write_text(yaml.safe_dump(typed, sort_keys=False))


def write_omnipack_meta(root: Path, metadata: dict[str, Any]) -> None:
    path = root / NV_META / OMNIPACK_META
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metadata, indent=2, sort_keys=False) + "\n")


def read_omnipack_meta(root: Path) -> dict[str, Any]:
    path = Path(root) / NV_META / OMNIPACK_META
    if not path.exists():
        raise FileNotFoundError(f"{root} is not an omnipack dataset (no {NV_META}/{OMNIPACK_META})")
    return json.loads(path.read_text())
