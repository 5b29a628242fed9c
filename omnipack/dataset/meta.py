"""Energon's ``.nv-meta`` files for an omnipack dataset, plus omnipack's own metadata file.

Energon rejects unknown keys in ``.info.json``, so omnipack's metadata lives in ``.nv-meta/omnipack.json``.
``dataset.yaml`` (what stock ``energon info|lint|preview`` and the loaders read by default) names omnipack's
typed factory, ``omnipack.loader.energon_dataset.OmnipackWebdataset``, which decodes each row with
omnipack's codec into a sample the omnipack task encoder loads and ``energon preview`` prints readably.
``dataset_crude.yaml`` declares a CrudeWebdataset, for task encoders that cook rows themselves (omnipack's
cooker does).
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from .location import energon_location, is_remote_dataset
from .shards import ShardInfo

NV_META = ".nv-meta"
OMNIPACK_META = "omnipack.json"
DATASET_CONFIG = "dataset.yaml"
CRUDE_CONFIG = "dataset_crude.yaml"
ROW_FACTORY = {"__module__": "omnipack.loader.energon_dataset", "__class__": "OmnipackWebdataset"}
ROW_SAMPLE = {"__module__": "omnipack.loader.energon_dataset", "__class__": "OmnipackRow"}


def _energon_version() -> str | None:
    try:
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
    write_dataset_configs(root)


def write_dataset_configs(root: Path) -> None:
    """(Re)write the dataset configs in ``root/.nv-meta`` (also upgrades a dataset prepared when
    ``dataset.yaml`` was the crude config, which stock ``energon info|lint|preview`` cannot read)."""
    meta = Path(root) / NV_META
    typed = yaml.safe_dump({**ROW_FACTORY, "sample_type": ROW_SAMPLE}, sort_keys=False)
    (meta / DATASET_CONFIG).write_text(typed)
    (meta / CRUDE_CONFIG).write_text("__module__: megatron.energon\n__class__: CrudeWebdataset\n")


def write_omnipack_meta(root: Path, metadata: dict[str, Any]) -> None:
    path = root / NV_META / OMNIPACK_META
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metadata, indent=2, sort_keys=False) + "\n")


def read_omnipack_meta(root: Path | str) -> dict[str, Any]:
    """A dataset's ``omnipack.json``: from a folder, or from a remote dataset (``msc://PROFILE/path``, or a store
    URL such as ``s3://bucket/prefix``; see ``location``), read through Energon's own storage client, so the
    loader needs nothing more."""
    where = energon_location(root)
    if is_remote_dataset(where):
        from megatron.energon.epathlib import EPath

        remote = EPath(where) / NV_META / OMNIPACK_META
        if not remote.is_file():
            raise FileNotFoundError(f"{root} is not an omnipack dataset (no {NV_META}/{OMNIPACK_META})")
        return json.loads(remote.read_text())
    path = Path(where) / NV_META / OMNIPACK_META
    if not path.exists():
        raise FileNotFoundError(f"{root} is not an omnipack dataset (no {NV_META}/{OMNIPACK_META})")
    return json.loads(path.read_text())
