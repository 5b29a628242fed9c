"""Input importers: one module per file format (``jsonl``, ``json_array``, ``parquet``, ``arrow``) and per
record layout (``omnipack_layout``, ``sharegpt``, ``messages_media``, ``prompt_response``), registered by name
in :mod:`.base` and auto-detected; :func:`read_samples` reads any mix of them into ``RawSample``s. Tool calls
and tools are normalized in :mod:`.tool_use`; :mod:`.llama_factory` reads LLaMA-Factory's ``dataset_info.json``."""

# importing the modules registers their readers and layouts
from . import (  # noqa: F401
    arrow,
    json_array,
    jsonl,
    messages_media,
    omnipack_layout,
    parquet,
    prompt_response,
    sharegpt,
)
from .base import LAYOUTS, READERS, InputError, InputPart
from .read import InputSpec, count_records, data_files, read_part, read_samples, select_inputs, split_parts

__all__ = [
    "LAYOUTS",
    "READERS",
    "InputError",
    "InputPart",
    "InputSpec",
    "count_records",
    "data_files",
    "read_part",
    "read_samples",
    "select_inputs",
    "split_parts",
]
