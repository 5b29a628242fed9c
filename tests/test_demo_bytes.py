"""The demo's dataset bytes are pinned: refactors must leave every shard, index and Energon metadata file
identical (``omnipack.json`` records paths and versions, so it is compared by its content keys instead; the
accounting ledger, a Parquet file whose reject reasons name the run's folder, by its schema and rows;
Energon's ``.info.json`` with the installed Energon's version blanked).

When a change is meant to alter the bytes, regenerate the pin with
``python tests/test_demo_bytes.py --update`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

from omnipack.cli import main

GOLDEN = Path(__file__).parent / "golden" / "demo_bytes.json"


def demo_digests(root: Path) -> dict[str, str]:
    """sha256 of every pinned file under the demo's dataset, the run's own folder written as ``<ROOT>``."""
    dataset = root / "dataset"
    out = {}
    for path in sorted(dataset.rglob("*")):
        rel = path.relative_to(dataset).as_posix()
        if not path.is_file() or rel.startswith("stages/") or rel == ".nv-meta/omnipack.json":
            continue
        if path.suffix == ".parquet":  # strings with the folder in them change the file's lengths and offsets
            table = pq.read_table(path)
            data = json.dumps([str(table.schema), table.to_pylist()]).encode()
        else:
            data = path.read_bytes()
        data = data.replace(str(root).encode(), b"<ROOT>")
        if rel == ".nv-meta/.info.json":  # records the Energon release that wrote it, not our bytes
            data = re.sub(rb'"energon_version": "[^"]*"', b'"energon_version": "<ENERGON>"', data)
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def _run_demo(root: Path) -> None:
    assert main(["demo", str(root)]) == 0


def test_demo_bytes_are_pinned(tmp_path):
    _run_demo(tmp_path / "demo")
    got = demo_digests(tmp_path / "demo")
    want = json.loads(GOLDEN.read_text())
    changed = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not changed, f"demo output changed: {changed} (see this module's docstring to re-pin)"
    meta = json.loads((tmp_path / "demo" / "dataset" / ".nv-meta" / "omnipack.json").read_text())
    assert meta["counts"] == json.loads(GOLDEN.with_suffix(".counts.json").read_text())


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _run_demo(Path(tmp) / "demo")
        GOLDEN.write_text(json.dumps(demo_digests(Path(tmp) / "demo"), indent=1, sort_keys=True) + "\n")
        counts = json.loads((Path(tmp) / "demo" / "dataset" / ".nv-meta" / "omnipack.json").read_text())["counts"]
        GOLDEN.with_suffix(".counts.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
