"""One node, one configuration: the shipped conflist, unit, ConfigMap and config file produce the same settings.

For both layouts the installer runs for real (into temp dirs, --no-venv), then two configs are
built exactly as the two readers build them:

* the daemon's: ``load_config`` of the file its command line names (the unit's ``ExecStart=`` or the
  DaemonSet container's ``command``), with its environment (``Environment=`` / ``env``);
* a CNI call's: ``build_config`` of the conflist the installer wrote, as the shim and the daemon's
  ``cni`` op do, with a runtime's environment (no NETPLUGIN_* variables).

They must be equal in every setting that decides what an operation does (the fingerprint the daemon
compares), the socket the shim finds must be the daemon's (the Python shim's through the conflist's
runDir, the compiled shim's from the slot install.sh wrote into it), and the conflist must carry no
setting of its own. A cluster node's compiled shim is in cluster mode (no fallback: CNI error 11).
The drift cases show that each kind of disagreement is caught, naming the key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from netplugin.core.config import load_config
from netplugin.core.defaults import DEFAULT_CONFIG, DEFAULT_RUN_DIR
from netplugin.core.errors import ConfigError
from netplugin.frontends.cni.native import build_native, install_built, slots
from netplugin.frontends.cni.netconf import build_config
from netplugin.frontends.cni.router import daemon_target
from netplugin.frontends.cni.spec import CniRequest
from netplugin.frontends.wire.fingerprint import fingerprint
from tests.support.shipped import REPO, configmap_settings, init_install_argv, main_container, run_install, unit_command

UNIT = REPO / "etc" / "systemd" / "netplugin.service"
CONFLIST = REPO / "etc" / "cni" / "10-netplugin.conflist"
#: the keys a conflist entry of netplugin-cni may have: where the settings are, none of them
# capabilities: what the runtime passes (portMappings), not a netplugin setting
NO_SETTINGS = {"type", "configFile", "runDir", "logFile", "capabilities"}


def _call_conf(conflist: dict[str, Any]) -> dict[str, Any]:
    [plugin] = [p for p in conflist["plugins"] if p["type"] == "netplugin-cni"]
    return {**plugin, "name": conflist["name"], "cniVersion": conflist["cniVersion"]}


Node = tuple[dict[str, Any], list[str], dict[str, str], Path]


def disagreement(
    call_conf: dict[str, Any], argv: list[str], env: dict[str, str], shim: Path | None = None
) -> list[str]:
    """What differs between the daemon started as ``argv``/``env`` and a call made with ``call_conf``
    through the installed ``shim`` (the compiled one: its socket slot)."""
    assert argv[1:3] == ["serve", "--config"] and len(argv) == 4, argv  # no other flag: all in the file
    netplugin_env = {k: v for k, v in env.items() if k.startswith("NETPLUGIN_")}
    daemon = load_config(argv[3], environ=netplugin_env)
    try:
        call = build_config(CniRequest(command="ADD", conf=call_conf), {})
    except ConfigError as e:  # the call's settings cannot even be built: the key that says why
        return [e.key]
    mine, theirs = fingerprint(daemon), fingerprint(call)
    out = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if daemon_target(call_conf, {})[1] != daemon.socket_path:
        out.append("socket")
    if shim is not None and slots(str(shim))["socket"] != daemon.socket_path:
        out.append("shim-socket")
    out += sorted(f"conflist:{k}" for k in set(call_conf) - NO_SETTINGS - {"name", "cniVersion"})
    out += sorted(f"environment:{k}" for k in netplugin_env)
    return out


# --- a single node: install.sh, its conflist and config, and the unit -------------------------------


def _single_node(tmp_path: Path) -> Node:
    root = tmp_path / "node"
    config = root / "etc" / "netplugin" / "netplugin.yaml"
    argv = ["bash", str(REPO / "scripts" / "install.sh"), "--no-venv", "--python", sys.executable]
    for flag in ("--exec-dir", "--cni-bin-dir", "--cni-conf-dir", "--state-dir", "--run-dir"):
        argv += [flag, str(root / flag.strip("-"))]
    done = run_install([*argv, "--config", str(config)])
    assert done.returncode == 0, done.stdout + done.stderr
    conflist = json.loads((root / "cni-conf-dir" / "10-netplugin.conflist").read_text())
    start, env, _ = unit_command(UNIT)
    # The unit as installed names this node's config file (install.sh writes its --config there).
    assert start[-2:] == ["--config", DEFAULT_CONFIG]
    return _call_conf(conflist), [*start[:-1], str(config)], env, root / "cni-bin-dir" / "netplugin-cni"


def test_shipped_conflist_and_unit_name_the_same_file() -> None:
    call = _call_conf(json.loads(CONFLIST.read_text()))
    start, env, _ = unit_command(UNIT)
    assert call == {**call, "configFile": DEFAULT_CONFIG, "runDir": DEFAULT_RUN_DIR}
    assert set(call) - {"name", "cniVersion"} <= NO_SETTINGS
    assert start[-3:] == ["serve", "--config", DEFAULT_CONFIG]
    assert not [k for k in env if k.startswith("NETPLUGIN_")]


def test_single_node_settings_agree(tmp_path: Path) -> None:
    call, argv, env, shim = _single_node(tmp_path)
    assert disagreement(call, argv, env, shim) == []
    # A standalone node's compiled shim runs the Python shim when the daemon does not run a call.
    assert slots(str(shim))["fallback"] == str(shim.parent / "netplugin-cni-python")


@pytest.mark.parametrize(
    ("drift", "caught"),
    [
        pytest.param(lambda c, a, e: c.update(env={"NETPLUGIN_BRIDGE_MTU": "1400"}), "env", id="conflist-env"),
        pytest.param(lambda c, a, e: c.update(plugin="loopback"), "plugin", id="conflist-plugin"),
        pytest.param(lambda c, a, e: c.update(runDir="/run/elsewhere"), "run_dir", id="conflist-run-dir"),
        pytest.param(lambda c, a, e: e.update(NETPLUGIN_PLUGIN="loopback"), "plugin", id="unit-environment"),
        pytest.param(lambda c, a, e: c.update(configFile="/dev/null"), "plugin", id="another-config-file"),
    ],
)
def test_single_node_drift_is_caught(tmp_path: Path, drift: Any, caught: str) -> None:
    call, argv, env, shim = _single_node(tmp_path)
    drift(call, argv, env)
    assert caught in disagreement(call, argv, env, shim)


def test_a_compiled_shim_with_another_socket_is_caught(tmp_path: Path) -> None:
    call, argv, env, shim = _single_node(tmp_path)
    install_built(str(shim), str(shim), socket="/run/elsewhere/netplugin.sock")
    assert disagreement(call, argv, env, shim) == ["shim-socket"]


# --- a cluster node: the init container's install steps, the ConfigMap, the DaemonSet's command ------


def _cluster_node(tmp_path: Path, settings: dict[str, Any]) -> Node:
    root = tmp_path / "node"
    # The image's compiled shim, built as its build stage builds it (default socket, no fallback).
    image_shim = Path(build_native(str(tmp_path / "image-netplugin-cni"), fallback=""))

    def remap(path: str) -> str:
        return str(root) + path

    cm = tmp_path / "configmap" / "netplugin.yaml"  # the ConfigMap as mounted, with the node's dirs remapped
    cm.parent.mkdir()
    dirs = {k: remap(settings[k]) for k in ("plugin_dir", "state_dir", "run_dir")}
    cm.write_text(yaml.safe_dump({**settings, **dirs}))
    argv = init_install_argv(remap, cm, sys.executable, native_shim=image_shim)
    assert "--native-shim" in argv  # the DaemonSet installs the image's compiled shim
    done = run_install(argv, NETPLUGIN_LIB_PYTHON=sys.executable)
    assert done.returncode == 0, done.stdout + done.stderr
    conflist = json.loads((root / "etc" / "cni" / "net.d" / "10-netplugin.conflist").read_text())
    c = main_container()
    argv = [*c.get("command", []), *c.get("args", [])]
    env = {e["name"]: e.get("value", "") for e in c.get("env", []) if "value" in e}
    return _call_conf(conflist), [*argv[:-1], remap(argv[-1])], env, root / "opt" / "cni" / "bin" / "netplugin-cni"


def test_cluster_settings_agree_and_are_a_cluster(tmp_path: Path) -> None:
    settings = configmap_settings()
    call, argv, env, shim = _cluster_node(tmp_path, settings)
    assert disagreement(call, argv, env, shim) == []
    # Cluster mode: the compiled shim never falls back to Python; with no daemon it says try again.
    assert slots(str(shim))["fallback"] == ""
    cfg = load_config(argv[-1], environ={})
    # What every node needs without editing: the Node's own pod CIDRs, the cluster's routes, the daemon.
    assert (cfg.host, cfg.env.get("NETPLUGIN_BRIDGE_SUBNET")) == ("kube", "node")
    # hostPorts work as shipped: the bridge, then the hostport member (the conflist declares portMappings)
    assert cfg.chain == ("netplugin.io/bridge", "netplugin.io/hostport")
    assert cfg.node_routes and cfg.cluster_cidrs and cfg.use_daemon == "always"


@pytest.mark.parametrize(
    ("drift", "caught"),
    [
        pytest.param(lambda c, a, e: c.update(env={"NETPLUGIN_BRIDGE_SUBNET": "10.1.0.0/24"}), "env", id="inline-env"),
        pytest.param(lambda c, a, e: e.update(NETPLUGIN_HOST="none"), "host", id="daemonset-env"),
    ],
)
def test_cluster_drift_is_caught(tmp_path: Path, drift: Any, caught: str) -> None:
    call, argv, env, shim = _cluster_node(tmp_path, configmap_settings())
    drift(call, argv, env)
    assert caught in disagreement(call, argv, env, shim)
