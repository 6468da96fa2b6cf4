"""The ``version`` command: what runs on this node, each part's version."""

from __future__ import annotations

import os
import platform
from typing import Any

from netplugin import __version__
from netplugin.core.errors import NetpluginError
from netplugin.frontends.cli.context import LOCAL, State, pass_state
from netplugin.frontends.cli.options import cni_bin_dirs, command
from netplugin.frontends.cni.installed import CNI_BIN_DIRS, SHIM_NAME, written_by
from netplugin.frontends.cni.native import version_of

__all__ = ["version"]


def _shim(bin_dirs: tuple[str, ...]) -> dict[str, Any] | None:
    """The first installed shim: its path and kind, and the version that wrote it (a Python entry)
    or built it (the compiled shim)."""
    for d in bin_dirs:
        path = os.path.join(d, SHIM_NAME)
        try:
            with open(path, "rb") as f:
                head = f.read(4096)
        except FileNotFoundError:
            continue
        except OSError as e:
            return {"path": path, "kind": None, "version": None, "problem": e.strerror or str(e)}
        if head.startswith(b"\x7fELF"):
            try:
                # Read from the binary (what `netplugin-cni --version` prints), never by running it.
                return {"path": path, "kind": "compiled", "version": version_of(path), "problem": None}
            except (OSError, ValueError) as e:
                return {"path": path, "kind": "compiled", "version": None, "problem": str(e)}
        return {"path": path, "kind": "python", "version": written_by(head), "problem": None}
    return None


def _daemon(st: State) -> dict[str, Any] | None:
    """The daemon's version when it answers (None: it does not)."""
    try:
        health = st.daemon("health")
    except NetpluginError:
        return None
    if health is LOCAL:
        return None
    return {"version": health.get("version"), "pid": health.get("pid")}


def _chain(st: State) -> tuple[list[dict[str, Any]], str | None]:
    try:
        return [{"name": p.name, "version": p.version()} for p in st.manager.plugins], None
    except NetpluginError as e:
        return [], e.message


def _text(doc: dict[str, Any]) -> str:
    daemon, shim = doc["daemon"], doc["shim"]
    lines = [f"netplugin {doc['cli']['version']} (Python {doc['cli']['python']})"]
    lines.append(f"daemon:  {daemon['version']} (pid {daemon['pid']})" if daemon else "daemon:  not running")
    if shim is None:
        lines.append("shim:    not installed")
    else:
        what = shim["version"] or shim["problem"] or "unknown"
        kind = f" {shim['kind']}" if shim["kind"] else ""
        lines.append(f"shim:    {what}{kind} ({shim['path']})")
    for p in doc["chain"]:
        lines.append(f"plugin:  {p['name']} {p['version']}")
    if doc["chain_problem"]:
        lines.append(f"plugin:  {doc['chain_problem']}")
    return "\n".join(lines)


@command()
@cni_bin_dirs
@pass_state
def version(st: State, bin_dirs: tuple[str, ...]) -> None:
    """Print the versions of the CLI, the daemon (if it runs), the installed shim and the plugin chain.

    \b
    Examples:
      netplugin version
      netplugin version -o yaml
    """
    chain, problem = _chain(st)
    doc = {
        "cli": {"version": __version__, "python": platform.python_version()},
        "daemon": _daemon(st),
        "shim": _shim(bin_dirs or CNI_BIN_DIRS),
        "chain": chain,
        "chain_problem": problem,
    }
    st.emit(doc, _text(doc))
