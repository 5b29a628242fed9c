"""Credentials and permissions of object stores: a run whose output, input or media root it may not use stops
before any work with one line naming the location (a probe at the start), and an authentication or
permission failure is never retried. Against moto's S3 server: no credentials at all, keys the server does not
know (moto's authentication switched on) and a known user without any permission (AccessDenied)."""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from omnipack.cli import main  # noqa: E402
from omnipack.media.access import StoreAccessError, access_error  # noqa: E402
from omnipack.media.remote import RemoteSettings  # noqa: E402
from omnipack.media.sources import (  # noqa: E402
    MediaSource,
    probe_locations,
    with_retries,
)
from tests.s3_server import S3Server  # noqa: E402
from tests.stage_outputs import cli_args, demo_config  # noqa: E402

BUCKET = "omnipack-auth"
# Well below one retry schedule (0.25 + 0.5 + 1 s of backoff per object) and far below one per sample.
FAST_S = 5.0


@pytest.fixture(scope="module")
def s3(demo_corpus):
    import boto3
    import fsspec

    manifest, media = demo_corpus
    with S3Server() as server:
        server.bucket(BUCKET)
        fs = fsspec.filesystem("s3")
        fs.put(str(media), f"{BUCKET}/media", recursive=True)
        fs.put(str(manifest), f"{BUCKET}/in/manifest.jsonl")
        iam = boto3.client("iam", endpoint_url=server.url)
        iam.create_user(UserName="no-permissions")
        server.denied_key = iam.create_access_key(UserName="no-permissions")["AccessKey"]
        yield server


def _clear_clients() -> None:
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def no_credentials(s3, monkeypatch, tmp_path):
    """Nothing for the client to find: no keys in the environment, no ~/.aws files, no instance metadata."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    _clear_clients()
    yield
    _clear_clients()


@pytest.fixture
def unknown_keys(s3, monkeypatch):
    """moto checks signatures from now on: the fixture's "testing" keys are unknown to it (InvalidAccessKeyId)."""
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    _clear_clients()
    yield
    _clear_clients()


@pytest.fixture
def no_permission(unknown_keys, s3, monkeypatch):
    """A user the server knows, with no policy: every request is AccessDenied."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.denied_key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.denied_key["SecretAccessKey"])
    _clear_clients()


def _prepare(capsys, cfg) -> tuple[int, list[str], float]:
    t = time.monotonic()
    rc = main(cli_args(cfg))
    elapsed = time.monotonic() - t
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return rc, err, elapsed


def test_s3_output_without_credentials_stops_in_one_line(
    no_credentials, capsys, demo_tokenizer, demo_corpus
):
    url = f"s3://{BUCKET}/out/nocreds"
    rc, err, elapsed = _prepare(capsys, demo_config(url, demo_tokenizer, demo_corpus))
    assert rc == 2 and len(err) == 1, err
    assert f"output {url}: no usable credentials (NoCredentialsError" in err[0]
    assert "AWS_ACCESS_KEY_ID" in err[0] and "Traceback" not in err[0]
    assert elapsed < FAST_S


def test_s3_media_root_with_unknown_keys_stops_before_any_work(
    unknown_keys, capsys, tmp_path, demo_tokenizer, demo_corpus
):
    out = tmp_path / "out"
    cfg = demo_config(out, demo_tokenizer, demo_corpus)
    cfg.media_root = f"s3://{BUCKET}/media"
    rc, err, elapsed = _prepare(capsys, cfg)
    assert rc == 2 and len(err) == 1, err
    assert f"media root s3://{BUCKET}/media: access refused (403: " in err[0]
    assert elapsed < FAST_S
    assert not out.exists()  # nothing measured, nothing written


def test_s3_input_without_permission_stops_before_any_work(
    no_permission, capsys, tmp_path, demo_tokenizer, demo_corpus
):
    out = tmp_path / "out"
    cfg = demo_config(out, demo_tokenizer, demo_corpus)
    cfg.manifest = [f"s3://{BUCKET}/in/manifest.jsonl"]
    rc, err, elapsed = _prepare(capsys, cfg)
    assert rc == 2 and len(err) == 1, err
    assert f"input s3://{BUCKET}/in/manifest.jsonl: access refused (403: " in err[0]
    assert elapsed < FAST_S and not out.exists()


def test_probe_passes_with_credentials_and_ignores_local_and_missing_locations(s3, tmp_path):
    probe_locations(
        [
            ("media root", f"s3://{BUCKET}/media"),
            ("output", f"s3://{BUCKET}/not/there/yet"),  # an output prefix is created by the run
            ("input", str(tmp_path)),
            ("media root", None),
        ]
    )


def test_access_errors_are_never_retried(unknown_keys, monkeypatch):
    calls = []
    backoffs: list[float] = []  # the retry loop's sleeps (other threads' sleeps are not counted)
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        if sys._getframe(1).f_globals.get("__name__") == "omnipack.media.sources":
            backoffs.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)

    def refused() -> bytes:
        from botocore.exceptions import NoCredentialsError

        calls.append(1)
        raise NoCredentialsError()

    with pytest.raises(StoreAccessError, match="no usable credentials"):
        with_retries("s3://b/k", refused)
    assert len(calls) == 1
    assert backoffs == []
    # a real refused fetch: one request, no backoff (four attempts would sleep three times)
    with pytest.raises(StoreAccessError, match="Forbidden"):
        MediaSource("x", "url", f"s3://{BUCKET}/media/img1.png").read_bytes()
    assert backoffs == []
    # a transient failure is still retried
    flaky = iter([ConnectionError("reset"), b"ok"])

    def once_flaky() -> bytes:
        item = next(flaky)
        if isinstance(item, Exception):
            raise item
        return item

    assert with_retries("s3://b/k", once_flaky) == b"ok"
    assert len(backoffs) == 1  # the counter sees the retry loop's backoff
    assert access_error(ConnectionError("reset")) is None


def test_an_http_403_is_final_at_once(tmp_path):
    import http.server
    import threading

    requests = []

    class Forbidden(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            requests.append(self.path)
            self.send_error(403, "Forbidden")

        do_GET = do_HEAD

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/media"
    try:
        # a location that is a file (an input) is probed; a run leaves an HTTP media root folder alone
        with pytest.raises(StoreAccessError, match=rf"input {url}/a.jsonl: access refused \(HTTP 403"):
            probe_locations([("input", f"{url}/a.jsonl")])
        requests.clear()
        with pytest.raises(StoreAccessError, match="403"):
            MediaSource("x", "url", f"{url}/a.jpg", remote=RemoteSettings(allow_private_urls=True)).read_bytes()
        assert len(requests) == 1  # not retried
    finally:
        server.shutdown()
