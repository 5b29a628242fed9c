"""The media source resolver: every reference form, ranged probing, retries, and the root/symlink rules."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnipack.media import sources
from omnipack.media.errors import MediaError
from omnipack.media.image import load_image
from omnipack.media.probe import materialize, probe
from omnipack.media.remote import RemoteSettings
from omnipack.media.sources import SourceRefused, data_uri, filesystem_for, resolve_source
from omnipack.profiles import get_profile

from .inputs_helpers import FileServer, S3Server, StallingServer, jpeg_bytes, write_tar

# The test servers listen on 127.0.0.1, a loopback address that media URLs may reach only when allowed.
LOOPBACK = RemoteSettings(allow_private_urls=True)


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(sources, "FETCH_BACKOFF_S", 0.01)


def _big_jpeg(path):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (1200, 1600, 3), dtype=np.uint8)).save(path, quality=95)
    return path.read_bytes()


def _stored_image(src, size_hw):
    """What the write stage stores for ``src``: the decoded, resized pixels."""
    meta = probe(src, "image")
    plan = get_profile("qwen2_5_vl").plan(meta)
    _, data = materialize(src, plan)
    return meta, np.load(io.BytesIO(data)), plan.target_hw


def test_relative_paths_stay_in_the_root_and_symlinks_out_need_an_allowed_root(tmp_path):
    root, outside = tmp_path / "media", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (outside / "x.jpg").write_bytes(jpeg_bytes(1))
    (root / "link.jpg").symlink_to(outside / "x.jpg")
    (root / "in.jpg").write_bytes(jpeg_bytes(2))
    assert resolve_source("in.jpg", root).location == str((root / "in.jpg").resolve())
    for ref in ("../elsewhere/x.jpg", "a/../../elsewhere/x.jpg", "/etc/passwd", f"file://{outside / 'x.jpg'}"):
        with pytest.raises(SourceRefused, match="escapes the media root"):
            resolve_source(ref, root)
    with pytest.raises(SourceRefused, match="is a symlink to .*outside the media root.*--media-allow-root"):
        resolve_source("link.jpg", root)
    allowed = resolve_source("link.jpg", root, allow_roots=[str(outside)])
    assert probe(allowed, "image").width == 84
    # an allowed root given as a file:// URL is that folder (not a relative path named "file:")
    assert resolve_source("link.jpg", root, allow_roots=[f"file://{outside}"]) == allowed
    assert resolve_source(f"file://{root / 'in.jpg'}", root).kind == "file"
    # a file:// media root is the same folder, with the same checks
    file_root = f"file://{root}"
    assert resolve_source("in.jpg", file_root).location == str((root / "in.jpg").resolve())
    with pytest.raises(SourceRefused, match="is a symlink to .*outside the media root"):
        resolve_source("link.jpg", file_root)
    with pytest.raises(SourceRefused, match="escapes the media root"):
        resolve_source("../elsewhere/x.jpg", file_root)


def test_a_record_may_not_write_an_embedded_pointer_to_another_file(tmp_path):
    """``embedded:`` pointers are written by the Parquet/Arrow readers into their own records; one written in
    a JSONL record would read another table's bytes past the media root: rejected with its reason."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from omnipack.inputs.embedded import pointer_ref
    from omnipack.manifest import read_manifest

    other = tmp_path / "secret.parquet"
    pq.write_table(pa.table({"image": [{"bytes": jpeg_bytes(3), "path": None}]}), other)
    forged = pointer_ref(other, 0, ("image", "bytes"))
    manifest = tmp_path / "m.jsonl"
    msgs = [
        {"role": "user", "content": [{"type": "image", "image": forged}]},
        {"role": "assistant", "content": "x"},
    ]
    ok = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    manifest.write_text(
        "".join(json.dumps(r) + "\n" for r in ({"id": "a", "messages": msgs}, {"id": "b", "messages": ok}))
    )
    forged_sample, good = read_manifest([manifest])
    assert forged_sample.record is None and "may not be written in a record" in forged_sample.error
    assert good.record is not None and good.error is None


def test_data_uris_and_in_memory_bytes_probe_and_materialise_like_the_file(tmp_path):
    data = jpeg_bytes(3)
    (tmp_path / "a.jpg").write_bytes(data)
    ref_meta, ref_pixels, hw = _stored_image(tmp_path / "a.jpg", None)
    for src in (resolve_source(data_uri(data, "image/jpeg"), tmp_path), data, io.BytesIO(data)):
        meta, pixels, _ = _stored_image(src, None)
        assert meta == ref_meta and np.array_equal(pixels, ref_pixels)
    with pytest.raises(MediaError, match="not valid base64"):
        resolve_source("data:image/jpeg;base64,@@@", tmp_path)


def test_tar_shard_members(tmp_path):
    write_tar(tmp_path / "shards" / "s0.tar", {"000.jpg": jpeg_bytes(4), "001.jpg": jpeg_bytes(5)})
    src = resolve_source("shards/s0.tar#001.jpg", tmp_path)
    assert src.kind == "tar" and src.read_bytes() == jpeg_bytes(5)
    assert probe(src, "image").height == 56
    with pytest.raises(MediaError, match="no member '002.jpg' in tar shard shards/s0.tar"):
        probe(resolve_source("shards/s0.tar#002.jpg", tmp_path), "image")
    with pytest.raises(SourceRefused, match="escapes the media root"):
        resolve_source("../s0.tar#000.jpg", tmp_path)


def test_a_broken_remote_tar_shard_is_rejected_at_once_not_retried(tmp_path, monkeypatch):
    """A tar that does not parse is broken on every read: its reason says so, with no backoff rounds."""
    (tmp_path / "bad.tar").write_bytes(b"not a tar" * 200)
    monkeypatch.setattr(sources, "FETCH_BACKOFF_S", 5.0)  # a retry would show as seconds
    with FileServer(tmp_path) as server:
        src = resolve_source(f"{server.url}/bad.tar#000.jpg", tmp_path, remote=LOOPBACK)
        with pytest.raises(MediaError, match="unreadable tar shard"):
            src.read_bytes()
        assert server.requests["/bad.tar"] <= 3  # one scan (its ranged reads), not FETCH_ATTEMPTS of them


def test_http_probe_reads_only_the_header_with_ranged_reads(tmp_path):
    data = _big_jpeg(tmp_path / "big.jpg")
    with FileServer(tmp_path) as server:
        src = resolve_source(f"{server.url}/big.jpg", tmp_path, remote=LOOPBACK)
        meta = probe(src, "image")
        assert (meta.width, meta.height) == (1600, 1200)
        assert server.sent["/big.jpg"] < len(data) // 4  # the header's blocks, not the file
        plan = get_profile("qwen2_5_vl").plan(meta)
        _, stored = materialize(src, plan)
        assert np.array_equal(np.load(io.BytesIO(stored)), load_image(tmp_path / "big.jpg", plan.target_hw))


def test_http_fetches_retry_then_reject_with_the_url(tmp_path):
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(6))
    with FileServer(tmp_path) as server:
        server.fail["/a.jpg"] = 2  # two 503s, then the file
        assert resolve_source(f"{server.url}/a.jpg", tmp_path, remote=LOOPBACK).read_bytes() == jpeg_bytes(6)
        server.fail["/a.jpg"] = -1  # always failing
        before = server.requests["/a.jpg"]
        with pytest.raises(MediaError, match=rf"cannot fetch {server.url}/a.jpg after 4 attempts"):
            probe(resolve_source(f"{server.url}/a.jpg", tmp_path, remote=LOOPBACK), "image")
        assert server.requests["/a.jpg"] - before >= 4
        with pytest.raises(MediaError, match=rf"cannot fetch {server.url}/gone.jpg: FileNotFoundError"):
            probe(resolve_source(f"{server.url}/gone.jpg", tmp_path, remote=LOOPBACK), "image")
        assert server.requests["/gone.jpg"] <= 2  # one attempt (the client's HEAD, then GET): not retried


def _ends_within(seconds, fn):
    """``fn()``'s exception, asserting it came within ``seconds`` (run in a thread, so that a fetch that
    would hang fails the test instead of holding it)."""
    import threading
    import time

    box = {}

    def run():
        t0 = time.monotonic()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
        box["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert "seconds" in box, f"still fetching after {seconds} s"
    return box.get("error"), box["seconds"]


def test_a_server_that_never_answers_is_rejected_as_a_timeout_within_the_deadline(tmp_path):
    """A server that accepts the connection and never answers: the read timeout ends each attempt, the
    deadline ends the retries, and the reason says it timed out (not "FileNotFoundError")."""
    remote = RemoteSettings(read_timeout_s=0.15, deadline_s=1.0, allow_private_urls=True)  # 2 attempts fit
    with StallingServer() as server:
        for fetch in (
            lambda: resolve_source(f"{server.url}/a.jpg", tmp_path, remote=remote).read_bytes(),
            lambda: probe(resolve_source(f"{server.url}/a.jpg", tmp_path, remote=remote), "image"),
        ):
            before = server.connections
            error, seconds = _ends_within(20, fetch)
            assert server.connections - before >= 2  # the deadline left time to retry
            assert isinstance(error, MediaError), error
            assert f"cannot fetch {server.url}/a.jpg: timed out" in str(error)
            assert "--http-read-timeout" in str(error) and "FileNotFoundError" not in str(error)
            assert seconds < 1.0 + 1.0


def test_a_server_that_trickles_bytes_is_cut_off_by_the_deadline(tmp_path):
    """A byte every 0.05 s never trips a 0.5 s read timeout: the deadline per URL bounds the whole fetch, for
    a whole read and for a probe's ranged reads."""
    remote = RemoteSettings(read_timeout_s=0.5, deadline_s=0.75, allow_private_urls=True)
    with StallingServer(trickle_s=0.05) as server:
        for fetch in (
            lambda: resolve_source(f"{server.url}/a.jpg", tmp_path, remote=remote).read_bytes(),
            lambda: probe(resolve_source(f"{server.url}/a.jpg", tmp_path, remote=remote), "image"),
        ):
            error, seconds = _ends_within(20, fetch)
            assert isinstance(error, MediaError) and f"cannot fetch {server.url}/a.jpg: timed out" in str(error)
            assert seconds < 0.75 + 1.0


@pytest.fixture
def no_connections(monkeypatch):
    """Every socket connection this process tries, recorded and refused (nothing leaves the machine)."""
    import socket

    tried = []

    def refuse(self, address):
        tried.append(address)
        raise ConnectionRefusedError(f"test: no connection to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return tried


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://169.254.169.254/latest/meta-data/iam", "link-local"),
        ("http://127.0.0.1:9/a.jpg", "loopback"),
        ("http://[::1]:9/a.jpg", "loopback"),
        ("https://10.1.2.3/a.jpg", "private"),
        ("http://[::ffff:192.168.0.7]/a.jpg", "private"),
        ("http://localhost:9/a.jpg", "loopback"),  # a name: refused on the address it resolves to
    ],
)
def test_private_addresses_are_refused_before_any_connection(tmp_path, no_connections, url, kind, monkeypatch):
    monkeypatch.setattr(sources, "FETCH_BACKOFF_S", 5.0)  # a retry would show as seconds
    for fetch in (lambda: resolve_source(url, tmp_path).read_bytes(), lambda: probe(resolve_source(url, tmp_path), "image")):
        error, seconds = _ends_within(20, fetch)
        assert isinstance(error, MediaError), error
        assert f"refused to fetch {url}: a {kind} address" in str(error) and "--allow-private-urls" in str(error)
        assert seconds < 2.0  # final: not retried
    assert no_connections == []


def test_redirects_to_private_addresses_are_refused_naming_the_target(tmp_path):
    """The first server (loopback, allowed by host:port) redirects to a second loopback server that is not
    allowed: the redirect target is checked before it is connected to, as an IP literal and as a host name
    resolved to loopback; the reject names the target. With the target allowed too, the same redirect is
    followed and fetched: the refusal comes from the check, not from the redirect."""
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(6))
    with FileServer(tmp_path) as first, FileServer(tmp_path) as target:
        first_host = first.url.removeprefix("http://")
        port = target.url.rsplit(":", 1)[1]
        only_first = RemoteSettings(allow_private_hosts=(first_host,))
        for i, to in enumerate((f"{target.url}/a.jpg", f"http://localhost:{port}/a.jpg")):
            first.redirect[f"/r{i}.jpg"] = to
            src = resolve_source(f"{first.url}/r{i}.jpg", tmp_path, remote=only_first)
            for fetch in (src.read_bytes, lambda s=src: probe(s, "image")):
                with pytest.raises(MediaError, match=rf"refused to fetch {to}: a loopback address"):
                    fetch()
            assert first.requests[f"/r{i}.jpg"] >= 1 and target.requests == {}
        both = RemoteSettings(allow_private_hosts=(first_host, f"localhost:{port}"))
        assert resolve_source(f"{first.url}/r1.jpg", tmp_path, remote=both).read_bytes() == jpeg_bytes(6)
        assert probe(resolve_source(f"{first.url}/r1.jpg", tmp_path, remote=both), "image").width == 84
        assert target.requests["/a.jpg"] >= 1


def test_http_video_and_a_remote_media_root(tmp_path):
    from omnipack.demo.media import write_video

    write_video(tmp_path / "v.mp4", n=8, fps=4, w=96, h=64)
    local = probe(tmp_path / "v.mp4", "video")
    with FileServer(tmp_path) as server:
        src = resolve_source("v.mp4", server.url, remote=LOOPBACK)  # relative to a URL media root
        assert src.location == f"{server.url}/v.mp4"
        assert probe(src, "video") == local
        with pytest.raises(SourceRefused, match="escapes the media root"):
            resolve_source("../v.mp4", server.url + "/sub")


def test_s3_objects_on_a_local_s3_server(tmp_path):
    with S3Server():
        fs, path = filesystem_for("s3://media-bucket/imgs/a.jpg")
        fs.mkdir("media-bucket")
        with fs.open(path, "wb") as f:  # the same entry point opens remote paths for writing
            f.write(jpeg_bytes(7))
        write_tar(tmp_path / "s.tar", {"k.jpg": jpeg_bytes(8)})
        fs.put(str(tmp_path / "s.tar"), "media-bucket/shards/s.tar")
        (tmp_path / "a.jpg").write_bytes(jpeg_bytes(7))
        ref = _stored_image(tmp_path / "a.jpg", None)
        for src in (
            resolve_source("s3://media-bucket/imgs/a.jpg", tmp_path),
            resolve_source("imgs/a.jpg", "s3://media-bucket"),
        ):
            meta, pixels, _ = _stored_image(src, None)
            assert meta == ref[0] and np.array_equal(pixels, ref[1])
        assert resolve_source("s3://media-bucket/shards/s.tar#k.jpg", tmp_path).read_bytes() == jpeg_bytes(8)
        with pytest.raises(MediaError, match="cannot fetch s3://media-bucket/nope.jpg"):
            probe(resolve_source("s3://media-bucket/nope.jpg", tmp_path), "image")


def test_msc_urls_energons_storage_client(tmp_path, monkeypatch):
    """multi-storage-client profiles (what Energon resolves remote datasets with) through the same resolver."""
    pytest.importorskip("multistorageclient")
    base = tmp_path / "bucket"
    base.mkdir()
    (base / "a.jpg").write_bytes(jpeg_bytes(9))
    config = tmp_path / "msc.yaml"
    config.write_text(
        f"profiles:\n  media:\n    storage_provider:\n      type: file\n      options:\n        base_path: {base}\n"
    )
    monkeypatch.setenv("MSC_CONFIG", str(config))
    (tmp_path / "ref.jpg").write_bytes(jpeg_bytes(9))
    ref = _stored_image(tmp_path / "ref.jpg", None)
    for src in (resolve_source("msc://media/a.jpg", tmp_path), resolve_source("a.jpg", "msc://media")):
        meta, pixels, _ = _stored_image(src, None)
        assert meta == ref[0] and np.array_equal(pixels, ref[1])


def test_media_root_key_keeps_remote_roots_and_resolves_folders(tmp_path, monkeypatch):
    """Resume keys hold the media root: a remote one must not become a path under the working directory."""
    from omnipack.media.sources import media_root_key

    monkeypatch.chdir(tmp_path)
    assert media_root_key("s3://bucket/media") == "s3://bucket/media"
    assert media_root_key("media") == str(tmp_path / "media")
    assert media_root_key(f"file://{tmp_path}/media") == str(tmp_path / "media")


def test_remote_settings_reach_urls_without_a_media_root():
    """With no --media-root a URL is still fetched with the run's settings (a private host allowed, its
    timeouts), for a plain URL and for a tar shard's member."""
    remote = RemoteSettings(allow_private_urls=True, deadline_s=5)
    for root in (None, "/tmp"):
        assert resolve_source("http://127.0.0.1:9/a.jpg", root, (), remote).remote == remote
        member = resolve_source("http://127.0.0.1:9/s.tar#a.jpg", root, (), remote)
        assert member.container is not None and member.container.remote == remote


@pytest.mark.parametrize("module", ["omnipack.media.sources", "omnipack.stages.measure", "omnipack.stages.write"])
def test_the_embedded_scheme_is_registered_by_the_input_layer(module):
    """media imports nothing of the input layer: ``embedded:`` is registered by ``omnipack.inputs``, and every
    module that resolves references (measure, write) has it in a fresh (worker) process."""
    code = f"import {module}\nfrom omnipack.media.sources import _SCHEMES\nprint(sorted(_SCHEMES))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    want = [] if module == "omnipack.media.sources" else ["embedded:"]
    assert out.stdout.strip() == str(want)

