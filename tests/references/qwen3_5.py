"""Qwen3.5: transformers 5.24 maps ``qwen3_5`` to ``Qwen3VLProcessor`` (no processor of its own), so its
reference is Qwen3-VL's: the processor's own replacements, image grids from the image processor on the
file, video grids from the plan."""

from __future__ import annotations

from tests.family_kit import FamilyReference
from tests.references.qwen3_vl import hf_input_ids

REFERENCE = FamilyReference(hf_input_ids)
