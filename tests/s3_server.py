"""moto's standalone S3-compatible server on 127.0.0.1 (a real HTTP server, not a mock of the client), with
the standard AWS environment pointing at it: every client (s3fs, boto3, multi-storage-client, and so
Energon) reads its endpoint and credentials from there, as it would for a real store."""

from __future__ import annotations

import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = pytest.MonkeyPatch()

    def __enter__(self) -> S3Server:
        import logging

        import s3fs
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        for k, v in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
        }.items():
            self.env.setenv(k, v)
        s3fs.S3FileSystem.clear_instance_cache()
        return self

    def bucket(self, name: str) -> str:
        import fsspec

        fsspec.filesystem("s3").mkdir(name)
        return name

    def __exit__(self, *exc) -> None:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        self.server.stop()
        self.env.undo()
