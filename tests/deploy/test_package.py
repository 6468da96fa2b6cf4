"""The distributions: what the wheel and sdist hold, checked by PyPA's own validators too.

twine (``check --strict``: metadata and README rendering as PyPI would) and check-wheel-contents
(the library part holds exactly netplugin/ of this tree) are the real validators; the rest checks
that every shipped file (exec plugins, example configs, manifests, unit, installer) is in the wheel
as data under ``share/netplugin/`` with its bytes and its executable bit.
"""

from __future__ import annotations

import email.parser
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import netplugin

REPO = Path(__file__).resolve().parents[2]

DATA_PREFIX = f"netplugin-{netplugin.__version__}.data/data/share/netplugin/"
#: the tree's shipped files: exec_plugins/ and etc/ entirely, and the node installer
SHIPPED = [
    *(p for top in ("exec_plugins", "etc") for p in sorted((REPO / top).rglob("*")) if p.is_file()),
    REPO / "scripts" / "install.sh",
    REPO / "scripts" / "uninstall.bash",  # install.sh --uninstall sources it
]


def _tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=300)


def test_twine_check_strict_passes(dists: dict[str, Path]) -> None:
    out = _tool("twine", "check", "--strict", str(dists["wheel"]), str(dists["sdist"]))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASSED") == 2, out.stdout


def test_check_wheel_contents_passes(dists: dict[str, Path]) -> None:
    out = _tool(
        "check_wheel_contents",
        "--no-config",
        "--toplevel",
        "netplugin",
        "--package",
        str(REPO / "netplugin"),
        str(dists["wheel"]),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("OK"), out.stdout


def test_wheel_ships_every_shipped_file_as_data_with_its_mode(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as whl:
        infos = {i.filename: i for i in whl.infolist()}
        for src in SHIPPED:
            rel = src.relative_to(REPO)
            name = DATA_PREFIX + str(rel)
            assert name in infos, f"{rel} is not in the wheel (add its directory to [tool.setuptools.data-files])"
            assert whl.read(name) == src.read_bytes(), rel
            wheel_exec = bool((infos[name].external_attr >> 16) & stat.S_IXUSR)
            assert wheel_exec == bool(src.stat().st_mode & stat.S_IXUSR), f"{rel}: executable bit lost"
        data = sorted(n[len(DATA_PREFIX) :] for n in infos if n.startswith(DATA_PREFIX))
    assert data == sorted(str(p.relative_to(REPO)) for p in SHIPPED), "the wheel ships files the tree does not"


def test_wheel_ships_the_man_page(dists: dict[str, Path]) -> None:
    name = f"netplugin-{netplugin.__version__}.data/data/share/man/man1/netplugin.1"
    with zipfile.ZipFile(dists["wheel"]) as whl:
        assert whl.read(name) == (REPO / "man" / "netplugin.1").read_bytes()


def test_wheel_metadata_license_classifiers_urls_extras(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as whl:
        dist_info = f"netplugin-{netplugin.__version__}.dist-info/"
        meta = email.parser.Parser().parsestr(whl.read(dist_info + "METADATA").decode())
        assert whl.read(dist_info + "licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        assert "netplugin/py.typed" in whl.namelist()
        # the compiled shim's source, built on the node by `netplugin install-shim --kind cni-native`
        assert "netplugin/frontends/cni/native/netplugin_cni.c" in whl.namelist()
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier")
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # superseded by the SPDX expression
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Source", "Issues", "Documentation"} <= urls.keys()
    assert meta["Requires-Python"] == ">=3.11"
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("prometheus-client") and 'extra == "daemon"' in r for r in requires)
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]


def test_sdist_holds_what_the_wheel_is_built_from(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for src in [*SHIPPED, REPO / "LICENSE", REPO / "pyproject.toml", REPO / "netplugin" / "__init__.py"]:
        assert str(src.relative_to(REPO)) in names, src
