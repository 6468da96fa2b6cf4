"""The build scripts take the machine's own package sources, never a registry host written in the tree.

* scripts/build-peers.sh uses the module proxies `go env GOPROXY` names (the GOPROXY variable, go's
  env file, go's default), "direct" dropped and "off" appended, or NETPLUGIN_GOPROXY when set; a
  setting that names no proxy is a usage error (exit 2) that says which setting to change.
* scripts/build-image.sh uses the Debian mirror apt's own sources give for the suite
  (`apt-get indextargets`), or --mirror / NETPLUGIN_DEBIAN_MIRROR.
* No file of the tree holds a package source's URL.

The real go, apt-get and bash run; only the commands that would fetch (go build/test/list,
podman, mmdebstrap) are stand-ins on PATH that record what they were given and fail. Addresses are
127.0.0.1 ports nothing listens on, and nothing is ever sent to them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PEERS = REPO / "scripts" / "build-peers.sh"
IMAGE = REPO / "scripts" / "build-image.sh"
#: a package source's URL: the Go proxy, Debian's archive, or any mirror
SOURCE_URL = re.compile(r"https?://(proxy\.golang|deb\.debian|[^\s)\]'\"`]*mirror)")

needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="no go command on PATH")
needs_apt = pytest.mark.skipif(shutil.which("apt-get") is None, reason="no apt-get on PATH")


def test_no_file_in_the_tree_names_a_package_source() -> None:
    files = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    hits = []
    for name in filter(None, files):
        path = REPO / name.decode()
        if not path.is_file() or path.is_symlink():
            continue
        for number, line in enumerate(path.read_bytes().decode(errors="replace").splitlines(), 1):
            if SOURCE_URL.search(line):
                hits.append(f"{name.decode()}:{number}: {line.strip()}")
    assert hits == []


@pytest.fixture
def stand_ins(tmp_path: Path) -> Callable[[str, str], Path]:
    """stand_in(name, body): an executable NAME on a PATH dir of its own, running the bash BODY."""
    bindir = tmp_path / "bin"
    bindir.mkdir()

    def stand_in(name: str, body: str) -> Path:
        path = bindir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(0o755)
        return bindir

    return stand_in


def _go_wrapper(stand_in: Callable[[str, str], Path], record: Path) -> Path:
    real = shutil.which("go")
    assert real is not None
    # build/test/list would fetch: record the proxy they were given and fail; the rest is the real go.
    return stand_in(
        "go",
        f'case $1 in build | test) echo "$GOPROXY" >>{record}; exit 1 ;; list) echo v1.0.0; exit 0 ;; esac\n'
        f'exec {real} "$@"',
    )


def _peers(bindir: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("GOPROXY", "NETPLUGIN_GOPROXY", "GOFLAGS")}
    # the real go's caches stay the machine's (read only: nothing is built or fetched here)
    full = {**base, "PATH": f"{bindir}:{os.environ['PATH']}", "NETPLUGIN_PEERS_CACHE": str(tmp_path / "cache"), **env}
    return subprocess.run(
        ["bash", str(PEERS)], capture_output=True, text=True, timeout=300, env=full, stdin=subprocess.DEVNULL
    )


@needs_go
@pytest.mark.parametrize(
    ("setting", "override", "expected"),
    [
        # go's env file, as `go env -w GOPROXY=...` writes it; direct dropped, off appended
        ("http://127.0.0.1:9/goproxy,direct", None, "http://127.0.0.1:9/goproxy,off"),
        ("http://127.0.0.1:9/a|http://127.0.0.1:9/b|direct", None, "http://127.0.0.1:9/a,http://127.0.0.1:9/b,off"),
        # the operator's override wins over the machine's setting
        ("http://127.0.0.1:9/goproxy", "http://127.0.0.1:9/other", "http://127.0.0.1:9/other,off"),
    ],
)
def test_build_peers_takes_the_machines_go_proxy(
    tmp_path: Path, stand_ins: Callable[[str, str], Path], setting: str, override: str | None, expected: str
) -> None:
    record = tmp_path / "proxies"
    bindir = _go_wrapper(stand_ins, record)
    goenv = tmp_path / "goenv"
    goenv.write_text(f"GOPROXY={setting}\n")
    env = {"GOENV": str(goenv)}
    if override is not None:
        env["NETPLUGIN_GOPROXY"] = override
    done = _peers(bindir, tmp_path, **env)
    assert done.returncode == 3, done.stderr  # every build failed (the stand-in), each named
    used = set(record.read_text().split())
    assert used == {expected}, done.stderr


@needs_go
@pytest.mark.parametrize("setting", ["direct", "off", "direct,off"])
def test_build_peers_refuses_a_go_proxy_setting_that_names_no_proxy(
    tmp_path: Path, stand_ins: Callable[[str, str], Path], setting: str
) -> None:
    record = tmp_path / "proxies"
    bindir = _go_wrapper(stand_ins, record)
    goenv = tmp_path / "goenv"
    goenv.write_text(f"GOPROXY={setting}\n")
    done = _peers(bindir, tmp_path, GOENV=str(goenv))
    assert done.returncode == 2, done.stderr
    assert "names no module proxy" in done.stderr and "NETPLUGIN_GOPROXY" in done.stderr
    assert not record.exists()  # nothing was built, nothing fetched
    assert not (tmp_path / "cache").exists()


def _image(
    tmp_path: Path, stand_ins: Callable[[str, str], Path], args: list[str], **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    record = tmp_path / "mmdebstrap.argv"
    stand_ins("podman", "exit 1")  # no image exists: the base must be made
    bindir = stand_ins("mmdebstrap", f'printf "%s\\n" "$@" >{record}; exit 1')
    sources = tmp_path / "sources.list.d"
    sources.mkdir()
    (sources / "test.sources").write_text(
        "Types: deb\nURIs: http://127.0.0.1:9/local-debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://127.0.0.1:9/other-suite\nSuites: trixie\nComponents: main\n"
    )
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir::Etc::sourcelist "/dev/null";\nDir::Etc::sourceparts "{sources}";\n')
    base = {k: v for k, v in os.environ.items() if k != "NETPLUGIN_DEBIAN_MIRROR"}
    full = {**base, "PATH": f"{bindir}:{os.environ['PATH']}", "APT_CONFIG": str(conf), **env}
    done = subprocess.run(
        ["bash", str(IMAGE), *args], capture_output=True, text=True, timeout=120, env=full, stdin=subprocess.DEVNULL
    )
    return done, record


@needs_apt
@pytest.mark.parametrize(
    ("args", "env", "mirror"),
    [
        ([], {}, "http://127.0.0.1:9/local-debian"),
        (["--suite", "trixie"], {}, "http://127.0.0.1:9/other-suite"),
        (["--mirror", "http://127.0.0.1:9/given"], {}, "http://127.0.0.1:9/given"),
        ([], {"NETPLUGIN_DEBIAN_MIRROR": "http://127.0.0.1:9/from-env"}, "http://127.0.0.1:9/from-env"),
    ],
)
def test_build_image_takes_the_machines_debian_mirror(
    tmp_path: Path, stand_ins: Callable[[str, str], Path], args: list[str], env: dict[str, str], mirror: str
) -> None:
    done, record = _image(tmp_path, stand_ins, args, **env)
    assert done.returncode == 1 and "mmdebstrap failed" in done.stderr, done.stderr
    argv = record.read_text().splitlines()
    assert argv[-1] == mirror, argv


@needs_apt
def test_build_image_without_a_mirror_for_the_suite_says_how_to_give_one(
    tmp_path: Path, stand_ins: Callable[[str, str], Path]
) -> None:
    done, record = _image(tmp_path, stand_ins, ["--suite", "sid"])
    assert done.returncode == 2, done.stderr
    assert "no mirror for the suite sid" in done.stderr and "--mirror" in done.stderr
    assert not record.exists()
