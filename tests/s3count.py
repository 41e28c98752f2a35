"""A local moto S3 server that records every request it answers: method, operation, key and
the bytes each way. ``bench_scale.py io`` reads and resets the log between stage commands to
tag the requests by stage.

It is moto's ``ThreadedMotoServer`` (the server ``tests/s3local.py`` starts), with the WSGI app
wrapped in a small middleware that counts the response body as it is sent; nothing in
packcli or its S3 client is patched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server


@dataclass(frozen=True)
class Request:
    method: str  # HTTP method
    op: str  # GET (an object's bytes), HEAD, LIST, PUT (an object or a part), POST, DELETE
    bucket: str
    key: str  # "" for a bucket request
    status: int
    received: int  # request body bytes (decoded: without aws-chunked signatures)
    sent: int  # response body bytes


def _op(method: str, key: str, query: dict[str, list[str]]) -> str:
    if method == "GET":
        return "GET" if key and "uploadId" not in query else "LIST"
    return method


class RequestLog:
    """The requests answered since the last :meth:`take`, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[Request] = []

    def add(self, r: Request) -> None:
        with self._lock:
            self._requests.append(r)

    def take(self) -> list[Request]:
        with self._lock:
            out, self._requests = self._requests, []
        return out


def counting(app: Callable, log: RequestLog) -> Callable:
    """WSGI middleware: log each request once its response body has been sent."""

    def wrapped(environ: dict, start_response: Callable) -> Iterator[bytes]:
        status: list[int] = []

        def record_status(s: str, headers: list, exc_info: object = None) -> Callable:
            status.append(int(s.split()[0]))
            return start_response(s, headers, exc_info)

        method = environ["REQUEST_METHOD"]
        path = unquote(environ.get("PATH_INFO", "")).lstrip("/")
        bucket, _, key = path.partition("/")  # path style: clients use it for an IP endpoint
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        received = int(
            environ.get("HTTP_X_AMZ_DECODED_CONTENT_LENGTH") or environ.get("CONTENT_LENGTH") or 0
        )
        body: Iterable[bytes] = app(environ, record_status)
        sent = 0
        try:
            for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            op = _op(method, key, query)
            log.add(Request(method, op, bucket, key, status[0] if status else 0, received, sent))

    return wrapped


class CountingMotoServer(ThreadedMotoServer):
    """``ThreadedMotoServer`` on loopback whose app is wrapped by :func:`counting`."""

    def __init__(self, ip_address: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(ip_address=ip_address, port=port, verbose=False)
        self.log = RequestLog()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    def _server_entry(self) -> None:  # ThreadedMotoServer's, with the app wrapped
        app = counting(DomainDispatcherApplication(create_backend_app), self.log)
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()

    @property
    def endpoint(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"
