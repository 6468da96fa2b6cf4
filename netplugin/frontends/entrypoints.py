"""Fast entry scripts for ``netplugin-cni`` and ``netplugin`` (``netplugin install-shim``).

A console script made by pip starts the interpreter with its site hooks: ``site`` scans every
``.pth`` file (editable installs add import hooks there) before netplugin runs, which costs more
than the whole daemon path. The script written here starts ``python -I -S`` instead (isolated:
no ``PYTHON*`` variables, no user site, no current directory on the path; no ``site``) and puts
an explicit path in front: netplugin's own directory, then the directories the installing
interpreter had beyond its standard library (site-packages, for click, yaml and psutil when the
call runs here rather than in the daemon). So a runtime's environment cannot redirect imports,
and start-up is close to the bare interpreter's. Regenerate it after moving or upgrading
Python or netplugin (``scripts/install.sh`` does).
"""

from __future__ import annotations

import os
import subprocess
import sys

import netplugin
from netplugin import __version__
from netplugin.core.errors import SystemFailure
from netplugin.core.fileio import replace_file

__all__ = ["KINDS", "entry_script", "install_entry"]

#: kind -> (module, what it is)
KINDS = {
    "cni": ("netplugin.frontends.cni.router", "netplugin-cni, the CNI plugin container runtimes run"),
    "cli": ("netplugin.frontends.cli.entry", "netplugin, the command line"),
}


def _stdlib_path(python: str) -> list[str]:
    """The interpreter's path with -I -S: what it finds without help."""
    done = subprocess.run(
        [python, "-I", "-S", "-c", "import sys; print('\\n'.join(sys.path))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [p for p in done.stdout.splitlines() if p]


def search_path(python: str) -> list[str]:
    """The explicit path of the script: netplugin's directory, then this interpreter's extras."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(netplugin.__file__)))
    have = set(_stdlib_path(python))
    out = [root]
    for p in sys.path:
        p = os.path.abspath(p) if p else ""
        if p and p not in have and p not in out and os.path.isdir(p) and p != os.getcwd():
            out.append(p)
    return out


def entry_script(kind: str, *, python: str | None = None) -> str:
    """The text of the entry script for ``kind`` (``cni`` or ``cli``)."""
    module, what = KINDS[kind]
    interpreter = os.path.realpath(python or sys.executable)
    path = search_path(interpreter)
    return (
        f"#!{interpreter} -IS\n"
        f"# {what}: written by `netplugin install-shim` (netplugin {__version__}).\n"
        "# Isolated, without site hooks, for a fast start; regenerate it after upgrading Python or netplugin.\n"
        "import sys\n"
        f"sys.path[:0] = {path[:1]!r}\n"
        f"sys.path += {path[1:]!r}\n"
        f"from {module} import main\n"
        "main()\n"
    )


def install_entry(kind: str, dest: str, *, python: str | None = None) -> str:
    """Write the entry script to ``dest`` (atomically, mode 0755); returns the path written.

    Raises SystemFailure when the interpreter cannot be run or the file cannot be written.
    """
    interpreter = os.path.realpath(python or sys.executable)
    try:
        text = entry_script(kind, python=interpreter)
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemFailure("cannot run the interpreter", interpreter, str(e)) from None
    if os.path.isdir(dest):
        dest = os.path.join(dest, "netplugin-cni" if kind == "cni" else "netplugin")
    try:
        replace_file(dest, text.encode(), mode=0o755)
    except OSError as e:
        raise SystemFailure("cannot write the entry script", dest, e.strerror or str(e)) from None
    return dest
