"""Where netplugin's shipped files are: the exec plugins, example configs, manifests, the unit.

An installed wheel puts them under ``<prefix>/share/netplugin/`` (``exec_plugins/``, ``etc/``,
``scripts/install.sh``; see ``[tool.setuptools.data-files]`` in pyproject.toml); a checkout has
them at its top. :func:`data_dirs` lists the places to look, first match wins:

1. ``$NETPLUGIN_DATA_DIR`` when set (a packager's choice; nothing else is tried then);
2. the checkout this package was imported from (``netplugin/`` beside ``exec_plugins/``), so that
   an editable install and ``PYTHONPATH=checkout`` use the tree being edited;
3. ``share/netplugin`` under the running interpreter's prefix (a venv, ``pip install --prefix``),
   under the user base (``pip install --user``), and under ``/usr/local`` and ``/usr``.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DATA_DIR_ENV", "data_dirs", "find_data"]

DATA_DIR_ENV = "NETPLUGIN_DATA_DIR"

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def data_dirs(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Directories that may hold netplugin's shipped files, in the order they are tried."""
    env = os.environ if environ is None else environ
    explicit = env.get(DATA_DIR_ENV)
    if explicit:
        return [Path(explicit)]
    out: list[Path] = []
    checkout = _PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "exec_plugins").is_dir():
        out.append(checkout)
    prefixes = [sysconfig.get_path("data"), sys.prefix, site.getuserbase(), "/usr/local", "/usr"]
    for prefix in prefixes:
        candidate = Path(prefix) / "share" / "netplugin"
        if candidate not in out:
            out.append(candidate)
    return out


def find_data(relative: str, environ: Mapping[str, str] | None = None) -> tuple[Path | None, list[Path]]:
    """The first ``<data dir>/relative`` that exists, and every path tried (for an error message)."""
    tried = [d / relative for d in data_dirs(environ)]
    for path in tried:
        if path.exists():
            return path, tried
    return None, tried
