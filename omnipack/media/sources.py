"""Where media bytes come from: one resolver for every kind of media reference a record can hold.

A reference (the string in a record's ``image``/``video``/``audio`` part) is one of:

- ``imgs/cat.jpg``: a path relative to the media root (a local folder, or a URL such as ``s3://bucket/media``);
  it may not leave the root; a symlink inside the root that points elsewhere is refused unless its target
  lies under one of the extra allowed roots (``--media-allow-root``);
- ``file:///abs/cat.jpg``: a local file, under the media root or an allowed root;
- ``https://host/cat.jpg``, ``s3://bucket/cat.jpg``, ``gs://...``, ``msc://profile/...``: any URL an installed
  fsspec filesystem serves (``s3fs`` for ``s3://``). Credentials and endpoints come from that client's usual
  environment and config (``AWS_*`` variables, ``~/.aws``, ``FSSPEC_*``), never from the record;
- ``data:image/jpeg;base64,...``: the bytes themselves (and HF ``{"bytes": ..., "path": ...}`` values, which
  the input readers turn into such data URIs, or into ``embedded:`` pointers for binary Parquet/Arrow columns);
- ``shards/part-000.tar#000123.jpg``: the member ``000123.jpg`` of a (webdataset) tar shard, the shard being
  any of the above path or URL forms; the shard's header index is read once per process and the member is
  read with one ranged read;
- ``<scheme>:...``: a scheme another layer registers with :func:`register_scheme` (the input readers'
  ``embedded:`` pointers to bytes inside a Parquet/Arrow input), read back by that layer's reader.

:func:`resolve_source` gives a :class:`MediaSource`; the measure stage probes it and the write stage resolves
the same reference again to materialise it. Remote opens and fetches retry with exponential backoff within
a deadline per URL and end as a :class:`MediaError` naming the URL and the last error (a timeout says so);
HTTP fetches refuse private addresses unless allowed (``omnipack.media.remote``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import os
import posixpath
import re
import tarfile
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import unquote, urlsplit

from .access import CREDENTIALS_HINT, StoreAccessError, access_error, error_chain
from .errors import MediaError
from .remote import (
    DEFAULT_REMOTE,
    Deadline,
    PrivateAddressRefused,
    RemoteSettings,
    check_url,
    fetch_options,
)

ALLOW_ROOT_OPTION = "--media-allow-root"
URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
TAR_MEMBER_RE = re.compile(r"^(?P<shard>.+?\.tar)#(?P<member>[^#]+)$")

# Remote fetches: attempts and the first backoff delay (doubled after each failure).
FETCH_ATTEMPTS = 4
FETCH_BACKOFF_S = 0.25
# Block size of remote files opened for probing: headers are read with ranged reads of this size.
PROBE_BLOCK_BYTES = 1 << 16
_TAR_INDEX_CACHE = 16

T = TypeVar("T")


class SourceRefused(MediaError):
    """A reference points where the run may not read (outside the media root and the allowed roots), or is
    relative with no media root to resolve it against."""


@dataclass(frozen=True)
class Scheme:
    """A reference form another layer owns: ``parse(ref)`` gives (location, member) without touching storage,
    ``read(location, member)`` the bytes."""

    prefix: str
    parse: Callable[[str], tuple[str, str]]
    read: Callable[[str, str], bytes]


_SCHEMES: dict[str, Scheme] = {}


def register_scheme(prefix: str, parse: Callable[[str], tuple[str, str]], read: Callable[[str, str], bytes]) -> None:
    """Resolve references starting with ``prefix`` (e.g. ``"embedded:"``) by ``parse`` and read them by
    ``read``; their sources have ``kind == prefix`` without the colon."""
    _SCHEMES[prefix] = Scheme(prefix, parse, read)


def is_url(ref: str) -> bool:
    """Any ``scheme://`` reference, ``file://`` included."""
    return bool(URL_RE.match(ref))


def is_remote(location: str | os.PathLike) -> bool:
    """A location on a store or server: a ``scheme://`` one other than ``file://`` (a local path)."""
    text = str(location)
    return is_url(text) and not text.lower().startswith("file://")


def media_root_key(root: str | os.PathLike | None) -> str | None:
    """The media root as the run's settings record it: a remote one as written, a folder as its absolute
    path (so a key does not depend on the directory a rank was started from); None when there is none."""
    if root is None:
        return None
    return str(root) if is_remote(root) else str(Path(local_location(root)).resolve())


def local_location(location: str | os.PathLike) -> str:
    """``location`` with a ``file://`` URL turned into its path (other locations as they are)."""
    text = str(location)
    return unquote(urlsplit(text).path) if text.lower().startswith("file://") else text


def local_path(location: str | os.PathLike, option: str, kind: str = "folder") -> Path:
    """A path option's value (a ``kind`` of this machine) as a ``Path``, a ``file://`` URL as its path.

    Raises ``ValueError`` for a store or server URL, which ``Path`` would take for a relative path (it folds
    ``//``: ``s3://bucket/x`` becomes ``./s3:/bucket/x``, created in the current directory)."""
    if is_remote(location):
        raise ValueError(f"{option} must be a local or mounted {kind}, got the URL {location}")
    return Path(local_location(location))


def filesystem_for(url: str, **storage_options: Any) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for a URL or local path: the one entry point to storage, for reading
    media here and for writing outputs elsewhere (``fs.open(path, "wb")``). Options and credentials come from
    the filesystem's own environment/config unless given."""
    import fsspec

    return fsspec.core.url_to_fs(url, **storage_options)


def with_retries(
    what: str, fn: Callable[[], T], attempts: int | None = None, deadline: Deadline | None = None
) -> T:
    """``fn()`` retried with exponential backoff; a missing object, missing credentials or a refused
    permission is final at once.
    No attempt starts past ``deadline`` (``fn`` bounds its own calls by ``deadline.remaining()``). The last
    error becomes a :class:`MediaError` naming ``what`` (the URL); a timeout says it timed out."""
    attempts = attempts or FETCH_ATTEMPTS
    last: BaseException | None = None
    made = 0
    for attempt in range(attempts):
        if deadline is not None and _expired(deadline):
            break
        made += 1
        try:
            return fn()
        except (MediaError, TypeError, AttributeError, NotImplementedError, ImportError, tarfile.TarError):
            raise  # not a transient failure of the store (a broken tar is broken on every read)
        except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
            refused = _cause(e, PrivateAddressRefused)
            if refused is not None:  # fsspec's HTTP client reports it as "not found"
                raise refused from None
            last = e
            if not _transient(e):
                error = StoreAccessError if isinstance(e, PermissionError) else MediaError
                raise error(f"cannot fetch {what}: {type(e).__name__}: {e}") from None
        except Exception as e:  # network and server errors of any client library
            if (reason := access_error(e)) is not None:  # no retry brings credentials or a permission
                raise StoreAccessError(f"cannot fetch {what}: {reason}") from None
            last = e
        if attempt + 1 < attempts:
            delay = FETCH_BACKOFF_S * 2**attempt
            if deadline is not None:
                delay = min(delay, max(0.0, deadline.end - time.monotonic()))
            time.sleep(delay)
    if _cause(last, TimeoutError) is not None or (deadline is not None and _expired(deadline)):
        limits = deadline.limits() if deadline is not None else ""
        raise MediaError(
            f"cannot fetch {what}: timed out ({made} attempts{_timeout_detail(last)}{limits})"
        ) from None
    raise MediaError(f"cannot fetch {what} after {made} attempts: {type(last).__name__}: {last}") from None


def _transient(e: BaseException) -> bool:
    """Whether a "not found"/"forbidden" error of a client hides a transient cause (fsspec's HTTP client
    reports any failed HEAD as FileNotFoundError): a 5xx or 429 status, or a connection failure."""
    cause = e.__cause__ or e.__context__
    if cause is None:
        return False
    status = getattr(cause, "status", None)
    if isinstance(status, int):
        return status >= 500 or status == 429
    return isinstance(cause, ConnectionError | TimeoutError) or "Connect" in type(cause).__name__


def _timeout_detail(e: BaseException | None) -> str:
    """The most specific message of the timeouts in ``e``'s chain (clients wrap them in message-less ones)."""
    detail = ""
    for x in error_chain(e):
        if isinstance(x, TimeoutError) and str(x):
            detail = f"; {x}"
    return detail


def _expired(deadline: Deadline) -> bool:
    return time.monotonic() >= deadline.end


def _cause(e: BaseException | None, kind: type[BaseException]) -> Any:
    """``e`` or the first exception of ``kind`` in its chain of causes (client libraries wrap errors)."""
    return next((x for x in error_chain(e) if isinstance(x, kind)), None)


@dataclass(frozen=True)
class MediaSource:
    """One media object: a local file, a URL, inline bytes, a tar member, or bytes inside an input record."""

    ref: str  # the reference as the record wrote it (for reasons)
    kind: str  # "file" | "url" | "bytes" | "tar", or a registered scheme's name ("embedded")
    location: str = ""  # file path or URL (of the shard, for "tar"; what a registered scheme parsed)
    member: str = ""  # tar member name, or the pointer inside an input record
    data: bytes | None = None  # inline bytes ("bytes")
    container: MediaSource | None = None  # the tar shard ("tar")
    remote: RemoteSettings = DEFAULT_REMOTE  # how a URL is fetched (timeouts, deadline, private addresses)

    @property
    def suffix(self) -> str:
        """The file extension the reference names (decoders that sniff by name get a spooled copy with it)."""
        if self.kind == "tar":
            return Path(self.member).suffix
        if self.kind == "url":
            return Path(urlsplit(self.location).path).suffix
        return Path(self.location).suffix if self.kind == "file" else ""

    def local_file(self) -> Path | None:
        return Path(self.location) if self.kind == "file" else None

    def open(self) -> IO[bytes]:
        """A seekable binary file. Remote files read lazily in ``PROBE_BLOCK_BYTES`` ranges, so probing an
        image header fetches only its first block(s)."""
        if self.kind == "file":
            try:
                return open(self.location, "rb")
            except OSError as e:
                raise MediaError(f"cannot open {self.location}: {type(e).__name__}: {e}") from None
        if self.kind == "url":
            fs, path = self._filesystem()
            deadline = Deadline(self.remote)

            def ranged() -> IO[bytes]:
                if _is_http(fs):  # the size first, within the deadline (an HTTP open asks for it unbounded)
                    size = fs.info(path, timeout=deadline.remaining())["size"]
                    f = fs.open(path, "rb", block_size=PROBE_BLOCK_BYTES, cache_type="readahead", size=size)
                    return _reads_within(f, deadline)
                try:
                    return fs.open(path, "rb", block_size=PROBE_BLOCK_BYTES, cache_type="readahead")
                except TypeError:  # a filesystem without block options (e.g. msc://): its own buffering
                    return fs.open(path, "rb")

            return with_retries(self.location, ranged, deadline=deadline)
        return io.BytesIO(self.read_bytes())

    def _filesystem(self) -> tuple[Any, str]:
        check_url(self.location, self.remote)
        return filesystem_for(self.location, **fetch_options(self.location, self.remote))

    def read_range(self, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of a URL (all of them by default), retried as a whole within the deadline."""
        fs, path = self._filesystem()
        deadline = Deadline(self.remote)

        def fetch() -> bytes:
            if _bounded(fs):
                return fs.cat_file(path, start=start, end=end, timeout=deadline.remaining())
            return fs.cat_file(path, start=start, end=end)

        return with_retries(self.location, fetch, deadline=deadline)

    def read_bytes(self) -> bytes:
        """All of the object's bytes (remote reads retried as a whole)."""
        if self.kind == "bytes":
            assert self.data is not None
            return self.data
        if self.kind == "file":
            try:
                return Path(self.location).read_bytes()
            except OSError as e:
                raise MediaError(f"cannot read {self.location}: {type(e).__name__}: {e}") from None
        if self.kind == "url":
            return self.read_range()
        if self.kind == "tar":
            assert self.container is not None
            offset, size = _tar_member(self.container, self.member)
            return _read_range(self.container, offset, size)
        scheme = _SCHEMES.get(f"{self.kind}:")
        if scheme is not None:
            return scheme.read(self.location, self.member)
        raise MediaError(f"unknown media source kind {self.kind!r}")

    @contextlib.contextmanager
    def local_path(self) -> Iterator[Path]:
        """A local file with the object's bytes: the file itself, or a temporary copy (decoders that need a
        path, such as decord and libsndfile, read it there)."""
        if self.kind == "file":
            yield Path(self.location)
            return
        data = self.read_bytes()
        with tempfile.NamedTemporaryFile(suffix=self.suffix, prefix="omnipack-media-") as f:
            f.write(data)
            f.flush()
            yield Path(f.name)


def _bounded(fs: Any) -> bool:
    """Whether ``fs``'s calls take a ``timeout`` (fsspec's async filesystems, called from sync code: HTTP,
    S3); others bound their own requests."""
    from fsspec.asyn import AsyncFileSystem

    return isinstance(fs, AsyncFileSystem) and not fs.asynchronous


def _is_http(fs: Any) -> bool:
    from fsspec.implementations.http import HTTPFileSystem

    return isinstance(fs, HTTPFileSystem) and not fs.asynchronous


def _reads_within(f: Any, deadline: Deadline) -> Any:
    """``f`` (an fsspec HTTP file opened for reading) with each ranged read bounded by what is left of
    ``deadline``: probing a file from a server that stalls mid-way ends by the deadline too."""
    from fsspec.implementations.http import HTTPFile

    cache = getattr(f, "cache", None)
    if not isinstance(f, HTTPFile) or not hasattr(cache, "fetcher"):
        return f  # a stream without ranged reads: bounded by the session's timeouts
    fetch = f._fetch_range

    def bounded(start: int, end: int) -> bytes:
        try:
            return fetch(start, end, timeout=deadline.remaining())
        except TimeoutError as e:  # a decoder reading the file would call it unreadable
            raise MediaError(
                f"cannot fetch {f.url}: timed out reading it ({_timeout_detail(e).lstrip('; ') or 'no answer in time'}"
                f"{deadline.limits()})"
            ) from None

    cache.fetcher = bounded
    return f


def _read_range(src: MediaSource, offset: int, size: int) -> bytes:
    if src.kind == "url":
        return src.read_range(offset, offset + size)
    with src.open() as f:
        f.seek(offset)
        data = f.read(size)
    if len(data) != size:
        raise MediaError(f"tar shard {src.ref} is truncated")
    return data


_tar_indices: OrderedDict[tuple[str, str], dict[str, tuple[int, int]]] = OrderedDict()
_tar_indices_lock = threading.Lock()  # the write stage's row builders read media on several threads


def _tar_member(shard: MediaSource, member: str) -> tuple[int, int]:
    """(data offset, size) of ``member`` in the tar ``shard``; the shard's headers are scanned once per process
    (twice at worst, by two threads at once: the same index)."""
    key = (shard.kind, shard.location)
    with _tar_indices_lock:
        index = _tar_indices.get(key)
        if index is not None:
            _tar_indices.move_to_end(key)
    if index is None:

        def scan() -> dict[str, tuple[int, int]]:
            with shard.open() as f, tarfile.open(fileobj=f, mode="r:") as tar:
                return {m.name: (m.offset_data, m.size) for m in tar if m.isfile()}

        try:
            index = with_retries(shard.ref, scan, deadline=Deadline(shard.remote)) if shard.kind == "url" else scan()
        except tarfile.TarError as e:
            raise MediaError(f"unreadable tar shard {shard.ref}: {e}") from None
        with _tar_indices_lock:
            _tar_indices[key] = index
            while len(_tar_indices) > _TAR_INDEX_CACHE:
                _tar_indices.popitem(last=False)
    if member not in index:
        raise MediaError(f"no member {member!r} in tar shard {shard.ref}")
    return index[member]


def decode_data_uri(ref: str) -> bytes:
    """The bytes of a ``data:[<type>][;base64],<data>`` URI."""
    header, comma, payload = ref.partition(",")
    if not comma:
        raise MediaError("data URI without a comma")
    try:
        if header.endswith(";base64"):
            return base64.b64decode(payload, validate=True)
        return unquote(payload).encode("latin-1")
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"data URI is not valid base64: {e}") from None


def data_uri(data: bytes, mime: str = "application/octet-stream") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(r) for r in roots)


def _local_source(ref: str, path: Path, root: Path, allow_roots: Sequence[str]) -> MediaSource:
    """``path`` (already joined to the root) if it stays inside the root or an allowed root, lexically and
    after following symlinks."""
    allowed = [Path(local_location(a)) for a in allow_roots]  # a file:// URL as its folder
    extra = [Path(os.path.normpath(a.absolute())) for a in allowed]
    lexical_roots = [Path(os.path.normpath(root.absolute())), *extra]
    lexical = Path(os.path.normpath(path.absolute()))
    if not _inside(lexical, lexical_roots):
        raise SourceRefused(
            f"media path escapes the media root: {ref!r} (allow another folder with {ALLOW_ROOT_OPTION})"
        )
    real = lexical.resolve()
    if not _inside(real, [root.resolve(), *(a.resolve() for a in allowed)]):
        raise SourceRefused(
            f"media path {ref!r} is a symlink to {real}, outside the media root; "
            f"allow that folder with {ALLOW_ROOT_OPTION}"
        )
    return MediaSource(ref, "file", str(real))


def resolve_source(
    ref: str,
    media_root: str | Path | None,
    allow_roots: Sequence[str] = (),
    remote: RemoteSettings = DEFAULT_REMOTE,
) -> MediaSource:
    """The :class:`MediaSource` a record's media reference names (see the module docstring for the forms);
    ``remote`` says how a URL is fetched (by default: private addresses refused).

    Raises :class:`SourceRefused` for a reference that leaves the media root (or is relative when there is no
    media root), ``MediaError`` for one that can not be used at all; neither touches the storage (probing
    does)."""
    if ref.startswith("data:"):
        return MediaSource(ref[:40] + ("..." if len(ref) > 40 else ""), "bytes", data=decode_data_uri(ref))
    for scheme in _SCHEMES.values():
        if ref.startswith(scheme.prefix):
            location, member = scheme.parse(ref)
            return MediaSource(ref, scheme.prefix.rstrip(":"), location, member)
    tar = TAR_MEMBER_RE.match(ref)
    if tar:
        shard = resolve_source(tar["shard"], media_root, allow_roots, remote)
        return MediaSource(ref, "tar", shard.location, tar["member"], container=shard)
    if media_root is None:  # no --media-root: URLs, and local files under an allowed root only
        if is_remote(ref):
            return MediaSource(ref, "url", ref, remote=remote)
        local = Path(local_location(ref))
        if not local.is_absolute():
            raise SourceRefused(f"relative media path {ref!r} needs --media-root (none given)")
        if not allow_roots:
            raise SourceRefused(f"local media file {ref!r} needs --media-root or {ALLOW_ROOT_OPTION}")
        return _local_source(ref, local, Path(allow_roots[0]), allow_roots)
    root = local_location(media_root)  # a file:// root is a folder: its symlink checks apply
    if is_url(ref):
        if not is_remote(ref):
            return _local_source(ref, Path(local_location(ref)), Path(root), allow_roots)
        return MediaSource(ref, "url", ref, remote=remote)
    if is_remote(root):  # a remote media root: join, refusing paths that climb out of it
        joined = posixpath.normpath(posixpath.join("/", ref)).lstrip("/")
        if ref.startswith("/") or joined.startswith("..") or posixpath.normpath(ref).startswith(".."):
            raise SourceRefused(f"media path escapes the media root: {ref!r}")
        return MediaSource(ref, "url", root.rstrip("/") + "/" + joined, remote=remote)
    return _local_source(ref, Path(root) / ref, Path(root), allow_roots)


def as_source(obj: MediaSource | str | os.PathLike | bytes | IO[bytes]) -> MediaSource:
    """Whatever a caller holds (a resolved source, a local path, bytes, an open binary file) as a source."""
    if isinstance(obj, MediaSource):
        return obj
    if isinstance(obj, bytes | bytearray | memoryview):
        return MediaSource("<bytes>", "bytes", data=bytes(obj))
    if isinstance(obj, str | os.PathLike):
        return MediaSource(str(obj), "file", str(obj))
    if hasattr(obj, "read"):
        obj.seek(0)
        return MediaSource("<file>", "bytes", data=obj.read())
    raise TypeError(f"not a media source: {type(obj).__name__}")


def probe_locations(locations: Iterable[tuple[str, str | os.PathLike | None]]) -> None:
    """One cheap request (``info``: a HEAD, then a one-key listing) to each remote location, as ``(what it is,
    location)`` pairs; local and unset locations are skipped. Raises ``StoreAccessError`` naming the first
    location whose store refuses this run's credentials; any other outcome (a missing prefix included) is
    left to the run."""
    for what, location in locations:
        if location is None or not is_remote(location):
            continue
        url = str(location)
        try:
            fs, path = filesystem_for(url)
            fs.info(path.rstrip("/"))
        except Exception as e:  # noqa: BLE001 - only an access failure stops the run here
            reason = access_error(e)
            if reason is not None:
                raise StoreAccessError(f"{what} {url}: {reason}; {CREDENTIALS_HINT}") from None
