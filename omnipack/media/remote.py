"""How media is fetched from remote stores: timeouts, a deadline per URL, and the private-address guard.

A record is untrusted input: an ``http(s)://`` reference, or a redirect its server answers with, may point
at this machine, the cloud metadata service (169.254.169.254) or the cluster's private network. Every HTTP
connection's address is checked before anything is sent to it: an IP literal as written, a host name after
DNS resolution (the addresses the connection will use), on the first request and after every redirect.
Loopback, link-local, private and other non-global addresses are refused unless the run allows them
(``--allow-private-urls``, or ``--allow-private-host HOST[:PORT]`` for named hosts); the refusal names the
URL that led there.

A server that accepts a connection and never answers costs at most the connect timeout (no connection),
the read timeout (no bytes arriving), and never more than ``deadline_s`` for one URL over all its attempts.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import MediaError

ALLOW_PRIVATE_OPTION = "--allow-private-urls"
ALLOW_PRIVATE_HOST_OPTION = "--allow-private-host"
DEADLINE_OPTION = "--http-deadline"


@dataclass(frozen=True)
class RemoteSettings:
    """Plain data (it crosses to workers): how remote media is fetched."""

    connect_timeout_s: float = 10.0  # TCP (and TLS) connection to the server
    read_timeout_s: float = 30.0  # the longest wait for the next bytes of an answer
    deadline_s: float = 120.0  # one URL's fetch, all attempts and backoff included
    allow_private_urls: bool = False  # fetch from loopback, link-local and private addresses too
    allow_private_hosts: tuple[str, ...] = ()  # "host" or "host:port" (as URLs write it) allowed anyway

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s", "deadline_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def access(self) -> dict[str, Any]:
        """What of these settings decides which URLs are fetched at all (run keys hold this, not timeouts)."""
        return {"allow_private_urls": self.allow_private_urls, "allow_private_hosts": list(self.allow_private_hosts)}

    def host_allowed(self, host: str, port: int | None) -> bool:
        """Whether a URL's host may be private: all are with ``allow_private_urls``, else the listed ones."""
        if self.allow_private_urls:
            return True
        host = host.lower().strip("[]")
        return any(a.lower() in (host, f"{host}:{port}") for a in self.allow_private_hosts)


DEFAULT_REMOTE = RemoteSettings()


class PrivateAddressRefused(MediaError):
    """A media URL (or a redirect target) leads to an address the run may not reach; never retried."""


class _RefusedAddress(Exception):
    """Raised inside the HTTP client where only the host is known; re-raised naming the URL."""

    def __init__(self, host: str, address: str, kind: str) -> None:
        super().__init__(host, address, kind)
        self.host, self.address, self.kind = host, address, kind


def address_kind(address: str) -> str | None:
    """Why ``address`` (an IP) may not be fetched from ("loopback", "link-local", "private", ...), or None
    for a global address. IPv4 addresses mapped into IPv6 are judged as IPv4."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "private", "unspecified", "multicast", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if ip.is_global else "non-global"


def _refusal(url: str, e: _RefusedAddress) -> PrivateAddressRefused:
    via = "" if e.host == e.address else f" ({e.host} resolves to {e.address})"
    return PrivateAddressRefused(
        f"refused to fetch {url}: a {e.kind} address{via}; allow it with {ALLOW_PRIVATE_OPTION} "
        f"or {ALLOW_PRIVATE_HOST_OPTION}"
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


async def _guarded_client(settings: RemoteSettings, **kwargs: Any) -> Any:
    """fsspec's ``get_client``: an aiohttp session with the run's timeouts, whose connections are checked
    against the private-address rules before they are made."""
    import aiohttp
    from aiohttp.resolver import DefaultResolver

    class GuardedResolver(DefaultResolver):  # type: ignore[misc, valid-type]
        """The addresses a host name resolves to, refused when any is private: checked on the very addresses
        the connection will use, so a name can not resolve one way for the check and another to connect."""

        async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[dict[str, Any]]:
            hosts = await super().resolve(host, port, family)
            if not settings.host_allowed(host, port):
                for h in hosts:
                    kind = address_kind(h["host"])
                    if kind is not None:
                        raise _RefusedAddress(host, h["host"], kind)
            return hosts

    class GuardedConnector(aiohttp.TCPConnector):
        """Checks each request's URL (the first one and every redirect target) before connecting: an IP
        literal here (the resolver never sees one), a host name by the resolver."""

        async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
            host = req.url.raw_host or ""
            if _is_ip(host) and not settings.host_allowed(host, req.url.port):
                kind = address_kind(host.strip("[]"))
                if kind is not None:
                    raise _refusal(str(req.url), _RefusedAddress(host, host, kind))
            try:
                return await super().connect(req, traces, timeout)
            except _RefusedAddress as e:
                raise _refusal(str(req.url), e) from None

    timeout = aiohttp.ClientTimeout(
        total=settings.deadline_s,
        connect=settings.connect_timeout_s,
        sock_connect=settings.connect_timeout_s,
        sock_read=settings.read_timeout_s,
    )
    if settings.allow_private_urls:
        return aiohttp.ClientSession(timeout=timeout, **kwargs)
    connector = GuardedConnector(resolver=GuardedResolver())
    return aiohttp.ClientSession(timeout=timeout, connector=connector, **kwargs)


def check_url(url: str, settings: RemoteSettings) -> None:
    """Refuse an HTTP(S) URL whose host is a private IP literal at once (host names are checked on their
    resolved addresses when connecting, as are redirect targets)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or not _is_ip(parts.hostname):
        return
    if settings.host_allowed(parts.hostname, parts.port or (443 if parts.scheme.lower() == "https" else 80)):
        return
    kind = address_kind(parts.hostname)
    if kind is not None:
        raise _refusal(url, _RefusedAddress(parts.hostname, parts.hostname, kind))


def fetch_options(url: str, settings: RemoteSettings) -> dict[str, Any]:
    """Storage options for fetching ``url`` with ``settings`` (HTTP(S): the guarded, timed client; S3: the
    timeouts)."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("http", "https"):
        return {"get_client": functools.partial(_guarded_client, settings)}
    if scheme in ("s3", "s3a"):  # botocore's own timeouts (its defaults: 60 s each)
        return {"config_kwargs": {"connect_timeout": settings.connect_timeout_s, "read_timeout": settings.read_timeout_s}}
    return {}


class Deadline:
    """The time left to fetch one URL (over all its attempts) under ``settings``."""

    def __init__(self, settings: RemoteSettings) -> None:
        self.settings = settings
        self.seconds = settings.deadline_s
        self.end = time.monotonic() + self.seconds

    def limits(self) -> str:
        """The limits that apply, for a reject reason (how to change them included)."""
        s = self.settings
        return (
            f"; limits: connect {s.connect_timeout_s:g} s (--http-connect-timeout), read {s.read_timeout_s:g} s "
            f"(--http-read-timeout), {s.deadline_s:g} s per URL ({DEADLINE_OPTION})"
        )

    def remaining(self) -> float:
        """Seconds left; ``TimeoutError`` when none are."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within the {self.seconds:g} s deadline ({DEADLINE_OPTION})")
        return left
