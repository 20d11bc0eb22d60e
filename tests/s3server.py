"""A real S3-compatible server for the tests: moto's threaded server on 127.0.0.1 (a free port).

Use the ``s3`` fixture (import it into a test module, or a conftest): it yields an :class:`S3`
with the endpoint, the ``storage_options`` that point fsspec at it, and an s3fs file system for the
test's own checks. The environment is set so that clients need nothing else (test credentials, the
region, no instance metadata), and variables that would send them elsewhere are removed. Tests that
need it skip with the reason when the test extra (``moto[server]``, ``s3fs``) is not installed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass(frozen=True)
class S3:
    """A running server: ``endpoint`` (``http://127.0.0.1:PORT``) and what clients need to reach it."""

    endpoint: str

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs keyword arguments for this server (what a config's ``storage_options`` holds).

        They carry the test credentials too: processes started before the fixture set the
        environment (datatrove's forkserver workers) would otherwise find none."""
        return {
            "key": ENVIRONMENT["AWS_ACCESS_KEY_ID"],
            "secret": ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.endpoint},
        }

    def fs(self) -> Any:
        """A fresh s3fs file system on this server (no instance or listing cache shared with the code
        under test)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **self.storage_options)

    def bucket(self, prefix: str = "bkt") -> str:
        """Create a new, empty bucket and return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """A moto S3 server on loopback for the whole session, with the environment pointing at it."""
    pytest.importorskip("s3fs", reason="needs the test extra (s3fs): pip install -e '.[test]'")
    server_module = pytest.importorskip("moto.server", reason="needs the test extra (moto[server])")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    patch = pytest.MonkeyPatch()
    for name in CLEARED:
        patch.delenv(name, raising=False)
    for name, value in ENVIRONMENT.items():
        patch.setenv(name, value)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield S3(f"http://{host}:{port}")
    finally:
        server.stop()
        patch.undo()


def remote_files(s3: S3, url: str) -> dict[str, bytes]:
    """Every object under ``url`` (``s3://bucket/prefix``), by its path below the prefix."""
    fs = s3.fs()
    prefix = url.removeprefix("s3://")
    return {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)}


def local_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its POSIX path below it (comparable with :func:`remote_files`)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@dataclass(frozen=True)
class AuthS3:
    """A moto S3 server that checks credentials (moto's IAM authentication, enforced from the start
    of the test): ``key``/``secret`` are a user's that may do anything, ``bucket`` exists."""

    endpoint: str
    key: str
    secret: str
    bucket: str

    def storage_options(self, key: str | None = None, secret: str | None = None) -> dict[str, Any]:
        """fsspec options with this server's valid credentials, or with the given (wrong) ones."""
        return {
            "key": key or self.key,
            "secret": secret or self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint},
        }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3_auth(tmp_path_factory) -> Iterator[AuthS3]:
    """A moto S3 server in a process of its own (moto's authentication setting is global to a
    process, and the session's :func:`s3` server must stay open), with authentication enforced once
    a user with full access, its key and a bucket exist."""
    pytest.importorskip("s3fs", reason="needs the test extra (s3fs): pip install -e '.[test]'")
    pytest.importorskip("moto.server", reason="needs the test extra (moto[server])")
    import boto3

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in CLEARED} | ENVIRONMENT
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
        anyone = {  # before authentication is enforced, any credentials do
            "endpoint_url": endpoint,
            "region_name": ENVIRONMENT["AWS_DEFAULT_REGION"],
            "aws_access_key_id": ENVIRONMENT["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
        }
        iam = boto3.client("iam", **anyone)
        iam.create_user(UserName="curator")
        key = iam.create_access_key(UserName="curator")["AccessKey"]
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="curator", PolicyName="all", PolicyDocument=json.dumps(policy))
        bucket = "credbkt"
        boto3.client("s3", **anyone).create_bucket(Bucket=bucket)
        request = urllib.request.Request(  # from now on every request is authenticated
            f"{endpoint}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(request, timeout=10).close()
        yield AuthS3(endpoint, key["AccessKeyId"], key["SecretAccessKey"], bucket)
    finally:
        server.kill()
        server.wait()
