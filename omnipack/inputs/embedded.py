"""Media bytes inside input records.

Hugging Face ``Image``/``Audio``/``Video`` features store ``{"bytes": ..., "path": ...}`` per value (bytes may be
null when a path is given). Readers of binary formats (Parquet, Arrow) leave the bytes in the file and put an
``embedded:`` pointer in the record instead, ``embedded:<input file>#<record index>/<column>/<key>...``, which
the media resolver reads back (one row group's column at a time, cached); JSON readers turn base64 ``bytes``
into a ``data:`` URI. A value with only a ``path`` becomes that path (resolved like any other reference)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from ..media.errors import MediaError
from ..media.sources import register_scheme
from . import arrow, parquet
from .base import input_key, input_path

EMBEDDED_PREFIX = "embedded:"
_FEATURE_KEYS = frozenset(("bytes", "path"))


def pointer_ref(file: Path, index: int, keys: tuple[Any, ...]) -> str:
    tail = "".join("/" + quote(str(k), safe="") for k in keys)
    return f"{EMBEDDED_PREFIX}{quote(input_key(file))}#{index}{tail}"


def parse_pointer(ref: str) -> tuple[str, str]:
    """(input file, ``index/key/...``) of an ``embedded:`` reference."""
    body = ref[len(EMBEDDED_PREFIX) :]
    file, sep, pointer = body.partition("#")
    if not sep or not pointer.split("/", 1)[0].isdigit():
        raise MediaError(f"malformed embedded media reference {ref[:200]!r}")
    return unquote(file), pointer


def read_embedded(file: str, pointer: str) -> bytes:
    """The bytes an ``embedded:`` pointer names, read back from its Parquet or Arrow input file."""
    index_s, _, rest = pointer.partition("/")
    keys = [unquote(k) for k in rest.split("/")] if rest else []
    if not keys:
        raise MediaError(f"embedded media reference names no column: {pointer!r}")
    path = input_path(file)
    module = parquet if path.suffix == ".parquet" else arrow
    try:
        value = module.column_value(path, int(index_s), keys[0])
        for k in keys[1:]:
            value = value[int(k)] if isinstance(value, list) else value[k]
    except (OSError, KeyError, IndexError, ValueError, StopIteration) as e:
        raise MediaError(f"cannot read embedded media {file}#{pointer}: {type(e).__name__}: {e}") from None
    if not isinstance(value, bytes):
        raise MediaError(f"embedded media {file}#{pointer} holds {type(value).__name__}, not bytes")
    return value


# the media resolver reads these references back through this module (media never imports the input layer)
register_scheme(EMBEDDED_PREFIX, parse_pointer, read_embedded)


def replace_embedded(value: Any, file: Path, index: int, binary: bool, keys: tuple[Any, ...] = ()) -> Any:
    """``value`` with every media-bytes value replaced by a string reference (see the module docstring)."""
    if isinstance(value, dict):
        if "bytes" in value and set(value) <= _FEATURE_KEYS:
            data, path = value.get("bytes"), value.get("path")
            if data is None:
                return path
            if binary and isinstance(data, bytes):
                return pointer_ref(file, index, (*keys, "bytes"))
            if isinstance(data, str):
                return "data:application/octet-stream;base64," + data
            return value  # left as it is: the schema check names the wrong type
        return {k: replace_embedded(v, file, index, binary, (*keys, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_embedded(v, file, index, binary, (*keys, i)) for i, v in enumerate(value)]
    if binary and isinstance(value, bytes):
        return pointer_ref(file, index, keys)
    return value
