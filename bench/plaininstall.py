"""The checkout as a plain install runs it: byte-compiled, and started from a venv with no start-up hooks.

Two things make a development checkout start slower than a node installed by ``scripts/install.sh``,
and neither is netplugin's:

* **No .pyc files.** ``pip install`` byte-compiles every module when it installs the wheel. A
  checkout gets its ``__pycache__`` only from the processes that import it, and none at all when
  ``PYTHONDONTWRITEBYTECODE`` is set (this machine's environment sets it): then every process
  compiles the modules it imports from source. :func:`compile_checkout` does what pip does.
* **Foreign ``.pth`` hooks.** This interpreter's site-packages runs an editable install's import
  finder and the machine's own hooks (a CA bundle loader that imports ``certifi``) in every process.
  install.sh's venv has neither. :func:`plain_venv` builds a venv whose site-packages holds the same
  packages (symlinks) and netplugin, but no ``.pth`` file, and a console script written the way pip
  writes it: the CLI started as an installed node starts it.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from .util import REPO, BenchError

__all__ = ["compile_checkout", "plain_venv"]

#: pip's console-script template (pip/_vendor/distlib/scripts.py), for the ``netplugin`` entry point
_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from netplugin.frontends.cli.entry import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def compile_checkout() -> None:
    """Byte-compile the checkout's package, as ``pip install`` does for an installed one."""
    if not compileall.compile_dir(str(REPO / "netplugin"), quiet=1):
        raise BenchError(f"byte-compiling {REPO / 'netplugin'} failed")


def _no_hook(name: str) -> bool:
    """Whether a site-packages entry is a package or its metadata (kept), not a start-up hook (left out)."""
    return not (name.endswith(".pth") or name.startswith("__editable__") or name == "__pycache__"
                or name.startswith("netplugin"))


def plain_venv(dest: Path) -> list[str]:
    """A venv at ``dest`` with this interpreter's packages and this checkout's netplugin, and no
    ``.pth`` hooks; the argv of its ``netplugin`` console script."""
    done = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise BenchError(f"python -m venv {dest} failed: {done.stderr[-400:]}")
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = dest / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    if not site.is_dir():
        raise BenchError(f"the venv at {dest} has no {site}")
    for name in sorted(os.listdir(purelib)):
        if _no_hook(name):
            (site / name).symlink_to(purelib / name)
    (site / "netplugin").symlink_to(REPO / "netplugin")
    script = dest / "bin" / "netplugin"
    script.write_text(_SCRIPT.format(python=dest / "bin" / "python"))
    script.chmod(0o755)
    return [str(script)]
