"""Input samples: the ``RawSample`` every stage receives and the record schema check (both defined in
:mod:`omnipack.inputs.records`), and ``read_manifest``, a facade over the importers of :mod:`omnipack.inputs`
(JSONL, JSON arrays, Parquet, Arrow/``datasets``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .inputs import InputSpec, read_samples
from .inputs.jsonl import DEFAULT_MAX_RECORD_BYTES
from .inputs.records import ManifestError, MediaRef, RawSample, load_schema, validate_record

__all__ = [
    "ManifestError",
    "MediaRef",
    "RawSample",
    "default_max_line_bytes",
    "load_schema",
    "read_manifest",
    "validate_record",
]


def default_max_line_bytes(seq_length: int) -> int:
    """The longest manifest line read for rows of ``seq_length`` tokens: far above what such a row can
    hold (a token is a few characters; JSON escapes take at most 12 bytes a character), so only lines
    that can not be a sample of this length are refused, and a worker's memory has a fixed cap."""
    return max(DEFAULT_MAX_RECORD_BYTES, 256 * seq_length)


def read_manifest(
    paths: list[Path | str],
    start_index: int = 0,
    max_line_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    *,
    start: int = 0,
    stop: int | None = None,
    input_format: str | None = None,
    input_layout: str = "auto",
    input_fields: dict[str, str] | None = None,
    input_roles: dict[str, str] | None = None,
    ledger: list[dict[str, Any]] | None = None,
    split: str | None = None,
) -> Iterator[RawSample]:
    """Every record of every input (any format ``omnipack.inputs`` reads), in order; invalid records come
    back with ``error`` set (never dropped).

    ``[start, stop)`` limits the read to those record positions over all inputs in order (so stages can
    split the input into parts); sample indices are ``start_index + position``. A JSONL line or JSON record
    longer than ``max_line_bytes`` is rejected unparsed (its bytes are skipped, never held). ``ledger``
    receives the per-file record ranges read (see ``omnipack.inputs.read_samples``); ``split`` chooses the
    split of folder inputs (see ``omnipack.inputs.splits``)."""
    spec = InputSpec(
        input_format, input_layout, dict(input_fields or {}), max_line_bytes, split, dict(input_roles or {})
    )
    return read_samples(list(paths), spec, start, stop, start_index, ledger)  # local paths or URLs

