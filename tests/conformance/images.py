"""The images ``e2e.test`` runs, built on this machine: nothing is pulled from a registry.

Each is a docker-archive that ``ctr images import`` takes, named with the exact upstream reference
``e2e.test --list-images`` prints, so that the kubelet finds it present and pulls nothing:

* **agnhost** (also standing in for nginx, which the EndpointSlice tests only need to serve port
  80, and for glibc-dns-testing, Debian with ``dig``): Kubernetes' own agnhost binary (from
  ``scripts/build-peers.sh``, static) on a Debian root file system with what the tests run in it:
  curl, a netcat with ``-u -z -v`` (netcat-openbsd), iproute2 and dnsutils. The root file system
  comes from ``mmdebstrap`` with the machine's own apt sources, cached by its recipe.
* **busybox** and **pause**: the project's busybox-static image (every applet linked), the pause
  one sleeping until it is told to stop.
* **regression-issue-74839**: the Conntrack spec's server (it answers a connection with an
  out-of-window packet), Kubernetes' own program from the peer build (static), on busybox; upstream
  puts it on debian-base, of which it uses nothing.
* **coredns**: the CoreDNS the peer build makes, alone in its image.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "BUILDERS",
    "REGRESSION_74839",
    "ImageBuilder",
    "apt_sources",
    "archive_refs",
    "list_images",
    "retag_archive",
]

BUSYBOX = "/bin/busybox"
#: the Conntrack spec's server: its peer binary's name, and its image's
REGRESSION_74839 = "regression-issue-74839"
#: Debian packages of the agnhost image: what the tests run in it (curl, nc -u -z -v, ss/ip, dig)
AGNHOST_PACKAGES = ("curl", "netcat-openbsd", "iproute2", "dnsutils", "ca-certificates", "procps")
SUITE = "bookworm"
# a pause that ends on SIGTERM (as PID 1 a plain sleep would ignore it, and wait out the grace period)
PAUSE = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"]


def apt_sources() -> list[str]:
    """The machine's enabled apt source files, for mmdebstrap (which pastes a file given as mirror)."""
    files = [f for f in ("/etc/apt/sources.list",) if os.path.isfile(f) and _has_entries(f)]
    for pattern in ("*.list", "*.sources"):
        files += sorted(glob.glob(f"/etc/apt/sources.list.d/{pattern}"))
    return [f for f in files if _has_entries(f)]


def _has_entries(path: str) -> bool:
    with open(path, errors="replace") as f:
        return any(line.strip() and not line.lstrip().startswith("#") for line in f)


def list_images(e2e_test: Path) -> list[str]:
    """The image references ``e2e.test --list-images`` prints (after any remapping)."""
    done = subprocess.run([str(e2e_test), "--list-images"], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"e2e.test --list-images failed: {done.stderr[-2000:]}")
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _add(t: tarfile.TarFile, name: str, data: bytes | None = None, *, mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
         link: str = "") -> None:  # fmt: skip
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.type, info.linkname = mode, 0, kind, link
    info.size = len(data) if data is not None else 0
    t.addfile(info, io.BytesIO(data) if data is not None else None)


def _busybox_applets() -> list[str]:
    out = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, timeout=30, check=True).stdout
    return sorted({a for a in out.split() if a and a != "busybox"})


def busybox_layer(path: Path, extra: dict[str, tuple[bytes, int]] | None = None) -> None:
    """A layer tar: busybox-static with every applet linked in /bin, /etc/passwd and group, /tmp, and ``extra``
    (path -> (content, mode))."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for d, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("proc", 0o555), ("sys", 0o555),
                        ("dev", 0o755), ("root", 0o700), ("var", 0o755)):  # fmt: skip
            _add(t, d, kind=tarfile.DIRTYPE, mode=mode)
        _add(t, "bin/busybox", Path(BUSYBOX).read_bytes(), mode=0o755)
        for applet in _busybox_applets():
            _add(t, f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox")
        _add(t, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        _add(t, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        for name, (data, mode) in (extra or {}).items():
            _add(t, name, data, mode=mode)


def files_layer(path: Path, files: dict[str, tuple[bytes, int]], dirs: tuple[str, ...] = (),
                links: dict[str, str] | None = None) -> None:  # fmt: skip
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        for d in dirs:
            _add(t, d, kind=tarfile.DIRTYPE, mode=0o755)
        for name, (data, mode) in files.items():
            _add(t, name, data, mode=mode)
        for name, target in (links or {}).items():
            _add(t, name, kind=tarfile.SYMTYPE, link=target)


def docker_archive(path: Path, refs: list[str], layers: list[Path], config: dict[str, Any]) -> None:
    """A docker-archive (what ``docker save`` writes) of ``layers`` (tar files) named ``refs``."""
    diff_ids = []
    for layer in layers:
        h = hashlib.sha256()
        with open(layer, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        diff_ids.append(h.hexdigest())
    doc = {
        "architecture": "amd64" if os.uname().machine == "x86_64" else os.uname().machine,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
    }
    config_bytes = json.dumps(doc).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": refs, "Layers": [f"{d}/layer.tar" for d in diff_ids]}]
    with tarfile.open(path, "w") as t:
        _add(t, config_name, config_bytes)
        for d, layer in zip(diff_ids, layers, strict=True):
            t.add(str(layer), arcname=f"{d}/layer.tar")
        _add(t, "manifest.json", json.dumps(manifest).encode())


def retag_archive(source: Path, path: Path, refs: list[str]) -> None:
    """A copy of docker-archive ``source`` whose one image is named ``refs``."""
    with tarfile.open(source) as src, tarfile.open(path, "w") as dst:
        for member in src.getmembers():
            if member.name in ("manifest.json", "repositories"):
                if member.name == "manifest.json":
                    f = src.extractfile(member)
                    assert f is not None
                    [entry] = json.loads(f.read())
                    entry["RepoTags"] = refs
                    _add(dst, "manifest.json", json.dumps([entry]).encode())
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)


class ImageBuilder:
    """Builds the test images into ``work`` (the Debian root file system cached in ``cache``)."""

    def __init__(self, work: Path, cache: Path, peers: Path, log: Callable[[str], None] = print) -> None:
        self.work, self.cache, self.peers, self.log = work, cache, peers, log
        work.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)

    def debian_rootfs(self) -> Path:
        """mmdebstrap's root file system of :data:`AGNHOST_PACKAGES` (a tar), made once per recipe."""
        # the machine's own sources (security and updates too), or the mirror build-image.sh is told to use
        mirror = os.environ.get("NETPLUGIN_DEBIAN_MIRROR", "")
        sources = [mirror] if mirror else apt_sources()
        if not sources:
            raise RuntimeError("no apt sources on this machine (/etc/apt/sources.list[.d]) for mmdebstrap")
        if shutil.which("mmdebstrap") is None:
            raise RuntimeError("mmdebstrap is not installed (apt-get install mmdebstrap)")
        recipe = f"mmdebstrap --variant=minbase --include={','.join(AGNHOST_PACKAGES)} {SUITE}"
        recipe_text = [recipe, *(Path(s).read_text() if os.path.isfile(s) else s for s in sources)]
        key = hashlib.sha256("\n".join(recipe_text).encode()).hexdigest()[:16]
        out = self.cache / f"debian-{key}.tar"
        if out.exists():
            return out
        self.log(f"images: {recipe} (the machine's apt sources)")
        tmp = out.with_suffix(".tmp.tar")
        argv = ["mmdebstrap", "--quiet", "--mode=root", "--variant=minbase", f"--include={','.join(AGNHOST_PACKAGES)}",
                "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
                SUITE, str(tmp), *sources]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"mmdebstrap failed: {done.stderr[-3000:]}")
        tmp.rename(out)
        return out

    def _porter_certs(self) -> dict[str, tuple[bytes, int]]:
        """agnhost porter's TLS files (/localhost.crt, /localhost.key): a self-signed localhost certificate."""
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-days", "3650", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                 "-keyout", f"{d}/localhost.key", "-out", f"{d}/localhost.crt"],
                capture_output=True, timeout=60, check=True,
            )  # fmt: skip
            return {n: (Path(d, n).read_bytes(), 0o644) for n in ("localhost.crt", "localhost.key")}

    def agnhost(self, refs: list[str]) -> Path:
        """agnhost on Debian; ``refs``: every name it goes by (agnhost, and the images it stands in for)."""
        layer = self.work / "agnhost-layer.tar"
        files = {"agnhost": ((self.peers / "agnhost").read_bytes(), 0o755), **self._porter_certs()}
        files_layer(layer, files, dirs=("uploads",), links={"agnhost-2": "agnhost"})
        path = self.work / "agnhost.tar"
        config = {"Entrypoint": ["/agnhost"], "Cmd": ["pause"],
                  "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}  # fmt: skip
        docker_archive(path, refs, [self.debian_rootfs(), layer], config)
        return path

    def nginx(self, refs: list[str]) -> Path:
        """A web server on port 80 (the EndpointSlice and Endpoints tests only need one): agnhost netexec."""
        layer = self.work / "nginx-layer.tar"
        files_layer(layer, {"agnhost": ((self.peers / "agnhost").read_bytes(), 0o755)})
        path = self.work / "nginx.tar"
        config = {"Entrypoint": ["/agnhost"], "Cmd": ["netexec", "--http-port=80"], "Env": ["PATH=/bin"]}
        busybox = self.work / "busybox-layer.tar"
        if not busybox.exists():
            busybox_layer(busybox)
        docker_archive(path, refs, [busybox, layer], config)
        return path

    def busybox(self, refs: list[str]) -> Path:
        layer = self.work / "busybox-layer.tar"
        if not layer.exists():
            busybox_layer(layer)
        path = self.work / "busybox.tar"
        docker_archive(path, refs, [layer], {"Cmd": ["sh"], "Env": ["PATH=/bin"]})
        return path

    def pause(self, refs: list[str]) -> Path:
        layer = self.work / "busybox-layer.tar"
        if not layer.exists():
            busybox_layer(layer)
        path = self.work / "pause.tar"
        docker_archive(path, refs, [layer], {"Entrypoint": PAUSE, "Env": ["PATH=/bin"]})
        return path

    def regression_issue_74839(self, refs: list[str]) -> Path:
        layer = self.work / "regression-layer.tar"
        files_layer(layer, {REGRESSION_74839: ((self.peers / REGRESSION_74839).read_bytes(), 0o755)})
        busybox = self.work / "busybox-layer.tar"
        if not busybox.exists():
            busybox_layer(busybox)
        path = self.work / "regression.tar"
        docker_archive(path, refs, [busybox, layer], {"Entrypoint": [f"/{REGRESSION_74839}"], "Env": ["PATH=/bin"]})
        return path

    def coredns(self, refs: list[str]) -> Path:
        layer = self.work / "coredns-layer.tar"
        files_layer(layer, {"coredns": ((self.peers / "coredns").read_bytes(), 0o755)}, dirs=("etc", "etc/coredns"))
        path = self.work / "coredns.tar"
        docker_archive(path, refs, [layer], {"Entrypoint": ["/coredns"], "Env": ["PATH=/"]})
        return path


#: image name (the reference's path, without registry or tag) -> the builder of its stand-in
BUILDERS: dict[str, Callable[[ImageBuilder, list[str]], Path]] = {
    "e2e-test-images/agnhost": ImageBuilder.agnhost,
    "e2e-test-images/glibc-dns-testing": ImageBuilder.agnhost,
    "e2e-test-images/nginx": ImageBuilder.nginx,
    "e2e-test-images/busybox": ImageBuilder.busybox,
    f"e2e-test-images/{REGRESSION_74839}": ImageBuilder.regression_issue_74839,
    "pause": ImageBuilder.pause,
    "coredns/coredns": ImageBuilder.coredns,
}


def archive_refs(path: Path) -> list[str]:
    """The names of the image in docker-archive ``path``."""
    with tarfile.open(path) as t:
        f = t.extractfile("manifest.json")
        assert f is not None
        return [ref for entry in json.loads(f.read()) for ref in entry.get("RepoTags") or []]
