"""Fixtures for the deployment suites: netplugin's wheel and sdist, built once per session from this tree.

The tree is copied first (setuptools writes build/ and *.egg-info into the tree it builds), and
``SOURCE_DATE_EPOCH`` is fixed, as scripts/install.sh does, so the wheel is reproducible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what a distribution is built from (everything else in the checkout stays out of it)
DIST_INPUTS = ["pyproject.toml", "README.md", "LICENSE", "netplugin", "exec_plugins", "etc", "scripts", "man"]


def copy_dist_inputs(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for item in DIST_INPUTS:
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, dest / item, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
        else:
            shutil.copy2(src, dest / item)
    return dest


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"wheel": path, "sdist": path}, built with PyPA's `build` from a copy of this tree."""
    tmp = tmp_path_factory.mktemp("dist")
    src = copy_dist_inputs(tmp / "src")
    out = tmp / "out"
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = out.glob("netplugin-*.whl")
    [sdist] = out.glob("netplugin-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}
