"""Where a prepared dataset (or a metadataset YAML) is, as the trainer names it and as Energon opens it.

Energon opens remote datasets through multi-storage-client and only under ``msc://PROFILE/path``. A trainer may
name the same dataset by its store URL (``s3://bucket/prefix``, as ``prepare -o`` wrote it): that is the
client's implicit profile ``msc://_s3-bucket/prefix`` (credentials and endpoint from the usual ``AWS_*``
environment and ``~/.aws``). Local paths stay ``pathlib.Path``s; ``file://`` URLs are local paths.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Stores multi-storage-client opens without a configured profile (its implicit ``_<protocol>-<bucket>``).
IMPLICIT_PROFILE_PROTOCOLS = ("s3", "gs", "ais")
_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?P<rest>.*)$", re.S)


def energon_location(path: str | os.PathLike) -> str | Path:
    """``path`` as Energon opens it: a ``Path`` for a local dataset, an ``msc://`` URL for a remote one.

    Raises ``ValueError`` for a URL scheme Energon can not open."""
    text = os.fspath(path)
    m = _URL_RE.match(text)
    if m is None:
        return Path(text)
    scheme, rest = m["scheme"].lower(), m["rest"]
    if scheme == "file":
        return Path(unquote(urlsplit(text).path))
    if scheme == "msc":
        return f"msc://{rest}"
    if scheme in IMPLICIT_PROFILE_PROTOCOLS:
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ValueError(f"dataset {text!r} names no bucket")
        return f"msc://_{scheme}-{bucket}/{key}".rstrip("/")
    raise ValueError(
        f"dataset {text!r}: Energon opens local paths and msc://PROFILE/path URLs "
        f"(and {', '.join(p + '://' for p in IMPLICIT_PROFILE_PROTOCOLS)} through msc's implicit profiles)"
    )


def is_remote_dataset(location: str | Path) -> bool:
    """Whether an ``energon_location`` is an ``msc://`` URL (read through Energon's storage client)."""
    return isinstance(location, str) and location.startswith("msc://")
