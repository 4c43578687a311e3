"""Real servers for the `ferry` package's tests: MinIO for s3:// and
fake-gcs-server for gs://, the pinned binaries hack/tools.sh installs
(found through FERRY_MINIO_BIN and FERRY_FAKE_GCS_SERVER_BIN, as the Rust
tests find them). Each server runs once per test session, on loopback."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import boto3
import pytest
from botocore.config import Config


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(variable, tool):
    path = os.environ.get(variable)
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        tools = os.path.join(here, "..", "..", "hack", "tools.sh")
        path = subprocess.run([tools, "path", tool], check=True, capture_output=True, text=True).stdout.strip()
    return path


def wait_until(ready, what, process, log):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{open(log).read()[-2000:]}")
        if ready():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not up within 60s:\n{open(log).read()[-2000:]}")


def http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


class Minio:
    def __init__(self, root):
        os.makedirs(root, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.access_key = "ferry-" + secrets.token_hex(4)
        self.secret_key = secrets.token_hex(16)
        log = os.path.join(root, "minio.log")
        env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                   MINIO_BROWSER="off", MINIO_UPDATE="off")
        self.process = subprocess.Popen(
            [binary("FERRY_MINIO_BIN", "minio"), "server", os.path.join(root, "data"),
             "--address", f"127.0.0.1:{self.port}", "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        wait_until(lambda: http_ok(f"{self.endpoint}/minio/health/ready"), "MinIO", self.process, log)
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}))

    def bucket(self):
        name = "ferry-" + secrets.token_hex(4)
        self.client.create_bucket(Bucket=name)
        return name

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


class FakeGcs:
    def __init__(self, root):
        os.makedirs(root, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        log = os.path.join(root, "fake-gcs-server.log")
        self.process = subprocess.Popen(
            [binary("FERRY_FAKE_GCS_SERVER_BIN", "fake-gcs-server"), "-scheme", "http", "-host", "127.0.0.1",
             "-port", str(self.port), "-backend", "memory", "-public-host", f"127.0.0.1:{self.port}",
             "-external-url", self.endpoint, "-log-level", "warn"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT)
        wait_until(lambda: http_ok(f"{self.endpoint}/storage/v1/b"), "fake-gcs-server", self.process, log)

    def bucket(self):
        name = "ferry-" + secrets.token_hex(4)
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b", data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=10).close()
        return name

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="session")
def servers_root():
    root = tempfile.mkdtemp(prefix="ferry-pytest-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def minio(servers_root):
    server = Minio(os.path.join(servers_root, "minio"))
    # The engine takes credentials from the environment, as the CLI does.
    os.environ["AWS_ACCESS_KEY_ID"] = server.access_key
    os.environ["AWS_SECRET_ACCESS_KEY"] = server.secret_key
    os.environ["AWS_REGION"] = "us-east-1"
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs(servers_root):
    server = FakeGcs(os.path.join(servers_root, "gcs"))
    yield server
    server.stop()


@pytest.fixture
def s3(minio):
    """A fresh bucket, and the options that reach it."""
    return minio.bucket(), {"endpoint_url": minio.endpoint}
