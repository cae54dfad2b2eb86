"""A real S3-compatible server on 127.0.0.1 for the tests: moto's server mode, one bucket.

The environment it hands back (``AWS_ENDPOINT_URL`` and keys) is what a user sets for a cloud bucket, so
the code under test takes the same path as in production.
"""

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest


@dataclass
class S3Server:
    endpoint: str
    bucket: str
    env: dict[str, str]
    server: object

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """Started for one test, with a bucket ``shards``; its env is also set in this process."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s3 = S3Server(endpoint, "shards", env, server)
    s3.client().create_bucket(Bucket="shards")
    try:
        yield s3
    finally:
        server.stop()


class SlowProxy:
    """A server that answers slowly: an HTTP proxy on 127.0.0.1 in front of ``upstream`` (the moto server)
    that holds every answer ``delay`` seconds before its first byte. Point ``AWS_ENDPOINT_URL`` at ``url``;
    ``requests`` counts what it answered (or dropped: a client that timed out has gone)."""

    def __init__(self, upstream: str, delay: float) -> None:
        import http.client
        import http.server
        import threading
        import time
        from urllib.parse import urlsplit

        self.delay, self.requests = delay, 0
        proxy, host = self, urlsplit(upstream).netloc
        hop_by_hop = {"connection", "keep-alive", "transfer-encoding", "content-length"}

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(host, timeout=30)
                conn.request(self.command, self.path, body, dict(self.headers))
                answer = conn.getresponse()
                data = answer.read() if self.command != "HEAD" else b""
                conn.close()
                proxy.requests += 1
                time.sleep(proxy.delay)
                try:
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in hop_by_hop:
                            self.send_header(key, value)
                    length = answer.getheader("Content-Length", "0") if self.command == "HEAD" else len(data)
                    self.send_header("Content-Length", str(length))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up waiting (its read timeout): nothing to answer
                    self.close_connection = True

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward  # noqa: N815 (http.server's names)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slow_s3(s3_server: S3Server) -> Iterator[SlowProxy]:
    """``s3_server`` behind a ``SlowProxy`` (no delay until a test sets ``delay``)."""
    proxy = SlowProxy(s3_server.endpoint, delay=0.0)
    try:
        yield proxy
    finally:
        proxy.close()
