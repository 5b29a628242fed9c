"""Authentication and permission failures of stores (S3 and other fsspec filesystems).

They are told apart from transient failures so that nothing retries them (a missing credential stays missing),
and a run probes every remote location it will use before any work (``sources.probe_locations``): a run
without credentials, with unknown keys or without permission stops at once with one line naming the location."""

from __future__ import annotations

from collections.abc import Iterable

from .errors import MediaError

# Client errors that mean "who you are" or "what you may do" failed, by class name (botocore, google-auth)
# so that no client library has to be imported to recognise them.
AUTH_ERROR_CLASSES = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "NoAuthTokenError",
        "DefaultCredentialsError",
        "RefreshError",
    }
)
# Error codes of S3-compatible stores (botocore ``ClientError.response["Error"]["Code"]``).
AUTH_ERROR_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
        "401",
        "403",
        "Forbidden",
        "Unauthorized",
    }
)
CREDENTIALS_HINT = (
    "credentials come from the store client's own environment and config (AWS_ACCESS_KEY_ID / "
    "AWS_SECRET_ACCESS_KEY / AWS_PROFILE, ~/.aws, AWS_ENDPOINT_URL for other S3-compatible stores)"
)


class StoreAccessError(MediaError):
    """A store refused this run's credentials: none were found, they are unknown, or they lack a permission."""


def error_chain(e: BaseException | None) -> Iterable[BaseException]:
    """``e`` and the errors it was raised from or during (client libraries wrap errors), each once."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen and len(seen) < 16:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def access_error(e: BaseException) -> str | None:
    """Why ``e`` (or an error it was raised from) is an authentication or permission failure; None when it
    is not one (a missing object, a network or server error)."""
    chain = list(error_chain(e))
    for x in chain:  # the client's own error first: it names the code
        names = {c.__name__ for c in type(x).__mro__}
        if names & AUTH_ERROR_CLASSES:
            return f"no usable credentials ({type(x).__name__}: {x})"
        code = str(((getattr(x, "response", None) or {}).get("Error") or {}).get("Code", ""))
        if code in AUTH_ERROR_CODES:
            return f"access refused ({code}: {x})"
        if any(n in str(x) for n in AUTH_ERROR_CLASSES):  # multi-storage-client's RuntimeError names it
            return f"no usable credentials ({x})"
        if getattr(x, "status", None) in (401, 403):  # an HTTP client's response error (aiohttp)
            return f"access refused (HTTP {x.status}: {x})"
    if any(isinstance(x, PermissionError) for x in chain):
        return f"access refused ({type(e).__name__}: {e})"
    return None
