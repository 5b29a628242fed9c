"""Trainer-side check that a prepared dataset's alignment fits the trainer's parallel layout."""

from __future__ import annotations

import math

from omnipack.alignment import FP8_ALIGN, pad_to_multiple, required_alignment


class DatasetAlignmentError(ValueError):
    """The dataset was packed with an alignment the trainer's parallel settings cannot use."""


def _flags(tp: int, cp: int, sequence_parallel: bool, fp8: str) -> str:
    parts = [f"--tp {tp}", f"--cp {cp}"]
    if sequence_parallel:
        parts.append("--sequence-parallel")
    if fp8 != "none":
        parts.append(f"--fp8 {fp8}")
    return " ".join(parts)


def check_dataset_alignment(
    dataset_align: int,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    fp8: str = "none",
    seq_length: int | None = None,
) -> int:
    """Raise ``DatasetAlignmentError`` unless ``dataset_align`` is a multiple of what the settings need.

    ``seq_length`` (the dataset's pack width W), when given, must be a multiple too. Returns the required
    alignment. Packing is offline, so the only fix is to re-prepare; the message says with what.
    """
    if fp8 not in FP8_ALIGN:
        raise ValueError(f"fp8 must be one of {sorted(FP8_ALIGN)}, got {fp8!r}")
    if tp < 1 or cp < 1:
        raise ValueError(f"tp and cp must be >= 1, got tp={tp} cp={cp}")
    if not isinstance(dataset_align, int) or dataset_align < 1:
        raise ValueError(f"dataset alignment must be a positive int, got {dataset_align!r}")
    needed = required_alignment(tp, cp, sequence_parallel, fp8)
    settings = f"tp={tp}, cp={cp}, sequence_parallel={sequence_parallel}, fp8={fp8!r}"
    if dataset_align % needed:
        raise DatasetAlignmentError(
            f"dataset was prepared with per-sequence alignment {dataset_align}, but the trainer settings "
            f"({settings}) need a multiple of {needed}. Re-prepare the dataset for these settings "
            f"(e.g. `omnipack prepare ... {_flags(tp, cp, sequence_parallel, fp8)}`; settings whose alignment is "
            f"a multiple of {math.lcm(dataset_align, needed)} serve both the old and the new layout)."
        )
    if seq_length is not None and seq_length % needed:
        raise DatasetAlignmentError(
            f"dataset pack width (seq_length) {seq_length} is not a multiple of the alignment {needed} that "
            f"the trainer settings ({settings}) need; re-prepare with a seq_length of "
            f"{pad_to_multiple(seq_length, needed)} or {seq_length // needed * needed}."
        )
    return needed
