"""A dataset's root digest: one sha256 over every file of the dataset, the trust anchor of a copy.

Prepare prints the root and records it in ``.nv-meta/omnipack.json`` under ``"root"`` (with its leaves);
``omnipack verify --expect-root HEX`` recomputes it from a copy's files, so a copy that was damaged and then
re-checksummed (shard checksums, ``.tar.idx`` and counts rewritten to agree) is still caught, without the
source. The rule (``omnipack-root-v1``), enough for a third party to recompute the root:

- Leaves, one per file the root covers (paths relative to the dataset folder, ``/``-separated):
  every shard that ``omnipack.json`` lists under ``"shards"`` and its ``<shard>.idx``; every file under
  ``.nv-meta/`` (Energon's ``.info.json``, ``split.yaml``, ``dataset.yaml``, ``dataset_crude.yaml``, the
  accounting ledger ``accounting.parquet``, the role spans ``role_spans.parquet``, ``omnipack.json``); the rejects file (``omnipack.json``'s
  ``"rejects_file"``, ``rejects.jsonl``).
- A leaf is ``(path, size, digest)``. ``digest`` is ``sha256:<hex>`` of the file's bytes, except:
  a shard's is the checksum recorded for it at write time, ``sha256:<hex>`` when ``omnipack.json`` holds a
  ``sha256`` for it (prepare ``--shard-sha256``: a root cryptographic end to end), else ``xxh3_128:<hex>``
  (the xxh3-128 of its bytes); and ``omnipack.json``'s is ``sha256:<hex>`` of its content without the
  ``"root"`` key, written as ``json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)``
  in UTF-8, its ``size`` that text's length in bytes.
- Each leaf is written as the line ``f"{path}\\t{size}\\t{digest}\\n"``; the root is the sha256 (hex) of the
  lines, sorted by path, concatenated. (A Merkle tree of one level: the leaves recorded beside the root
  name which file differs when a copy does not give the root.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .meta import NV_META, OMNIPACK_META, write_omnipack_meta
from .shards import new_hasher

RULE = "omnipack-root-v1"
ROOT_KEY = "root"  # omnipack.json's key: {"rule", "sha256", "leaves": [[path, size, digest], ...]}
MISSING = "missing"  # a covered file that is not there: its leaf is (path, -1, "missing")
Leaf = tuple[str, int, str]


def merkle_root(leaves: list[Leaf]) -> str:
    """The root of ``leaves`` (see the module docstring)."""
    h = hashlib.sha256()
    for path, size, digest in sorted(leaves):
        h.update(f"{path}\t{size}\t{digest}\n".encode())
    return h.hexdigest()


def meta_leaf(doc: dict[str, Any]) -> Leaf:
    """``omnipack.json``'s leaf, from its parsed content (the root itself left out)."""
    text = json.dumps({k: v for k, v in doc.items() if k != ROOT_KEY}, sort_keys=True, separators=(",", ":"))
    data = text.encode()
    return f"{NV_META}/{OMNIPACK_META}", len(data), "sha256:" + hashlib.sha256(data).hexdigest()


def shard_algorithm(record: dict[str, Any]) -> str:
    """The checksum a shard's leaf uses: sha256 when one was recorded for it, else xxh3-128."""
    return "sha256" if record.get("sha256") else "xxh3_128"


def file_leaf(root: Any, rel: str, algorithm: str = "sha256") -> Leaf:
    """A file's leaf, read in 1 MiB pieces (``root``: a ``Path`` or a path object of an object store)."""
    path = root / rel
    hasher, size = new_hasher(algorithm), 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        return rel, -1, MISSING
    return rel, size, f"{algorithm}:{hasher.hexdigest()}"


def dataset_leaves(
    root: Path,
    doc: dict[str, Any],
    *,
    meta_root: Path | None = None,
    shard_digests: dict[str, Leaf] | None = None,
) -> list[Leaf]:
    """Every leaf of the dataset at ``root`` whose ``omnipack.json`` is ``doc``, sorted by path.

    ``meta_root`` holds ``.nv-meta/`` when it is not under ``root`` yet (prepare's staging folder);
    ``shard_digests`` gives shard leaves known already (prepare's recorded checksums, or those verify
    computed in its pass), the other shards are hashed here."""
    meta_root = root if meta_root is None else meta_root
    known = shard_digests or {}
    leaves = [meta_leaf(doc)]
    for shard in doc.get("shards") or []:
        rel = shard["path"]
        leaves.append(known.get(rel) or file_leaf(root, rel, shard_algorithm(shard)))
        leaves.append(file_leaf(root, f"{rel}.idx"))
    leaves.append(file_leaf(root, doc.get("rejects_file", "rejects.jsonl")))
    meta_dir = meta_root / NV_META
    for path in sorted(p for p in meta_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(meta_root).as_posix()
        if rel != f"{NV_META}/{OMNIPACK_META}":
            leaves.append(file_leaf(meta_root, rel))
    return sorted(leaves)


def recorded_shard_leaves(doc: dict[str, Any]) -> dict[str, Leaf]:
    """Shard leaves from the checksums ``omnipack.json`` records (what the write stage computed); a shard
    written before xxh3-128 was recorded is left out (``dataset_leaves`` hashes it)."""
    out = {}
    for s in doc.get("shards") or []:
        algorithm = shard_algorithm(s)
        if s.get(algorithm):
            out[s["path"]] = (s["path"], int(s["num_bytes"]), f"{algorithm}:{s[algorithm]}")
    return out


def stamp_root(staging: Path, out: Any) -> dict[str, Any]:
    """Record the root in the staged ``omnipack.json`` (``staging/.nv-meta``, the other files already under
    ``out``) and return the record: ``{"rule", "sha256", "leaves"}``."""
    path = staging / NV_META / OMNIPACK_META
    doc = json.loads(path.read_text())
    leaves = dataset_leaves(out, doc, meta_root=staging, shard_digests=recorded_shard_leaves(doc))
    doc[ROOT_KEY] = {"rule": RULE, "sha256": merkle_root(leaves), "leaves": [list(x) for x in leaves]}
    write_omnipack_meta(staging, doc)
    return doc[ROOT_KEY]


def leaf_differences(recorded: list[Leaf], found: list[Leaf]) -> list[str]:
    """What differs between two leaf lists, one line per file."""
    want, got = {x[0]: x for x in recorded}, {x[0]: x for x in found}
    out = []
    for rel in sorted(want.keys() | got.keys()):
        w, g = want.get(rel), got.get(rel)
        if w == g:
            continue
        if w is None:
            out.append(f"{rel}: a file the recorded leaves do not have ({g[1]} bytes, {g[2]})")
        elif g is None or g[2] == MISSING:
            out.append(f"{rel}: missing (recorded {w[1]} bytes, {w[2]})")
        else:
            out.append(f"{rel}: {g[1]} bytes, {g[2]}; recorded {w[1]} bytes, {w[2]}")
    return out
