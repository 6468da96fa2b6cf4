"""What is installed for the container runtime: the CNI network configs and the ``netplugin-cni`` shim.

Where runtimes look for both, the network config a runtime sends the shim (libcni merges the
list's name and version in), which netplugin wrote a shim (and whether it answers ``VERSION``),
and which settings a conflist's own values change. ``netplugin doctor``
(:mod:`netplugin.frontends.checks`) and ``netplugin version`` read them.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from netplugin import __version__
from netplugin.core._yaml import load_json, read_document
from netplugin.core.config import load_config
from netplugin.frontends.cni.native import MAX_BINARY
from netplugin.frontends.cni.netconf import build_config
from netplugin.frontends.cni.spec import CniRequest
from netplugin.frontends.wire.fingerprint import fingerprint
from netplugin.frontends.wire.protocol import CNI_VERSIONS

__all__ = [
    "CNI_BIN_DIRS",
    "CONF_SUFFIXES",
    "SHIM_NAME",
    "call_conf_of",
    "inline_differences",
    "load_conflist",
    "safe_call_conf",
    "shim_problem",
    "written_by",
]

#: where runtimes look for CNI plugins (containerd's default, then Debian's)
CNI_BIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni")
#: the files libcni reads as network configs
CONF_SUFFIXES = (".conf", ".conflist", ".json")
SHIM_NAME = "netplugin-cni"


def load_conflist(path: str) -> dict[str, Any]:
    """A network config file as a JSON object (bounded read); OSError or ValueError otherwise."""
    doc = load_json(read_document(path, 1 << 20))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def call_conf_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The config a runtime sends netplugin-cni for this network (libcni merges name and version in)."""
    listed = doc.get("plugins")
    plugins: list[Any] = listed if isinstance(listed, list) else [doc]
    for p in plugins:
        if isinstance(p, dict) and p.get("type") == SHIM_NAME:
            return {**p, "name": doc.get("name"), "cniVersion": doc.get("cniVersion")}
    return None


def safe_call_conf(path: str) -> dict[str, Any] | None:
    """:func:`call_conf_of` a file; None also when it cannot be read."""
    try:
        return call_conf_of(load_conflist(path))
    except (OSError, ValueError):
        return None


def written_by(head: bytes) -> str | None:
    """The netplugin version that wrote a Python entry script (its first bytes); None: not one."""
    marker = b"(netplugin "
    if head.startswith(b"#!") and marker in head:
        return head.split(marker, 1)[1].split(b")", 1)[0].decode(errors="replace")
    return None


def shim_problem(path: str) -> str | None:
    with open(path, "rb") as f:
        head = f.read(MAX_BINARY)  # a statically linked shim's own strings sit past libc's
    if b"netplugin" not in head:
        return f"{path} is not netplugin's shim"
    version = written_by(head)
    if version is not None and version != __version__:
        return f"{path} was written by netplugin {version}, this is {__version__}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "VERSION"}
    try:
        done = subprocess.run([path], input=b"", capture_output=True, env=env, timeout=20, check=False)
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return f"{path} does not run: {e}"
    if not isinstance(answer, dict) or answer.get("supportedVersions") != list(CNI_VERSIONS):
        return f"{path} answers VERSION with {done.stdout[:200]!r} {done.stderr[-200:]!r}"
    return None


def inline_differences(call_conf: dict[str, Any]) -> list[str]:
    """Settings keys in which the conflist's own values make the call's config differ from its config file's."""
    path = call_conf.get("configFile")
    call = fingerprint(build_config(CniRequest(command="ADD", conf=call_conf), {}))
    alone = fingerprint(load_config(path if isinstance(path, str) else None, environ={}))
    return sorted(k for k in set(call) | set(alone) if call.get(k) != alone.get(k))
