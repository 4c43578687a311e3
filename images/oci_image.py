#!/usr/bin/env python3
"""Writes container images as OCI archives, with no container daemon.

An image here is two layers and a config: a base of the files the program
needs from the build machine's Debian packages (the shared libraries it
links, found with `ldd`; the system CA bundle; passwd and group entries for
the non-root user) and the program itself. The result is an OCI image
layout packed in a tar (`oci-archive`), which `podman load`, `skopeo copy
oci-archive:…`, `ctr images import` and `crane push` accept.

The same inputs give the same bytes: entries are sorted, owned by 0:0 (or
the user the image runs as, for its home), dated SOURCE_DATE_EPOCH, and
compressed with a fixed gzip header, so building twice from one tree gives
the same digests.

    oci_image.py ferry  --bin-dir target/release --out target/images --tag dev
    oci_image.py custom --name ferry-e2e-pause --tag dev --out DIR \\
        --file /path/to/pause:/pause --entrypoint /pause --user 65535:65535

It is not a general image builder: no parent image, no RUN steps, Linux
amd64/arm64 only (whichever this machine is).
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def source_date_epoch() -> int:
    """The time every entry and the config carry: SOURCE_DATE_EPOCH, else
    the last commit's time, so an unchanged tree gives unchanged digests."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=HERE, capture_output=True, text=True, check=True)
        return int(out.stdout.strip())
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 0


class Layer:
    """A layer's entries by path; rendered sorted, so insertion order does
    not matter."""

    def __init__(self, mtime: int):
        self.mtime = mtime
        self.entries: dict[str, tarfile.TarInfo] = {}
        self.data: dict[str, bytes] = {}

    def _parents(self, path: str) -> None:
        parts = path.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.directory("/" + "/".join(parts[:i]))

    def directory(self, path: str, mode: int = 0o755, owner: int = 0) -> None:
        name = path.strip("/")
        if name in self.entries:
            return
        self._parents(path)
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, self.mtime
        info.uid = info.gid = owner
        self.entries[name] = info

    def file(self, path: str, content: bytes, mode: int = 0o644) -> None:
        self._parents(path)
        name = path.strip("/")
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(content), mode, self.mtime
        self.entries[name] = info
        self.data[name] = content

    def symlink(self, path: str, target: str) -> None:
        self._parents(path)
        name = path.strip("/")
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, self.mtime
        self.entries[name] = info

    def tar(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(self.entries):
                info = self.entries[name]
                info.uname = info.gname = ""
                content = self.data.get(name)
                tar.addfile(info, io.BytesIO(content) if content is not None else None)
        return buffer.getvalue()


def gzipped(data: bytes) -> bytes:
    """gzip with no name and a zero time in its header: the same input,
    the same output."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=6, mtime=0, filename="") as out:
        out.write(data)
    return buffer.getvalue()


def linked_libraries(binary: Path) -> list[tuple[str, Path]]:
    """(path the loader looks for, file on this machine) for every shared
    library `binary` needs, and the loader itself; [] for a static binary."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if out.returncode != 0 or "not a dynamic executable" in out.stdout + out.stderr:
        return []
    found = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            path = line.split("=>", 1)[1].split("(")[0].strip()
        else:
            path = line.split("(")[0].strip()
        if path.startswith("/"):
            if "not found" in line:
                sys.exit(f"{binary}: {line}")
            found.append((path, Path(path).resolve()))
    return found


def debian_packages(paths: list[Path]) -> list[str]:
    """`package=version` of the Debian packages that own `paths`, for the
    record (an annotation on the image)."""
    packages = set()
    for path in paths:
        # dpkg knows the path as the package installed it (Debian 12 ships
        # /lib as a link to /usr/lib, so try both spellings).
        candidates = [str(path)]
        if str(path).startswith("/usr/lib/"):
            candidates.append(str(path)[len("/usr"):])
        for candidate in candidates:
            out = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
            if out.returncode == 0:
                package = out.stdout.split(":", 1)[0].strip()
                version = subprocess.run(
                    ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True
                ).stdout.strip()
                packages.add(f"{package}={version}")
                break
    return sorted(packages)


def base_layer(mtime: int, programs: list[Path], user: str, with_ca: bool = True) -> tuple[Layer, list[str]]:
    """What every image holds besides its program: the libraries the
    programs link, the CA bundle, the non-root user and an empty /tmp."""
    layer = Layer(mtime)
    owned = []
    for program in programs:
        for wanted, real in linked_libraries(program):
            layer.file(wanted, real.read_bytes(), 0o755)
            owned.append(real)
    if with_ca:
        layer.file(CA_BUNDLE, Path(CA_BUNDLE).read_bytes())
        owned.append(Path("/usr/share/ca-certificates"))
    uid, gid = (int(x) for x in user.split(":"))
    layer.file("/etc/passwd", f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{uid}:{gid}:nonroot:/home/nonroot:/sbin/nologin\n".encode())
    layer.file("/etc/group", f"root:x:0:\nnonroot:x:{gid}:\n".encode())
    # Name resolution: the hosts file first, then DNS (glibc's own default).
    layer.file("/etc/nsswitch.conf", b"hosts: files dns\n")
    layer.directory("/home/nonroot", 0o700, owner=uid)
    layer.directory("/tmp", 0o1777)
    return layer, debian_packages(owned)


def write_archive(out: Path, reference: tuple[str, str], layers: list[Layer], config: dict, annotations: dict) -> str:
    """Writes the OCI layout of one image as a tar at `out`; returns the
    manifest's digest."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    descriptors, diff_ids = [], []
    for layer in layers:
        raw = layer.tar()
        diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
        descriptors.append(blob(gzipped(raw), OCI_LAYER))
    config = dict(config, rootfs={"type": "layers", "diff_ids": diff_ids})
    config_descriptor = blob(canonical(config), OCI_CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_descriptor,
        "layers": descriptors,
        "annotations": annotations,
    }
    manifest_descriptor = blob(canonical(manifest), OCI_MANIFEST)
    repository, tag = reference
    index = {
        "schemaVersion": 2,
        "manifests": [
            dict(
                manifest_descriptor,
                annotations={
                    # podman and skopeo read the tag, containerd the whole name.
                    "org.opencontainers.image.ref.name": tag,
                    "io.containerd.image.name": f"{repository}:{tag}",
                },
            )
        ],
    }
    layout = Layer(layers[0].mtime if layers else 0)
    layout.file("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
    layout.file("index.json", canonical(index))
    for digest, data in blobs.items():
        layout.file(f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(out.suffix + ".partial")
    partial.write_bytes(layout.tar())
    partial.replace(out)
    return manifest_descriptor["digest"]


def canonical(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def architecture() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def image_config(mtime: int, entrypoint: list[str], user: str, ports: list[int], env: list[str], labels: dict) -> dict:
    created = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc)
    return {
        "created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "architecture": architecture(),
        "os": "linux",
        "config": {
            "User": user,
            "Entrypoint": entrypoint,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", *env],
            "ExposedPorts": {f"{p}/tcp": {} for p in ports},
            "WorkingDir": "/",
            "Labels": labels,
        },
    }


def build(out_dir: Path, reference: tuple[str, str], files: list[tuple[Path, str]], entrypoint: list[str],
          user: str, ports: list[int], symlinks: list[tuple[str, str]] = (), with_ca: bool = True) -> tuple[Path, str]:
    """Builds one image of `files` (SOURCE, path in the image) and writes
    `<out_dir>/<name>.oci.tar`; returns its path and manifest digest."""
    mtime = source_date_epoch()
    base, packages = base_layer(mtime, [source for source, _ in files], user, with_ca)
    program = Layer(mtime)
    for source, destination in files:
        program.file(destination, source.read_bytes(), 0o755)
    for path, target in symlinks:
        program.symlink(path, target)
    name = reference[0].rsplit("/", 1)[-1]
    labels = {"org.opencontainers.image.title": name, "org.opencontainers.image.source": "https://github.com/ferry-dev/ferry"}
    annotations = dict(labels, **{"dev.ferry.image.base-packages": " ".join(packages)})
    env = [f"SSL_CERT_FILE={CA_BUNDLE}"] if with_ca else []
    config = image_config(mtime, entrypoint, user, ports, env, labels)
    out = out_dir / f"{name}.oci.tar"
    return out, write_archive(out, reference, [base, program], config, annotations)


def without_debug_info(binary: Path, scratch: Path) -> Path:
    """A copy of `binary` without its debug sections (the release profile
    keeps line tables, which are four fifths of the file); symbols stay, so
    a backtrace still names functions."""
    copy = scratch / binary.name
    subprocess.run(["objcopy", "--strip-debug", str(binary), str(copy)], check=True)
    return copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ferry = sub.add_parser("ferry", help="the images images/images.json describes")
    ferry.add_argument("--bin-dir", type=Path, required=True)
    ferry.add_argument("--out", type=Path, required=True)
    ferry.add_argument("--tag", required=True)
    ferry.add_argument("--repository-prefix", help="default: images.json's")
    custom = sub.add_parser("custom", help="one image of given files (test images)")
    custom.add_argument("--name", required=True, help="repository, e.g. ferry-e2e-pause")
    custom.add_argument("--tag", required=True)
    custom.add_argument("--out", type=Path, required=True)
    custom.add_argument("--file", action="append", required=True, help="SOURCE:DESTINATION")
    custom.add_argument("--symlink", action="append", default=[], help="PATH:TARGET")
    custom.add_argument("--entrypoint", action="append", required=True)
    custom.add_argument("--user", default="65532:65532")
    args = parser.parse_args()

    if args.command == "ferry":
        spec = json.loads((HERE / "images.json").read_text())
        prefix = args.repository_prefix if args.repository_prefix is not None else spec["repositoryPrefix"]
        with tempfile.TemporaryDirectory() as scratch:
            built = [
                build(args.out, (prefix + name, args.tag),
                      [(without_debug_info(args.bin_dir / image["binary"], Path(scratch)), image["entrypoint"][0])],
                      image["entrypoint"], spec["user"], image["exposedPorts"])
                for name, image in spec["images"].items()
            ]
    else:
        # The destination (an absolute path in the image) holds no ':'; the source may.
        files = [(Path(f.rsplit(":", 1)[0]), f.rsplit(":", 1)[1]) for f in args.file]
        symlinks = [tuple(link.split(":", 1)) for link in args.symlink]
        built = [build(args.out, (args.name, args.tag), files, args.entrypoint, args.user, [], symlinks, with_ca=False)]
    for out, digest in built:
        print(f"{out}\t{digest}\t{out.stat().st_size}")


if __name__ == "__main__":
    main()
