"""Shared pieces of the input/media-source tests: small JPEGs, a prepare run, the images a dataset holds."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from omnipack.dataset.codec import decode_row
from omnipack.loader.media import decode_payload
from omnipack.media.image import load_image
from omnipack.pipeline import PrepareConfig, run_prepare

from .s3_server import S3Server  # noqa: F401  (the input tests take it from here)

SEQ_LENGTH = 1024


def jpeg_bytes(seed: int, height: int = 56, width: int = 84) -> bytes:
    """A small JPEG with content that differs per seed."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(1, 1, 3))
    pixels = np.clip(base + rng.integers(-40, 40, size=(height, width, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_images(folder: Path, n: int, prefix: str = "img") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"{prefix}{i}.jpg"
        p.write_bytes(jpeg_bytes(i))
        paths.append(p)
    return paths


def write_tar(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def omnipack_record(sid: str, refs: list[str]) -> dict:
    """An omnipack manifest record asking about the images ``refs``."""
    parts = [{"type": "image", "image": r} for r in refs]
    return {
        "id": sid,
        "messages": [
            {"role": "user", "content": [*parts, {"type": "text", "text": f"What is in {sid}?"}]},
            {"role": "assistant", "content": f"{sid} shows coloured noise."},
        ],
    }


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def prepare(out: Path, tokenizer: Path, inputs: list[Path | str], media_root: Path | str | None, **kw) -> dict:
    cfg = PrepareConfig(
        manifest=[str(p) for p in inputs],
        media_root=None if media_root is None else str(media_root),
        tokenizer=str(tokenizer),
        output=str(out),
        seq_length=kw.pop("seq_length", SEQ_LENGTH),
        max_samples_per_row=1,  # one sample per row: a row's media are that sample's
        progress=False,
        **kw,
    )
    return run_prepare(cfg)


def written_images(root: Path) -> dict[str, list[np.ndarray]]:
    """sample id -> its images as the dataset stores them (decoded from the tar shards)."""
    rows: dict[str, dict[str, bytes]] = {}
    for tar_path in sorted((root / "shards").rglob("*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, part = m.name.split(".", 1)
                rows.setdefault(key, {})[part] = tf.extractfile(m).read()
    out = {}
    for parts in rows.values():
        row, meta = decode_row(parts)
        (sid,) = json.loads(parts["meta.json"])["sample_ids"]
        out[sid] = [(decode_payload(m.part, parts[m.part]), tuple(m.info["target_hw"])) for m in row.media]
    return out


def assert_images_match(root: Path, expected: dict[str, list[bytes]]) -> None:
    """Each packed sample's stored images are its source JPEGs decoded and resized as the plan says."""
    got = written_images(root)
    assert set(got) == set(expected)
    for sid, sources in expected.items():
        assert len(got[sid]) == len(sources), sid
        for (pixels, target_hw), data in zip(got[sid], sources, strict=True):
            assert np.array_equal(pixels, load_image(io.BytesIO(data), target_hw)), sid


def rejects(root: Path) -> dict[str, dict]:
    return {r["sample_id"]: r for r in map(json.loads, (root / "rejects.jsonl").read_text().splitlines())}


class FileServer:
    """A local HTTP server (127.0.0.1, a free port) serving ``root`` with byte ranges, counting the bytes
    it sends per path, and failing requests on demand: ``fail[path] = n`` answers the next n requests for
    ``path`` with 503 (n < 0: always); ``redirect[path] = url`` answers requests for ``path`` with a 302 to
    ``url``."""

    def __init__(self, root: Path) -> None:
        import http.server
        import threading

        self.root = root
        self.sent: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self.fail: dict[str, int] = {}
        self.redirect: dict[str, str] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _serve(self, body: bool) -> None:
                path = self.path.split("?", 1)[0]
                server.requests[path] = server.requests.get(path, 0) + 1
                n = server.fail.get(path, 0)
                if n:
                    server.fail[path] = n - 1 if n > 0 else n
                    self.send_error(503, "try again")
                    return
                if path in server.redirect:
                    self.send_response(302)
                    self.send_header("Location", server.redirect[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                f = server.root / path.lstrip("/")
                if not f.is_file():
                    self.send_error(404, "not found")
                    return
                data = f.read_bytes()
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    lo_s, _, hi_s = rng[6:].partition("-")
                    lo = int(lo_s)
                    hi = min(int(hi_s) if hi_s else len(data) - 1, len(data) - 1)
                    chunk = data[lo : hi + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
                else:
                    chunk = data
                    self.send_response(200)
                self.send_header("Content-Length", str(len(chunk)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if body:  # counted before sending: the client may check the count as soon as it has the bytes
                    server.sent[path] = server.sent.get(path, 0) + len(chunk)
                    self.wfile.write(chunk)

            def do_GET(self) -> None:
                self._serve(True)

            def do_HEAD(self) -> None:
                self._serve(False)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class StallingServer:
    """A local TCP server (127.0.0.1) that accepts connections and never answers (``trickle_s=None``), or
    answers any request with a 200 of ``size`` bytes sent one byte every ``trickle_s`` seconds (a server
    that never goes quiet long enough for a read timeout). Counts the connections it accepted."""

    def __init__(self, trickle_s: float | None = None, size: int = 1 << 20) -> None:
        import socket
        import threading

        self.trickle_s, self.size = trickle_s, size
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self._held: list = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        import threading

        self.sock.settimeout(0.05)  # a closed listening socket does not wake accept(): look at stop instead
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._held.append(conn)
            if self.trickle_s is not None:
                t = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
                t.start()
                self.threads.append(t)

    def _trickle(self, conn) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {self.size}\r\nAccept-Ranges: bytes\r\n\r\n".encode()
        try:
            while (request := conn.recv(65536)).startswith(b"HEAD"):  # the size, then the next request
                conn.sendall(head)
            if not request:
                return
            conn.sendall(head)
            for _ in range(self.size):
                if self.stop.wait(self.trickle_s):
                    return
                conn.sendall(b"\xff")
        except OSError:
            return

    def __enter__(self) -> StallingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()
        for t in self.threads:
            t.join()
        for conn in self._held:
            conn.close()


