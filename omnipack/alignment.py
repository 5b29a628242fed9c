"""Per-sequence alignment that a Megatron trainer needs for THD packs.

TransformerEngine's context-parallel THD kernels need every padded sequence length divisible by
``2*cp``; sequence parallelism needs the per-rank token count divisible by ``tp`` (so ``cp*tp`` before
the CP split); FP8 GEMMs need 16 (32 for MXFP8/FP4). The pack width must be a multiple too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FP8_ALIGN = {"none": 1, "fp8": 16, "mxfp8": 32, "fp4": 32}


@dataclass(frozen=True)
class ParallelLayout:
    """The trainer settings that constrain alignment."""

    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    fp8: str = "none"

    def __post_init__(self) -> None:
        if self.tp < 1 or self.cp < 1:
            raise ValueError(f"tp and cp must be >= 1, got tp={self.tp} cp={self.cp}")
        if self.fp8 not in FP8_ALIGN:
            raise ValueError(f"fp8 must be one of {sorted(FP8_ALIGN)}, got {self.fp8!r}")

    @property
    def alignment(self) -> int:
        return required_alignment(self.tp, self.cp, self.sequence_parallel, self.fp8)


def required_alignment(tp: int = 1, cp: int = 1, sequence_parallel: bool = False, fp8: str = "none") -> int:
    """``lcm(2*cp if cp > 1, cp*tp if sequence parallel, 16/32 for fp8/mxfp8)``; 1 when nothing applies."""
    parts = [2 * cp if cp > 1 else 1, cp * tp if (sequence_parallel and tp > 1) else 1, FP8_ALIGN[fp8]]
    return math.lcm(*parts)


def pad_to_multiple(length: int, align: int) -> int:
    return -(-length // align) * align


def check_seq_length(seq_length: int, align: int) -> None:
    if seq_length <= 0:
        raise ValueError(f"seq_length must be positive, got {seq_length}")
    if seq_length % align:
        raise ValueError(
            f"seq_length {seq_length} is not a multiple of the alignment {align}; "
            f"use {pad_to_multiple(seq_length, align)} or {seq_length // align * align}"
        )
