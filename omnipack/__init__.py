"""omnipack: offline packing of multimodal training data into Megatron-Energon THD datasets.

Importing omnipack is cheap and needs no media stack: the trainer-side pieces are loaded lazily
(PEP 562), e.g. ``omnipack.OmnipackTaskEncoder`` or ``omnipack.get_train_loader``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY = {
    "OmnipackTaskEncoder": "omnipack.loader.task_encoder",
    "PackedBatch": "omnipack.loader.task_encoder",
    "PackedRowSample": "omnipack.loader.sample",
    "get_train_loader": "omnipack.loader.loaders",
    "get_val_loader": "omnipack.loader.loaders",
    "check_dataset_alignment": "omnipack.loader.compat",
    "DatasetAlignmentError": "omnipack.loader.compat",
    "MediaMismatchError": "omnipack.loader.media",
    "decode_payload": "omnipack.loader.media",
    "row_to_batch": "omnipack.loader.batch",
    "concat_rows": "omnipack.loader.batch",
    "packed_seq_params": "omnipack.loader.batch",
    "packed_seq_fields": "omnipack.loader.batch",
    "slice_batch_for_cp": "omnipack.loader.context_parallel",
    "get_profile": "omnipack.profiles",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'omnipack' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
