"""The node sysctls a bridge of pods needs: forwarding, and bridged frames through netfilter.

kube-proxy DNATs a Service address in the node's netfilter. When the backend is on the same
bridge as the client, the reply is bridged straight back and never un-DNATed (the client drops
it), unless bridged frames pass netfilter too: br_netfilter with ``bridge-nf-call-iptables=1``
(and ``-ip6tables``). The values are per network namespace (a node netns has its own), and the
directory exists only once the br_netfilter module is loaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable

from netplugin.plugins.bridge.settings import BridgeError

__all__ = ["BRIDGE_NF_CALL", "BRIDGE_NF_DIR", "FORWARDING", "bridge_netfilter_off", "bridge_netfilter_on", "sysctl_on"]

FORWARDING = {4: "/proc/sys/net/ipv4/ip_forward", 6: "/proc/sys/net/ipv6/conf/all/forwarding"}
BRIDGE_NF_DIR = "/proc/sys/net/bridge"
BRIDGE_NF_CALL = {4: BRIDGE_NF_DIR + "/bridge-nf-call-iptables", 6: BRIDGE_NF_DIR + "/bridge-nf-call-ip6tables"}


def sysctl_on(path: str) -> None:
    """Write 1 unless it already is: a node whose value is right is not written to."""
    with open(path, "r+") as f:
        if f.read().strip() != "1":
            f.seek(0)
            f.write("1\n")


def bridge_netfilter_on(versions: Iterable[int]) -> None:
    """``bridge-nf-call-ip(6)tables=1`` for each IP version, loading br_netfilter first if needed.

    Raises :class:`BridgeError` (naming the setting that skips it) when the sysctls do not exist.
    """
    if not os.path.isdir(BRIDGE_NF_DIR) and shutil.which("modprobe"):
        # its failure shows as the missing directory below, with the way out
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True, timeout=30, check=False)
    if not os.path.isdir(BRIDGE_NF_DIR):
        raise BridgeError(
            f"{BRIDGE_NF_DIR} is missing (modprobe br_netfilter failed, or the kernel has no "
            "CONFIG_BRIDGE_NETFILTER); set NETPLUGIN_BRIDGE_BR_NETFILTER=false to skip"
        )
    for version in versions:
        sysctl_on(BRIDGE_NF_CALL[version])


def bridge_netfilter_off(versions: Iterable[int]) -> list[str]:
    """The sysctls among ``versions``' that are off or missing (what ``doctor`` reports)."""
    off = []
    for version in versions:
        try:
            with open(BRIDGE_NF_CALL[version]) as f:
                if f.read().strip() == "1":
                    continue
        except OSError:
            pass  # missing: br_netfilter is not loaded, which is off too
        off.append(os.path.basename(BRIDGE_NF_CALL[version]))
    return off
