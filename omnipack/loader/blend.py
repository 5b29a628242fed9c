"""The omnipack datasets an Energon (meta)dataset path reads, and the check that one encoder serves them all.

Energon blends the leaves of a metadataset (``blend`` weights, ``blend_epochized`` repetitions, subflavors)
itself, but the trainer runs ONE task encoder over every row: one profile rebuilt from one record, one
set of placeholder ids, one pack width, one CP/TP slicing. So before loading, every leaf's
``.nv-meta/omnipack.json`` must agree with the first leaf on the profile family and settings, the
tokenizer, ``seq_length`` and whether rows carry mRoPE ids, and its alignment must serve the trainer's
parallel layout. A mismatch raises ``BlendMismatchError`` naming the leaf and the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dataset.location import energon_location, is_remote_dataset
from ..dataset.meta import read_omnipack_meta
from .compat import DatasetAlignmentError, check_dataset_alignment
from .task_encoder import OmnipackTaskEncoder

# The encoder options that describe the trainer's parallel layout (``OmnipackTaskEncoder.from_dataset``).
LAYOUT_DEFAULTS: dict[str, Any] = {"tp": 1, "cp": 1, "sequence_parallel": False, "fp8": "none"}


class BlendMismatchError(ValueError):
    """A leaf of a blend that one omnipack task encoder cannot load together with the others."""

    def __init__(self, leaf: Path | str, field: str, message: str) -> None:
        super().__init__(f"blend leaf {str(leaf)!r}: {field}: {message}")
        self.leaf = str(leaf)
        self.field = field


class LeafAlignmentError(BlendMismatchError, DatasetAlignmentError):
    """A leaf whose alignment or pack width does not serve the trainer's parallel layout."""


@dataclass(frozen=True)
class DatasetLeaf:
    """One dataset a (meta)dataset reads: where it is (a folder, or an ``msc://`` URL), which split, its
    subflavors and its omnipack.json."""

    path: Path | str
    split_part: str
    subflavors: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def is_metadataset(path: str | Path) -> bool:
    """An Energon metadataset is a YAML file; a prepared dataset is a directory (local or remote)."""
    p = energon_location(path)
    if is_remote_dataset(p):
        from megatron.energon.epathlib import EPath

        return str(p).endswith((".yaml", ".yml")) and EPath(p).is_file()
    return p.is_file() and p.suffix in (".yaml", ".yml")


def dataset_leaves(path: str | Path, split_part: str = "train") -> list[DatasetLeaf]:
    """The omnipack datasets ``path`` (a dataset directory or a metadataset YAML) reads for ``split_part``.

    Nested metadatasets are followed (Energon's own traversal, so paths, split overrides and subflavors
    resolve exactly as the loader resolves them). Joins are refused: an omnipack row is complete as it is.
    A remote ``path`` (``msc://``, ``s3://``...) is read through Energon's storage client (``location``).
    """
    p = energon_location(path)
    if not is_metadataset(p):
        return [DatasetLeaf(p, split_part, {}, _read_meta(p, p))]
    from megatron.energon.metadataset.loader import traverse_metadataset

    try:
        refs = traverse_metadataset(str(p), split_part=split_part)
    except NotImplementedError as e:
        raise ValueError(f"metadataset {p}: {e} (omnipack rows need no join)") from None
    except KeyError as e:
        raise ValueError(f"metadataset {p} has no split {e}") from None
    if not refs:
        raise ValueError(f"metadataset {p} names no dataset for split {split_part!r}")
    leaves = []
    for ref in refs:
        leaf = energon_location(str(ref.path))  # an EPath: a local path, or msc://PROFILE/path
        if ref.aux:
            raise BlendMismatchError(leaf, "aux", "auxiliary datasets are not used by omnipack rows")
        leaves.append(DatasetLeaf(leaf, ref.split_part, dict(ref.subflavors or {}), _read_meta(leaf, p)))
    return leaves


def _read_meta(leaf: Path | str, source: Path | str) -> dict[str, Any]:
    try:
        return read_omnipack_meta(leaf)
    except FileNotFoundError as e:
        if leaf == source:
            raise
        raise BlendMismatchError(leaf, "omnipack.json", f"{e} (named by {source})") from None


def _profile_name(m: dict[str, Any]) -> Any:
    return (m.get("profile") or {}).get("name")


def _profile_settings(m: dict[str, Any]) -> Any:
    return (m.get("profile") or {}).get("settings")


def _fingerprint(m: dict[str, Any]) -> Any:
    return (m.get("tokenizer") or {}).get("fingerprint")


def _placeholder_ids(m: dict[str, Any]) -> Any:
    return (m.get("tokenizer") or {}).get("placeholder_token_ids")


# (field named in errors, how to read it, why it must agree). Checked in this order against the first leaf.
AGREEING_FIELDS: tuple[tuple[str, Callable[[dict[str, Any]], Any], str], ...] = (
    ("profile", _profile_name, "one loader rebuilds one model profile"),
    ("tokenizer fingerprint", _fingerprint, "token ids must mean the same thing in every row"),
    ("seq_length", lambda m: m.get("seq_length"), "a micro-batch is MBS rows of one width"),
    (
        "profile settings",
        _profile_settings,
        "media inputs are rebuilt with one profile's patching and normalization",
    ),
    ("tokenizer placeholder_token_ids", _placeholder_ids, "media placeholders are found by these ids"),
    ("mrope_position_ids", lambda m: bool(m.get("mrope_position_ids")), "rows of a batch are concatenated"),
)


def check_leaves(
    leaves: list[DatasetLeaf],
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    fp8: str = "none",
) -> int:
    """Raise ``BlendMismatchError`` (``LeafAlignmentError`` for the layout) for the first leaf that one task
    encoder cannot serve together with the first leaf; returns the alignment every leaf's rows satisfy
    (the gcd of the leaves' alignments, itself a multiple of what the layout needs)."""
    if not leaves:
        raise ValueError("no datasets to check")
    ref = leaves[0]
    for leaf in leaves:
        for name, read, why in AGREEING_FIELDS:
            a, b = read(ref.meta), read(leaf.meta)
            if leaf is not ref and a != b:
                raise BlendMismatchError(
                    leaf.path,
                    name,
                    f"{_short(b)} here, but {_short(a)} in {str(ref.path)!r} ({why}); "
                    "prepare every blended dataset with the same profile, tokenizer and --seq-length",
                )
        try:
            check_dataset_alignment(
                int(leaf.meta["align"]),
                tp=tp,
                cp=cp,
                sequence_parallel=sequence_parallel,
                fp8=fp8,
                seq_length=int(leaf.meta["seq_length"]),
            )
        except DatasetAlignmentError as e:
            raise LeafAlignmentError(leaf.path, "align", str(e)) from None
    return math.gcd(*(int(leaf.meta["align"]) for leaf in leaves))


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def task_encoder_for(path: str | Path, *, split_part: str = "train", **encoder_options: Any) -> Any:
    """An ``OmnipackTaskEncoder`` for a dataset directory or a metadataset YAML blending omnipack datasets.

    Every leaf is checked (``check_leaves``) with the layout in ``encoder_options`` (tp, cp,
    sequence_parallel, fp8); the encoder is configured from the first leaf, and its per-row contract check
    uses the alignment all leaves satisfy.
    """
    leaves = dataset_leaves(path, split_part)
    layout = {k: encoder_options.get(k, v) for k, v in LAYOUT_DEFAULTS.items()}
    align = check_leaves(leaves, **layout)
    te = OmnipackTaskEncoder.from_dataset(leaves[0].path, **encoder_options)
    te.align = align
    return te
