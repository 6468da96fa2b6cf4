"""kube-network-policies, the NetworkPolicy agent, run on a simulated node as its upstream DaemonSet runs it.

``scripts/build-peers.sh`` builds the agent (``kube-network-policies``, the pinned v0.8.0 of
``tests/peers/netpol``) and copies its upstream manifest (``kube-network-policies.yaml``, the
module's ``install.yaml``) into the peer dir. What the manifest says is what runs here:

* its ServiceAccount, ClusterRole and ClusterRoleBinding are applied to the API server as they are;
* its DaemonSet container's ``args`` are the agent's flags, with the Downward API's node name put in
  and the image's ``/bin/netpol`` replaced by the built binary;
* ``hostNetwork: true``: the agent runs in the node's network namespace (where netplugin's daemon
  runs), as root with every capability (the manifest's ``privileged``);
* the pod's in-cluster credentials (``rest.InClusterConfig``): ``KUBERNETES_SERVICE_HOST``/``PORT``
  name the API server as the node reaches it (the underlay relay), and a token of the ServiceAccount
  plus the CA are mounted at ``/var/run/secrets/kubernetes.io/serviceaccount`` in a mount namespace
  of the agent's own, over an empty ``/run`` (so that nothing of the machine's ``/run`` is seen or
  written; in particular no NRI socket: the agent learns pod IPs from the API, its fallback).

**A kernel without nft's ``queue`` expression** (``CONFIG_NFT_QUEUE`` unset, as on the machines this
project's CI runs on, which have the iptables ``NFQUEUE`` target and nfnetlink_queue) refuses the
agent's table: every sync fails with ENOENT, while its verdict loop still listens on its queue. There,
and only there, the agent's queueing rules are stood in for by their iptables equivalent, one seam of
the test's own (:data:`STANDIN_RULES`, in ``mangle POSTROUTING``: like the agent's ``srcnat - 5``
chain, after every DNAT and before netplugin's masquerade), rule for rule what the agent's own
``postrouting`` chain does with AdminNetworkPolicy on (queue every new packet but root's own, DNS and
the established): the verdicts are still the real agent's.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from netplugin.frontends.lab.simcluster.cluster import UNDERLAY_V4, SimCluster, SimNode
from netplugin.frontends.lab.simcluster.sessions import stop_session
from netplugin.nodenet.policyagents import KUBE_NETWORK_POLICIES
from tests.support.kubeplane import ControlPlane
from tests.support.waits import wait_for

__all__ = ["AGENT", "AGENT_PEERS", "MANIFEST", "PolicyAgent", "agent_args", "apply_rbac", "manifest"]

AGENT = "kube-network-policies"
MANIFEST = "kube-network-policies.yaml"
#: what the agent needs from the peer dir
AGENT_PEERS = (AGENT,)
#: the agent's nftables table (family, name): where it queues the packets a policy must judge
TABLE = KUBE_NETWORK_POLICIES.nft_tables[0]
#: the stand-in's chain (iptables mangle) where the kernel has no nft queue
STANDIN_CHAIN = "KNP-QUEUE"


def standin_rules(queue: int) -> list[list[str]]:
    """The agent's postrouting chain as iptables rules (for ``iptables`` and ``ip6tables`` alike)."""
    chain = STANDIN_CHAIN
    return [
        ["-t", "mangle", "-N", chain],
        ["-t", "mangle", "-A", chain, "-p", "udp", "--dport", "53", "-j", "RETURN"],
        ["-t", "mangle", "-A", chain, "-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
        ["-t", "mangle", "-A", chain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        ["-t", "mangle", "-A", chain, "-j", "NFQUEUE", "--queue-num", str(queue)],
        ["-t", "mangle", "-A", "POSTROUTING", "-j", chain],
    ]


def nft_queue_missing(cluster: SimCluster, netns: str) -> bool:
    """Whether this kernel refuses nft's ``queue`` expression (tried in a scratch table of ``netns``)."""
    script = "add table inet queueprobe\nadd chain inet queueprobe c { type filter hook postrouting priority 95; }\n"
    script += "add rule inet queueprobe c queue num 1 bypass\n"
    done = cluster.exec_in(netns, ["sh", "-c", f"printf '{script}' | nft -f -"])
    cluster.exec_in(netns, ["nft", "delete", "table", "inet", "queueprobe"])
    return done.returncode != 0


# Inside ``ip netns exec`` (a mount namespace of its own already): made private, an empty /run, the
# service account's files at their in-cluster path, then exec the agent. argv: SECRETS -- AGENT ARGS...
_LAUNCH = r"""
import os, subprocess, sys
secrets, argv = sys.argv[1], sys.argv[3:]
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("--make-rprivate", "/")
mount("-t", "tmpfs", "-o", "mode=0755,size=1m", "tmpfs", "/run")
os.makedirs("/run/secrets/kubernetes.io/serviceaccount")
mount("--bind", "-o", "ro", secrets, "/run/secrets/kubernetes.io/serviceaccount")
os.execv(argv[0], argv)
"""


def manifest(peers: Path) -> list[dict[str, Any]]:
    """The upstream manifest's objects."""
    return [d for d in yaml.safe_load_all((peers / MANIFEST).read_text()) if isinstance(d, dict)]


def _daemonset(peers: Path) -> dict[str, Any]:
    [ds] = [d for d in manifest(peers) if d["kind"] == "DaemonSet"]
    return ds


def apply_rbac(plane: ControlPlane, peers: Path) -> tuple[str, str]:
    """Apply the manifest's ServiceAccount and RBAC as they are; the ServiceAccount's (namespace, name)."""
    for doc in manifest(peers):
        if doc["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            plane.apply(doc)
    spec = _daemonset(peers)["spec"]["template"]["spec"]
    return _daemonset(peers)["metadata"]["namespace"], spec["serviceAccountName"]


def agent_args(peers: Path, node_name: str) -> list[str]:
    """The DaemonSet container's command line for ``node_name``, the built binary first."""
    spec = _daemonset(peers)["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True, "the upstream agent runs in the node's network namespace"
    [c] = spec["containers"]
    assert "NET_ADMIN" in c["securityContext"]["capabilities"]["add"]
    argv = [*c.get("command", []), *c.get("args", [])]
    assert argv[0] == "/bin/netpol", argv  # the image's binary (upstream Dockerfile): the built one here
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c.get("env", []) if "valueFrom" in e}
    assert env == {"MY_NODE_NAME": "spec.nodeName"}, env
    return [str(peers / AGENT), *(a.replace("$(MY_NODE_NAME)", node_name) for a in argv[1:])]


class PolicyAgent:
    """The agent on one node of ``cluster`` (its netns), with ``token``'s identity; stop with :meth:`stop`."""

    def __init__(self, cluster: SimCluster, node: SimNode, peers: Path, token: str, api_port: int) -> None:
        self.cluster, self.node = cluster, node
        secrets = node.root / "kube-network-policies-secrets"
        secrets.mkdir(mode=0o700, exist_ok=True)
        (secrets / "token").write_text(token)
        (secrets / "namespace").write_text("kube-system")
        self.log = node.root / "kube-network-policies.log"
        self.argv = [
            "ip", "netns", "exec", node.netns, sys.executable, "-c", _LAUNCH, str(secrets), "--",
            *agent_args(peers, node.name),
        ]  # fmt: skip
        self.env = {
            **cluster.env,
            "KUBERNETES_SERVICE_HOST": str(UNDERLAY_V4.network_address + 1),
            "KUBERNETES_SERVICE_PORT": str(api_port),
        }
        self.secrets = secrets
        self.proc: subprocess.Popen[bytes] | None = None
        self.queue = int(next(a for a in self.argv if a.startswith("--nfqueue-id=")).split("=", 1)[1])
        #: the kernel has no nft queue: the agent's queueing rules are the stand-in's
        self.standin = nft_queue_missing(cluster, node.netns)

    def start(self, ca: Path) -> None:
        (self.secrets / "ca.crt").write_bytes(ca.read_bytes())
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env, start_new_session=True
            )
        self.resync()

    def resync(self) -> None:
        """Wait for the agent's table (its sync after a Pod or NetworkPolicy event); the stand-in's
        rules put (back) once the agent has tried, where the kernel refuses the table."""
        if not self.standin:
            wait_for(self.table_present, f"{AGENT}'s nftables table on {self.node.name}", 90.0, detail=self.log_tail)
            return
        tried = self.log_text().count("Syncing nftables rules")
        wait_for(lambda: self.table_present() is not None and self.log_text().count("Syncing nftables rules") > tried,
                 f"{AGENT} trying its table on {self.node.name}", 90.0, detail=self.log_tail)  # fmt: skip
        for cmd in ("iptables", "ip6tables"):
            for rule in standin_rules(self.queue):
                done = self.cluster.exec_in(self.node.netns, [cmd, "-w", *rule])
                assert done.returncode == 0, done.stderr

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def table_present(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{AGENT} on {self.node.name} exited ({self.proc.returncode}):\n{self.log_tail()}")
        if self.standin:
            listing = ["iptables", "-w", "-t", "mangle", "-S", STANDIN_CHAIN]
            return self.cluster.exec_in(self.node.netns, listing).returncode == 0
        return self.cluster.exec_in(self.node.netns, ["nft", "list", "table", *TABLE]).returncode == 0

    def table(self) -> str:
        """The agent's rules with their handles (a rewrite shows): its table, or the stand-in's chains."""
        if self.standin:
            out = ""
            for family in ("ip", "ip6"):
                for chain in (STANDIN_CHAIN, "POSTROUTING"):
                    argv = ["nft", "-a", "list", "chain", family, "mangle", chain]
                    done = self.cluster.exec_in(self.node.netns, argv)
                    assert done.returncode == 0, done.stderr
                    out += done.stdout.decode()
            return re.sub(r"counter packets \d+ bytes \d+", "counter", out)  # iptables-nft counts: not a change
        done = self.cluster.exec_in(self.node.netns, ["nft", "-a", "list", "table", *TABLE])
        assert done.returncode == 0, done.stderr
        return done.stdout.decode()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None:
            stop_session(self.proc, 10.0)
            self.proc = None
