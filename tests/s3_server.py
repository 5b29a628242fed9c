"""moto's standalone S3-compatible server on 127.0.0.1 (a real HTTP server, not a mock of the client), with
the standard AWS environment pointing at it: every client (s3fs, boto3, multi-storage-client, and so
Energon) reads its endpoint and credentials from there, as it would for a real store. The server logs
every request it answers (method, key, Range header, body bytes sent): what a test counts reads by."""

from __future__ import annotations

import socket
from typing import NamedTuple

import pytest


class Request(NamedTuple):
    method: str
    path: str  # /bucket/key
    range: str | None  # the Range header, for a ranged GET
    sent: int  # body bytes the server sent


def _logged(app, log: list[Request]):
    """``app`` (WSGI) recording each request it answers into ``log`` once its body is sent."""

    def wsgi(environ, start_response):
        sent = 0
        body = app(environ, start_response)
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            if hasattr(body, "close"):
                body.close()
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            log.append(Request(method, path, environ.get("HTTP_RANGE"), sent))

    return wsgi


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = pytest.MonkeyPatch()
        self.requests: list[Request] = []  # every request answered, in order

    def __enter__(self) -> S3Server:
        import logging

        import s3fs
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from moto.server import ThreadedMotoServer
        from werkzeug.serving import make_server

        log = self.requests

        class LoggedServer(ThreadedMotoServer):  # moto's own server, its app wrapped to log requests
            def _server_entry(self) -> None:
                app = _logged(DomainDispatcherApplication(create_backend_app), log)
                self._server = make_server(
                    self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
                )
                self._server_ready_event.set()
                self._server.serve_forever()

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.server = LoggedServer(ip_address="127.0.0.1", port=self.port, verbose=False)
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
