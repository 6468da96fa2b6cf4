"""``netplugin doctor``'s checks: does this node work as installed? Each check is data, not text.

In detail: ``ARCHITECTURE.md``, "Module notes".
"""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netplugin.agent.problems import POD_KINDS, NodeProblem
from netplugin.core.chaining import DECLARES_HOST_PORTS
from netplugin.core.defaults import FIGHT_ROUNDS
from netplugin.core.dirs import UnsafeDirectory, ensure_dir
from netplugin.core.errors import NetpluginError
from netplugin.core.hostports import ENV_LOCALHOST, localhost_enabled
from netplugin.core.names import escape_plugin_name
from netplugin.frontends.cni.installed import (
    CNI_BIN_DIRS,
    CONF_SUFFIXES,
    SHIM_NAME,
    call_conf_of,
    inline_differences,
    load_conflist,
    safe_call_conf,
    shim_problem,
)
from netplugin.frontends.cni.native import slots
from netplugin.frontends.cni.netconf import build_config
from netplugin.frontends.cni.router import daemon_target
from netplugin.frontends.cni.spec import CniRequest
from netplugin.frontends.wire.client import NoAnswer, NotSent, exchange
from netplugin.frontends.wire.fingerprint import fingerprint
from netplugin.frontends.wire.protocol import request
from netplugin.manager.manager import Manager
from netplugin.nodenet.egress import parse_cidrs
from netplugin.nodenet.forward import Forward
from netplugin.nodenet.policyagents import KNOWN, seen
from netplugin.plugins.bridge.bridge_plugin import NativeBridgePlugin
from netplugin.plugins.bridge.mtu import node_links, read_record, underlay_mtu
from netplugin.plugins.bridge.sysctls import bridge_netfilter_off
from netplugin.plugins.hostport import HOSTPORT_MEMBERS

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.plugins.bridge.settings import BridgeSettings

__all__ = ["Check", "Node", "run_checks"]


@dataclass(frozen=True)
class Check:
    """One answer: ``found`` says what is there; ``problem`` and ``fix`` are None when it is fine."""

    name: str
    found: str
    problem: str | None = None
    fix: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "found": self.found, "problem": self.problem, "fix": self.fix}


@dataclass
class Node:
    """What the checks learn on the way (the conflist picked, the daemon's health) for later checks."""

    config: Config
    conf_dir: str
    bin_dirs: tuple[str, ...]
    picked: str | None = None
    call_conf: dict[str, Any] | None = None
    health: dict[str, Any] | None = None


def check_conflist(node: Node) -> Check:
    # libcni's ConfFiles skips directories (by lstat: a symbolic link is read, and fails, as a file)
    found = glob.glob(os.path.join(node.conf_dir, "*"))
    files = sorted(p for p in found if p.endswith(CONF_SUFFIXES) and not (os.path.isdir(p) and not os.path.islink(p)))
    fix_install = "install it: scripts/install.sh (or netplugin's conflist into the runtime's conf dir)"
    if not files:
        return Check("conflist", f"no network config in {node.conf_dir}", "the runtime has no network", fix_install)
    try:
        first = load_conflist(files[0])
    except (OSError, ValueError) as e:
        return Check(
            "conflist", files[0], f"the runtime picks {files[0]}, which cannot be read: {e}", "fix or remove it"
        )
    node.call_conf = call_conf_of(first)
    if node.call_conf is None:
        ours = [f for f in files[1:] if safe_call_conf(f) is not None]
        where = f" (netplugin's is {ours[0]})" if ours else ""
        return Check(
            "conflist",
            f"{len(files)} config(s) in {node.conf_dir}",
            f"the runtime picks {os.path.basename(files[0])}, which is not netplugin's{where}",
            "remove or rename the configs sorting before netplugin's (the runtime uses the first by name)",
        )
    node.picked = files[0]
    others = f"; {len(files) - 1} other(s) ignored" if len(files) > 1 else ""
    return Check("conflist", f"{files[0]} (the runtime picks it{others})")


def check_shim(node: Node) -> Check:
    found = [os.path.join(d, SHIM_NAME) for d in node.bin_dirs if os.path.isfile(os.path.join(d, SHIM_NAME))]
    fix = "reinstall it: scripts/install.sh, or netplugin install-shim DIR"
    if not found:
        return Check("shim", f"no {SHIM_NAME} in {', '.join(node.bin_dirs)}", "the runtime cannot run netplugin", fix)
    problem = shim_problem(found[0]) or _slot_problem(found[0], node)
    return Check("shim", f"{found[0]}", problem, fix if problem else None)


def _slot_problem(path: str, node: Node) -> str | None:
    """A compiled shim calls the socket written into it: the one a call from the conflist must reach."""
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF" or node.call_conf is None:
            return None
    try:
        written = slots(path)["socket"]
    except ValueError as e:
        return str(e)
    sock = daemon_target(node.call_conf, {})[1]
    if written != sock:
        return f"{path} (compiled) calls the daemon at {written}, but the conflist's socket is {sock}"
    return None


def check_daemon(node: Node) -> Check:
    if node.call_conf is None:
        return Check("daemon", "no netplugin conflist picked", "calls reach neither netplugin nor its daemon")
    mode, sock = daemon_target(node.call_conf, {})
    start = "start it: systemctl start netplugin (a DaemonSet: its pod)"
    if mode == "never":
        return Check("daemon", "use_daemon: never", "calls never reach the daemon", "remove use_daemon: never")
    try:
        answer = exchange(sock, request("health"), timeout=10)
    except (NotSent, NoAnswer) as e:
        if isinstance(e.__cause__, PermissionError):
            # The daemon may well be up: only root (or the daemon's user) may use its socket.
            return Check("daemon", sock, f"cannot use {sock} ({e})", "run netplugin doctor as root (sudo)")
        return Check("daemon", sock, f"no daemon answers at {sock} ({e}): calls run alone, slower, unobserved", start)
    if not answer.get("ok"):
        said = (answer.get("error") or {}).get("message", "")
        return Check("daemon", sock, f"the daemon does not serve: {said}", start)
    node.health = answer["result"]
    try:
        mine = fingerprint(build_config(CniRequest(command="ADD", conf=node.call_conf), {}))
    except NetpluginError as e:
        return Check("daemon", sock, f"the conflist's settings are invalid: {e.message}", "fix the config file")
    theirs = node.health.get("config") or {}
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        return Check(
            "daemon",
            f"{sock} (pid {node.health.get('pid')})",
            f"calls from the conflist would not reach the daemon: their settings differ in {', '.join(differ)}",
            "keep every setting in the config file only, then systemctl reload netplugin",
        )
    return Check("daemon", f"{sock} (pid {node.health.get('pid')}): calls from the conflist reach it")


def check_settings(node: Node) -> Check:
    if node.call_conf is None:
        return Check("settings", "no netplugin conflist", "nothing reads the config file", "install the conflist")
    try:
        inline = inline_differences(node.call_conf)
    except NetpluginError as e:
        return Check("settings", str(node.call_conf.get("configFile")), e.message, "fix the config file")
    path = node.call_conf.get("configFile") or "the default config file"
    if inline:
        return Check(
            "settings",
            f"{node.picked}",
            f"the conflist's own settings override {path} in {', '.join(inline)}",
            "move them into the config file and keep only configFile and runDir in the conflist",
        )
    refused = (node.health or {}).get("refused")
    if refused:
        fix = "fix the file (netplugin config check), then systemctl reload netplugin"
        return Check("settings", str(path), f"the daemon says: {refused}", fix)
    status = (node.health or {}).get("settings", "")
    if status.startswith("not reloaded") or "keeps its running settings" in status:
        return Check(
            "settings", str(path), f"the daemon says: {status}", "fix the file, or systemctl restart netplugin"
        )
    return Check("settings", f"{path}: the conflist adds nothing; {status or 'daemon not asked'}")


def check_plugin(node: Node) -> Check:
    cfg = node.config
    name = cfg.plugin or "kubernetes.io/no-op"
    if node.health is not None:
        problem = node.health.get("plugin_problem")
        if problem:
            return Check(
                "plugin",
                name,
                f"the daemon's plugin is not ready: {problem}",
                "fix it, then systemctl reload netplugin",
            )
        return Check("plugin", f"{node.health.get('plugin')}: selected and initialised by the daemon")

    try:
        m = Manager(cfg, state=False)
        selected = m.plugin.name
        done = m.init_done()
    except NetpluginError as e:
        return Check("plugin", name, e.message, "install the plugin or fix the plugin key in the config file")
    if not done:
        return Check("plugin", selected, "init has not run this boot with these settings", "netplugin init")
    return Check("plugin", f"{selected}: valid, init ran this boot")


def check_node(node: Node) -> Check:
    cfg = node.config
    if cfg.host == "none":
        return Check("node", "host: none (no cluster: no pod CIDRs, no routes to other nodes)")
    if node.health is None:
        return Check("node", f"host: {cfg.host}", "unknown: only the daemon keeps the node's view", "start the daemon")
    st = node.health.get("node") or {}
    me, cidrs, routes = st.get("name"), st.get("pod_cidrs") or [], st.get("routes") or []
    if st.get("error"):
        return Check(
            "node", f"node {me}", f"the daemon cannot read the cluster: {st['error']}", "check kubeconfig/RBAC"
        )
    if not cidrs and cfg.env.get("NETPLUGIN_BRIDGE_SUBNET") == "node":
        return Check(
            "node",
            f"node {me}",
            f"node {me} has no pod CIDRs (spec.podCIDRs): every pod ADD fails",
            "kube-controller-manager --allocate-node-cidrs --cluster-cidr=..., or set the Node's podCIDRs by hand",
        )
    found = f"node {me}: pod CIDRs {', '.join(cidrs) or 'none'}; {len(routes)} route(s) to {st.get('nodes')} node(s)"
    if problems := [p for p in map(NodeProblem.from_dict, st.get("problems") or []) if p.kind not in POD_KINDS]:
        text = "; ".join(f"{p.node} {p.cidr}: {p.reason}" for p in problems[:5])
        return Check("node", found, f"{len(problems)} node(s) cannot be routed: {text}", "see netplugin nodes")
    return Check("node", found)


def check_egress(node: Node) -> Check:
    cfg = node.config
    if not cfg.cluster_cidrs:
        return Check("egress", "no cluster_cidrs: pod traffic is not masqueraded")
    egress = ((node.health or {}).get("node") or {}).get("egress")
    if node.health is None or not egress:
        return Check("egress", "cluster_cidrs set", "no daemon keeps the egress table", "start the daemon")
    if not egress.get("applied"):
        return Check(
            "egress", f"table {egress.get('table')}", "the masquerade table is not installed", "see the daemon's log"
        )
    return Check(
        "egress", f"table inet {egress.get('table')} masquerades traffic leaving {', '.join(cfg.cluster_cidrs)}"
    )


#: repairs since the daemon started past which they count as recurring (someone keeps undoing them)
RECURRING_REPAIRS = 3


def check_repairs(node: Node) -> Check:
    st = (node.health or {}).get("node") or {}
    repairs = st.get("repairs") or {}
    if node.health is None:
        return Check("repairs", "no daemon: nothing repairs what netplugin keeps in the kernel")
    made = ", ".join(f"{kind} {n}" for kind, n in sorted(repairs.items())) or "none"
    found = f"since the daemon started: {made}"
    broken = st.get("broken") or {}
    if broken:
        text = "; ".join(f"{pod}: {why}" for pod, why in sorted(broken.items())[:5])
        fix = "delete those pods (the kubelet makes them a new sandbox), or netplugin teardown NS NAME INFRA_ID"
        return Check("repairs", found, f"{len(broken)} pod(s) broken: {text}", fix)
    if loops := st.get("repair_loops") or {}:
        text = "; ".join(f"{pod}: {why}" for pod, why in sorted(loops.items())[:5])
        fix = "fix the member's repair (it must not remove what it puts back); the pod is repaired once set up anew"
        return Check("repairs", found, f"{len(loops)} pod(s) whose repair re-triggers itself: {text}", fix)
    n, secs = (st.get("longest_fight") or {}).get("rounds", 0), (st.get("longest_fight") or {}).get("seconds", 0)
    if n >= FIGHT_ROUNDS:
        why = f"a fight: the daemon put back what netplugin made {n} times in a row over {secs:.0f}s: something"
        fix = "find what removes it (an agent deleting the bridge, a firewall or script flushing); see the 'repair' log"
        return Check("repairs", f"{found} (longest fight: {n} rounds)", f"{why} on the node keeps removing it", fix)
    # Incidents, not objects: one deleted bridge puts back every pod's port, once.
    incidents = st.get("repair_incidents", sum(repairs.values()))
    if incidents >= RECURRING_REPAIRS:
        return Check(
            "repairs",
            f"{found} ({incidents} incidents)",
            "the daemon keeps putting back what netplugin made (routes, tables, the bridge, ports, qdiscs): "
            "something on the node keeps removing them",
            "find what flushes them (a firewall reload, a network manager, a script); see the daemon's 'repair' log",
        )
    return Check("repairs", found)


def check_keepers(node: Node) -> Check:
    if node.health is None:
        return Check("keepers", "no daemon: no keeper runs")
    found = f"keepers: {', '.join(sorted(node.health.get('keepers') or {})) or 'none'}"
    if problems := node.health.get("keeper_problems") or []:
        return Check("keepers", found, "; ".join(problems), "see the daemon's ERROR lines; systemctl restart netplugin")
    return Check("keepers", f"{found}: running")


def check_dirs(node: Node) -> Check:
    found, problems = [], []
    for what, path in (("state", node.config.state_dir), ("run", node.config.run_dir)):
        try:
            there = ensure_dir(path, create=False)
        except UnsafeDirectory as e:
            problems.append(e.message)
            continue
        found.append(f"{what} {path}" + ("" if there else " (not created yet)"))
    if problems:
        return Check("dirs", ", ".join(found), "; ".join(problems), "chown root: DIR; chmod go-w DIR (no links)")
    return Check("dirs", ", ".join(found) + ": netplugin's own")


_BRIDGES = ("bridge", "netplugin.io/bridge")


def _bridge_settings(node: Node) -> BridgeSettings | None:
    """The bridge plugin's settings when the chain has one (else None), as its init reads them."""
    if not any(m in _BRIDGES for m in node.config.chain):
        return None

    cfg = node.config
    return NativeBridgePlugin.from_config(cfg).settings(cfg.env, cfg.state_dir, subnets_optional=True)


def _pod_families(node: Node, s: BridgeSettings) -> set[int]:
    """The IP versions of the bridge's pods: its subnets, or with SUBNET=node (no subnet in the
    settings) the node's pod CIDRs as the daemon knows them; IPv4 when neither says."""
    if s.subnets:
        return {n.version for n in s.subnets}
    cidrs = ((node.health or {}).get("node") or {}).get("pod_cidrs") or []
    return {ipaddress.ip_network(c, strict=False).version for c in cidrs} or {4}


def check_bridge_netfilter(node: Node) -> Check:
    s = _bridge_settings(node)
    # netlink, not /sys/class/net/BRIDGE/brif: sysfs may show another netns's links (see node_links)
    links = node_links() if s is not None else []
    bridges = {link.index for link in links if s is not None and link.name == s.name}
    ports = [link.name for link in links if link.master is not None and link.master in bridges]
    if s is None or not ports:
        return Check("bridge_netfilter", "no bridge serving pods")
    off = bridge_netfilter_off(sorted(_pod_families(node, s)))
    if off:
        why = f"{', '.join(off)} off while bridge {s.name} serves {len(ports)} pod(s)"
        why += ": a Service whose backend is on the same bridge does not answer"
        fix = "NETPLUGIN_BRIDGE_BR_NETFILTER=true (the default), then netplugin init"
        return Check("bridge_netfilter", s.name, why, fix)
    return Check("bridge_netfilter", f"bridged pod traffic passes netfilter ({s.name})")


def check_policy(node: Node) -> Check:
    agents = seen()
    if not agents:
        return Check("policy", f"no NetworkPolicy agent seen (looked for {', '.join(a.name for a in KNOWN)})")
    found = "; ".join(f"{a.agent} ({a.evidence})" for a in agents)
    s = _bridge_settings(node)
    off = bridge_netfilter_off(sorted(_pod_families(node, s))) if s is not None else []
    if s is not None and off:
        names = ", ".join(a.agent for a in agents)
        why = f"{', '.join(off)} off while {names} enforces NetworkPolicy: traffic between pods on bridge {s.name}"
        why += " is switched past its rules, so policies do not apply between pods of this node"
        fix = "NETPLUGIN_BRIDGE_BR_NETFILTER=true (the default), then netplugin init"
        return Check("policy", found, why, fix)
    return Check("policy", found)


def check_forward(node: Node) -> Check:
    s = _bridge_settings(node)
    pod_cidrs = ((node.health or {}).get("node") or {}).get("pod_cidrs") or []
    cidrs = [*parse_cidrs("cluster_cidrs", node.config.cluster_cidrs), *parse_cidrs("pod_cidrs", pod_cidrs)]
    cidrs += list(s.subnets) if s else []
    problems = [p for p in (st.problem(cidrs) for st in Forward().check()) if p]
    if problems:
        fix = "set cluster_cidrs and start the daemon (it keeps the chain), or accept the pod CIDRs in FORWARD"
        return Check("forward", "FORWARD policy DROP", "; ".join(problems), fix)
    return Check("forward", "pod traffic is not dropped in FORWARD")


def check_mtu(node: Node) -> Check:
    s = _bridge_settings(node)
    if s is None:
        return Check("mtu", "no bridge plugin")
    underlay = underlay_mtu(node_links(), s.name)
    mtu = s.mtu if s.mtu is not None else read_record(s.mtu_record)
    if mtu is not None and mtu > underlay:
        how = "configured" if s.mtu is not None else "found by init"
        fix = "NETPLUGIN_BRIDGE_MTU=auto (the default), then netplugin init; pods started since keep theirs"
        why = f"the pods' MTU {mtu} ({how}) is above the underlay's {underlay}"
        return Check("mtu", f"{s.name} mtu {mtu}", why, fix)
    return Check("mtu", f"{s.name} mtu {mtu or 'auto (init not run)'}, underlay {underlay}")


def _maps_host_ports(cfg: Config, name: str) -> bool:
    """Whether chain member ``name`` maps hostPorts: one netplugin ships, or one whose init declared it."""
    if name in HOSTPORT_MEMBERS:
        return True
    try:
        with open(os.path.join(cfg.run_dir, "init", escape_plugin_name(name) + ".json"), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False  # no init ran yet: what it will declare is not known
    return isinstance(marker, dict) and DECLARES_HOST_PORTS in (marker.get("actions") or [])


def check_hostport(node: Node) -> Check:
    cfg = node.config
    member = next((m for m in cfg.chain if _maps_host_ports(cfg, m)), None)
    if member is None:
        caps = (node.call_conf or {}).get("capabilities")
        if isinstance(caps, dict) and caps.get("portMappings") is True:
            chain = list(cfg.chain)
            add = HOSTPORT_MEMBERS[0] if any("/" in m for m in chain) else HOSTPORT_MEMBERS[1]
            where = cfg.config_path or "the config file"
            return Check(
                "hostport",
                f"no hostport member in the chain ({', '.join(chain)})",
                f"{node.picked} declares portMappings, but no member of the chain maps them: every pod with a "
                "hostPort fails its ADD (a pod without the ports it asked for must not start)",
                f"add the hostport member after the bridge in {where}: plugins: [{', '.join([*chain, add])}], "
                "then systemctl reload netplugin (scripts/install.sh --plugins "
                f"{','.join([*chain, add])})",
            )
        return Check("hostport", "no hostport member in the chain")
    localhost = localhost_enabled(cfg.env)
    state = "on (route_localnet on the pod bridge)" if localhost else f"off ({ENV_LOCALHOST}=false)"
    what = f"{member}; 127.0.0.1 hostPorts {state}"
    if shutil.which("conntrack", path=cfg.env.get("PATH") or os.environ.get("PATH")) is None:
        why = "no conntrack command: a UDP flow that reached the node before a pod's hostPort keeps missing the pod"
        return Check("hostport", what, why, "install conntrack (Debian: apt-get install conntrack)")
    return Check("hostport", what)


#: the checks, in the order they run (later ones use what earlier ones learned)
CHECKS = (
    check_conflist,
    check_shim,
    check_daemon,
    check_settings,
    check_plugin,
    check_node,
    check_egress,
    check_bridge_netfilter,
    check_policy,
    check_forward,
    check_mtu,
    check_hostport,
    check_repairs,
    check_keepers,
    check_dirs,
)


def run_checks(config: Config, conf_dir: str, bin_dirs: tuple[str, ...] = CNI_BIN_DIRS) -> list[Check]:
    """Every check on this node; never raises for what it finds (a NetpluginError is that check's problem)."""
    node = Node(config, conf_dir, bin_dirs)
    out = []
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        try:
            out.append(check(node))
        except NetpluginError as e:
            out.append(Check(name, "", e.message))
        except OSError as e:
            out.append(Check(name, "", f"{e.filename or ''}: {e.strerror or e}"))
    return out
