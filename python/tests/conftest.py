"""Real servers for the `ferry` package's tests: MinIO for s3://,
fake-gcs-server for gs://, Azurite for az://, distribution's registry
(artifacts pushed with oras) for oci:// and olah, a self-hosted Hugging Face
Hub serving git repositories, for hf://: the pinned binaries hack/tools.sh
installs (found through FERRY_MINIO_BIN, FERRY_FAKE_GCS_SERVER_BIN,
FERRY_AZURITE_BLOB_BIN, FERRY_REGISTRY_BIN, FERRY_ORAS_BIN, FERRY_OLAH_BIN
and FERRY_HF_BIN, as the Rust tests find them). Each server runs once per
test session, on loopback."""

import base64
import email.utils
import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
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


class Server:
    """A server process of the session's own (`process`)."""

    def stop(self):
        self.process.terminate()
        self.process.wait(10)


class Minio(Server):
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


class FakeGcs(Server):
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


# Azurite's development account: public, the same in every Azurite.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azurite(Server):
    def __init__(self, root):
        os.makedirs(root, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        log = os.path.join(root, "azurite.log")
        self.process = subprocess.Popen(
            [binary("FERRY_AZURITE_BLOB_BIN", "azurite-blob"), "--blobHost", "127.0.0.1", "--blobPort",
             str(self.port), "--location", os.path.join(root, "data"), "--skipApiVersionCheck", "--loose",
             "--disableTelemetry", "--silent"],
            stdout=open(log, "w"), stderr=subprocess.STDOUT)
        wait_until(lambda: self.answers(), "Azurite", self.process, log)

    def answers(self):
        try:
            urllib.request.urlopen(f"{self.endpoint}?comp=list", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # refused without credentials: it listens
        except OSError:
            return False
        return True

    def bucket(self):
        """A new container, created with a Shared Key request of this file's own."""
        name = "ferry-" + secrets.token_hex(4)
        date = email.utils.formatdate(usegmt=True)
        version = "2021-08-06"
        # Shared Key: the verb, eleven standard headers (Content-Length
        # empty when 0; urllib sends a Content-Type with any body), the
        # x-ms- headers, and the resource with the account twice in a
        # path-style URL.
        content_type = "application/octet-stream"
        standard = ["", "", "", "", content_type] + [""] * 6
        to_sign = "\n".join(["PUT"] + standard + [f"x-ms-date:{date}", f"x-ms-version:{version}",
                                                  f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container"])
        signature = base64.b64encode(
            hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
        request = urllib.request.Request(
            f"{self.endpoint}/{name}?restype=container", data=b"", method="PUT",
            headers={"x-ms-date": date, "x-ms-version": version, "Content-Type": content_type,
                     "Authorization": f"SharedKey {AZURITE_ACCOUNT}:{signature}"})
        urllib.request.urlopen(request, timeout=10).close()
        return name


class Registry(Server):
    """distribution's registry, without auth; artifacts are pushed with oras."""

    def __init__(self, root):
        os.makedirs(root, exist_ok=True)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.endpoint = f"http://{self.host}"
        config = os.path.join(root, "config.yml")
        with open(config, "w") as f:
            f.write(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                    f"http:\n  addr: {self.host}\n")
        log = os.path.join(root, "registry.log")
        self.process = subprocess.Popen(
            [binary("FERRY_REGISTRY_BIN", "registry"), "serve", config], stdout=open(log, "w"),
            stderr=subprocess.STDOUT, env=dict(os.environ, OTEL_TRACES_EXPORTER="none"))
        wait_until(lambda: http_ok(f"{self.endpoint}/v2/"), "registry", self.process, log)

    def push(self, directory, repository, tag, files):
        """Pushes `files` (paths relative to `directory`) as an artifact, one
        layer each, titled with its path; returns the reference."""
        reference = f"{self.host}/{repository}:{tag}"
        subprocess.run([binary("FERRY_ORAS_BIN", "oras"), "push", "--plain-http", reference] + files,
                       cwd=directory, check=True, capture_output=True)
        return reference


class Hub(Server):
    """olah, offline, serving the git repositories under `root/mirrors`
    (`models/ORG/REPO`); files from 1 MiB on are kept in LFS, as the Hub
    keeps large files. Offline olah serves LFS files itself and ignores
    Range (the Rust tests put the Hub's redirect to ranged storage before
    it), so the tests here read files whole."""

    LFS_FROM = 1 << 20

    def __init__(self, root):
        self.mirrors = os.path.join(root, "mirrors")
        os.makedirs(os.path.join(self.mirrors, "models"), exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        config = os.path.join(root, "olah.toml")
        with open(config, "w") as f:
            f.write(f'[basic]\nhost = "127.0.0.1"\nport = {self.port}\nrepos-path = "{root}/repos"\n'
                    f'mirrors-path = ["{self.mirrors}"]\nhf-scheme = "http"\nhf-netloc = "127.0.0.1:9"\n'
                    f'hf-lfs-netloc = "127.0.0.1:9"\nmirror-scheme = "http"\n'
                    f'mirror-netloc = "127.0.0.1:{self.port}"\nmirror-lfs-netloc = "127.0.0.1:{self.port}"\n'
                    f'[accessibility]\noffline = true\n')
        log = os.path.join(root, "olah.log")
        self.process = subprocess.Popen(
            [binary("FERRY_OLAH_BIN", "olah"), "-c", config, "--log-path", os.path.join(root, "logs")],
            cwd=root, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        # Any answer means it is up (an unknown repository is a 401).
        wait_until(lambda: http_answers(f"{self.endpoint}/api/models/ferry/none/revision/main"), "olah",
                   self.process, log)

    def repository(self, repo, files):
        """Commits `files` (path -> bytes) as repository `repo` (`ORG/NAME`)
        on branch main; returns the commit."""
        directory = os.path.join(self.mirrors, "models", repo)
        os.makedirs(directory)
        git = lambda *args: subprocess.run(
            ["git", "-c", "user.name=ferry-tests", "-c", "user.email=tests@ferry.invalid",
             "-c", "commit.gpgsign=false", *args], cwd=directory, check=True, capture_output=True).stdout
        git("init", "-q", "-b", "main")
        for path, content in files.items():
            target = os.path.join(directory, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if len(content) >= self.LFS_FROM:
                sha = hashlib.sha256(content).hexdigest()
                objects = os.path.join(directory, ".git", "lfs", "objects", sha[:2], sha[2:4])
                os.makedirs(objects, exist_ok=True)
                with open(os.path.join(objects, sha), "wb") as f:
                    f.write(content)
                content = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(content)}\n".encode()
            with open(target, "wb") as f:
                f.write(content)
        git("add", "-A")
        git("commit", "-q", "-m", "files")
        return git("rev-parse", "HEAD").decode().strip()

    def hf_download(self, repo, directory):
        """`hf download REPO --local-dir DIRECTORY`, the Hub's own client."""
        env = dict(os.environ, HF_ENDPOINT=self.endpoint, HF_HOME=os.path.join(directory, ".hf-home"),
                   HF_HUB_DISABLE_TELEMETRY="1")
        subprocess.run([binary("FERRY_HF_BIN", "hf"), "download", repo, "--local-dir", directory],
                       env=env, check=True, capture_output=True)


def http_answers(url):
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


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


@pytest.fixture(scope="session")
def azurite(servers_root):
    server = Azurite(os.path.join(servers_root, "azurite"))
    # The engine takes the account and its key from the environment, as the CLI does.
    os.environ["AZURE_STORAGE_ACCOUNT"] = AZURITE_ACCOUNT
    os.environ["AZURE_STORAGE_KEY"] = AZURITE_KEY
    yield server
    server.stop()


@pytest.fixture(scope="session")
def hub(servers_root):
    server = Hub(os.path.join(servers_root, "hub"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def registry(servers_root):
    server = Registry(os.path.join(servers_root, "registry"))
    yield server
    server.stop()
