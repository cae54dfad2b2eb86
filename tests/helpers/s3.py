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
