"""``netplugin.io/bridge``: the bridge plugin, in process.

In detail: ``ARCHITECTURE.md``, "Module notes".
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import NetpluginError, PluginError, PluginFailed, PluginTimeout
from netplugin.core.extras import require
from netplugin.core.names import PodRef
from netplugin.core.netlink import (
    KernelError,
    RawNetlink,
    drop_root_netlink,
    netns_netlink,
    retired_by,
    root_netlink,
)
from netplugin.core.netns import netns_socket, open_netns
from netplugin.core.nlwire import IFA_F_NODAD
from netplugin.core.plugin import CallContext, PodNetworkStatus
from netplugin.plugins.bridge.mtu import DEFAULT_MTU, IPV6_MIN_MTU, node_links, read_record, underlay_mtu, write_record
from netplugin.plugins.bridge.podipam import PodIPAM
from netplugin.plugins.bridge.reaper import LinkReaper
from netplugin.plugins.bridge.restore import repair_bridge, repair_port
from netplugin.plugins.bridge.settings import (
    SETTING_KEYS,
    BridgeError,
    BridgeSettings,
    bridge_mac,
    host_veth_name,
    load_settings,
)
from netplugin.plugins.bridge.sysctls import FORWARDING, bridge_netfilter_on, sysctl_on

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.plugins.bridge.ipam import Allocation

__all__ = ["PLUGIN_NAME", "NativeBridgePlugin"]

PLUGIN_NAME = "netplugin.io/bridge"


# Links are looked up over netlink, never in /sys/class/net: sysfs shows the links of the netns it
# was mounted in, which under a bare `nsenter --net` (containerd, a daemon entering a node netns) is
# the root netns, not the caller's.


def _root_ifindex(name: str) -> int | None:
    """The ifindex of ``name`` in the caller's network namespace."""
    found = root_netlink().link(name)
    return None if found is None else found[0]


def _in_event_loop() -> bool:
    aio = sys.modules.get("asyncio")  # not imported: no loop can be running (and asyncio is costly to import)
    if aio is None:
        return False
    try:
        aio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _configure_bridge(s: BridgeSettings, step: _Step) -> int:
    """The bridge exists, is a bridge, has the gateway address, the MTU, a pinned MAC, and is up."""
    # pyroute2 only here: init is rare and readability wins; the per-pod path packs its own requests.
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute(groups=0) as ipr:
            step.what = f"create bridge {s.name}"
            links = ipr.link("get", ifname=s.name) if _root_ifindex(s.name) is not None else []
            if not links:
                try:
                    ipr.link("add", ifname=s.name, kind="bridge", address=bridge_mac(s.name))
                except NetlinkError as e:
                    if e.code != errno.EEXIST:  # EEXIST: a concurrent init won the race
                        raise
                links = ipr.link("get", ifname=s.name)
            link = links[0]
            if link.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) != "bridge":
                raise BridgeError(f"{s.name} exists but is not a bridge")
            index = int(link["index"])
            if s.subnet_of(6) is not None:
                # The bridge's link-local address is the source of the neighbour solicitations
                # for packets the node forwards to pods; none is sent while DAD runs on it.
                step.what = f"disable duplicate address detection on {s.name}"
                with open(f"/proc/sys/net/ipv6/conf/{s.name}/accept_dad", "w") as f:
                    f.write("0\n")
            mtu = s.mtu
            if mtu is None:
                step.what = "find the underlay's MTU"
                mtu = underlay_mtu(node_links(), s.name)
                mtu = max(mtu, IPV6_MIN_MTU) if s.subnet_of(6) is not None else mtu
                write_record(s.mtu_record, mtu)
            gws = " and ".join(f"{g}/{n.prefixlen}" for g, n in zip(s.gateways, s.subnets, strict=True))
            step.what = f"configure bridge {s.name} ({gws}, mtu {mtu})"
            # Pinning the current MAC stops the kernel from taking the lowest port MAC as pods join,
            # which would invalidate the pods' ARP entries for the gateway.
            ipr.link("set", index=index, address=link.get("IFLA_ADDRESS"), mtu=mtu)
            for gw, net in zip(s.gateways, s.subnets, strict=True):
                flags = IFA_F_NODAD if net.version == 6 else 0
                ipr.addr("replace", index=index, address=str(gw), prefixlen=net.prefixlen, flags=flags)
            ipr.link("set", index=index, state="up")
            return index
    except NetlinkError as e:
        raise KernelError(e.code, os.strerror(e.code) if e.code else str(e)) from e


# --- the plugin ----------------------------------------------------------------------------------------

_ACTIONS = frozenset({"setup", "teardown", "status", "repair"})
#: the modules whose code makes the plugin: a change to any of them runs init again
_CODE = (
    "netplugin.plugins.bridge.bridge_plugin",
    "netplugin.plugins.bridge.settings",
    "netplugin.plugins.bridge.sysctls",
    "netplugin.plugins.bridge.mtu",
    "netplugin.plugins.bridge.ipam",
    "netplugin.plugins.bridge.ipam_files",
    "netplugin.plugins.bridge.podipam",
    "netplugin.core.netlink",
    "netplugin.core.nlwire",
    "netplugin.core.netns",
    "netplugin.core.fileio",
)
def _code_version() -> str:
    h = hashlib.sha256()
    # Every module whose code decides what init does; a change to any of them runs init again.
    for name in _CODE:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        with open(spec.origin, "rb") as f:
            h.update(f.read())
    return "builtin:netplugin.io/bridge:sha256:" + h.hexdigest()[:16]


class _Step:
    """What is being done, for "failed to <what>" (the bash plugin's STEP)."""

    __slots__ = ("what",)

    def __init__(self) -> None:
        self.what = ""


def _file_key(path: str) -> tuple[str, int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1, -1)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


def _configure_pod_end(
    ns: RawNetlink, s: BridgeSettings, ctx: CallContext, peer: int, allocs: list[Allocation], step: _Step
) -> None:
    """Give the pod end ``peer`` its addresses and default routes, in one batch in the pod netns."""
    gws = [str(g) for g in s.gateways]  # the IPAM's families are in the settings' order
    what = ", ".join(f"{a.cidr} via {gw}" for a, gw in zip(allocs, gws, strict=True))
    step.what = f"configure {s.ifname} in {ctx.netns} ({what})"
    ns.configure_pod(
        peer,
        [(a.ip, a.prefixlen, gw) for a, gw in zip(allocs, gws, strict=True)],
        link_local=any(net.version == 6 for net in s.subnets),
    )


class NativeBridgePlugin:
    """The ``netplugin.io/bridge`` plugin. Thread-safe: one instance serves many pods at once."""

    name = PLUGIN_NAME

    def __init__(self, *, state_dir: str | None = None, plugin_dir: str | None = None) -> None:
        #: netplugin's state dir, used when the call's environment has no NETPLUGIN_STATE_DIR
        self.state_dir = state_dir
        #: the bash plugin's settings file, when it is installed as ``bridge`` in the exec dir
        self.conf_beside = os.path.join(plugin_dir, "bridge", "bridge.conf") if plugin_dir else None
        self.reaper = LinkReaper()
        self._version: str | None = None
        self._settings_cache: tuple[tuple[Any, ...], BridgeSettings] | None = None
        self._ipams: dict[tuple[str, str, str], PodIPAM] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Config) -> NativeBridgePlugin:
        # Said when the plugin is selected, not as a failed action later: pyroute2 is an extra.
        require(f"the built-in plugin {PLUGIN_NAME}", "pyroute2")
        return cls(state_dir=cfg.state_dir, plugin_dir=cfg.plugin_dir)

    def __repr__(self) -> str:
        return f"NativeBridgePlugin(state_dir={self.state_dir!r})"

    def version(self) -> str:
        """A hash of this module and the IPAM's source: init runs again when the code changes."""
        if self._version is None:
            self._version = _code_version()
        return self._version

    def version_key(self) -> None:
        return None  # the version is computed once per process, so it needs no cheaper key

    # --- settings ---------------------------------------------------------------------------------

    def settings(
        self, env: Mapping[str, str], state_dir: str = "", *, subnets_optional: bool = False
    ) -> BridgeSettings:
        """The effective settings for a call's environment (cached while nothing changes).

        netplugin's state dir (the default STATE_DIR's parent) is NETPLUGIN_STATE_DIR, else
        ``state_dir`` (the call context's), else the one given at construction.
        """
        state_dir = env.get("NETPLUGIN_STATE_DIR") or state_dir or self.state_dir or ""
        files: list[str] = []
        if self.conf_beside and os.path.exists(self.conf_beside):
            files.append(self.conf_beside)
        if env.get("NETPLUGIN_BRIDGE_CONF"):
            files.append(env["NETPLUGIN_BRIDGE_CONF"])
        key: tuple[Any, ...] = (
            subnets_optional,
            state_dir,
            *(env.get("NETPLUGIN_BRIDGE_" + k) for k in SETTING_KEYS),
            env.get("NETPLUGIN_NODE_POD_CIDRS"),  # SUBNET=node reads it
            *(_file_key(p) for p in files),
        )
        cached = self._settings_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        merged = dict(env)
        if state_dir:
            merged["NETPLUGIN_STATE_DIR"] = state_dir
        settings = load_settings(merged, files, subnets_optional=subnets_optional)
        self._settings_cache = (key, settings)
        return settings

    def ipam(self, s: BridgeSettings) -> PodIPAM:
        key = (s.ipam_dir, ",".join(map(str, s.subnets)), ",".join(map(str, s.gateways)))
        with self._lock:
            ipam = self._ipams.get(key)
            if ipam is None:
                gws = [str(g) for g in s.gateways]
                ipam = self._ipams[key] = PodIPAM(s.ipam_dir, s.subnets, gws, lock_timeout=20.0)
            return ipam

    # --- errors ------------------------------------------------------------------------------------

    @contextmanager
    def _action(self, action: str, pod: PodRef | None, timeout: float) -> Iterator[_Step]:
        """Turn every failure into a PluginError that says what failed."""
        step = _Step()
        try:
            yield step
        except PluginError:
            raise
        except Exception as e:  # the plugin boundary: callers get PluginErrors only
            if not isinstance(e, NetpluginError | KernelError | TimeoutError):
                drop_root_netlink()  # maybe the socket broke: the next call gets a fresh one
            details: dict[str, Any] = {"plugin": self.name, "action": action}
            if pod is not None:
                details["pod"] = str(pod)
            if isinstance(e, TimeoutError):
                raise PluginTimeout(timeout=timeout, **details) from e
            what = f" to {step.what}" if step.what else ""
            where = f" for pod {pod}" if pod is not None else ""
            if isinstance(e, NetpluginError):
                reason = e.message
            elif isinstance(e, OSError):
                reason = e.strerror or str(e)
            else:
                reason = f"internal error: {type(e).__name__}: {e}"
            raise PluginFailed(f"network plugin {self.name!r} {action}{where} failed{what}: {reason}", **details) from e

    # --- init ----------------------------------------------------------------------------------------

    def init(self, ctx: CallContext) -> frozenset[str]:
        """Bridge up with the gateway addresses (MAC pinned), forwarding on, IPAM dirs checked."""
        with self._action("init", None, ctx.timeout) as step:
            step.what = "read the settings"
            self._init(self.settings(ctx.env, ctx.state_dir), step)
        return _ACTIONS

    def _init(self, s: BridgeSettings, step: _Step) -> int:
        """IPAM check, bridge, forwarding; returns the bridge's ifindex. Idempotent."""
        # First: a changed subnet must fail before the bridge gets a second gateway address.
        step.what = f"check IPAM directory {s.ipam_dir}"
        self.ipam(s).check()
        if _in_event_loop():
            # pyroute2's sync API runs its own event loop and cannot inside a running one
            # (svinota/pyroute2#1342): called from a coroutine, do the netlink part in a thread.
            with ThreadPoolExecutor(1) as ex:
                index = ex.submit(_configure_bridge, s, step).result()
        else:
            index = _configure_bridge(s, step)
        for net in s.subnets if s.ip_forward else ():
            step.what = f"enable IPv{net.version} forwarding"
            sysctl_on(FORWARDING[net.version])
        if s.br_netfilter and s.subnets:
            step.what = "enable bridge netfilter"
            bridge_netfilter_on(net.version for net in s.subnets)
        return index

    # --- setup -----------------------------------------------------------------------------------------

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus:
        """Veth pair (peer created in the netns) on the bridge, address, default route. Idempotent.

        Returns the pod's status (its addresses, the primary first), so no status call follows, and
        the host veth (what a later chain member shapes or filters)."""
        with self._action("setup", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir)
            step.what = f"open network namespace {ctx.netns}"
            try:
                nsfd = open_netns(ctx.netns)  # never blocks (a FIFO there), and only nsfs
            except FileNotFoundError:
                raise BridgeError(f"network namespace {ctx.netns} does not exist") from None
            try:
                ips, mac = self._setup(pod, ctx, s, nsfd, step)
            finally:
                os.close(nsfd)
        return PodNetworkStatus(ip=ips[0], ips=ips, host_interface=host_veth_name(pod.infra_id), mac=mac)

    def _setup(
        self, pod: PodRef, ctx: CallContext, s: BridgeSettings, nsfd: int, step: _Step
    ) -> tuple[tuple[str, ...], str | None]:
        """The pod's addresses in the settings' family order (one per family), and its interface's MAC
        (read with the link it inspects anyway, so the CNI result needs no second netns entry)."""
        step.what = f"check bridge {s.name}"
        bridge = root_netlink().up_bridge(s.name)
        if bridge is None:
            bridge = self._init(s, step)  # like the bash plugin: missing or down -> init
        ipam = self.ipam(s)
        step.what = "allocate an address in " + " and ".join(map(str, s.subnets))
        allocs, new_allocation = ipam.claim(pod.infra_id, pod.namespace, pod.name, timeout=ctx.timeout)
        host = host_veth_name(pod.infra_id)
        mtu = s.mtu if s.mtu is not None else read_record(s.mtu_record) or DEFAULT_MTU
        created: int | None = None
        try:
            root = root_netlink()
            step.what = f"enter network namespace {ctx.netns}"
            with netns_netlink(ctx.netns) as ns:
                step.what = f"wait for the deletion of the old {host}"
                self.reaper.settle(host, ctx.timeout)  # a teardown of this pod that answered before it
                existing = _root_ifindex(host)
                peer: int | None = None
                if existing is not None and retired_by(root.group_of(existing) or 0) is not None:
                    # Retired by a teardown in another process (that died before deleting it, or is
                    # deleting it now): never reused, deleted here first.
                    step.what = f"delete retired veth {host}"
                    self.reaper.delete(host, existing, ctx.timeout)
                    existing = None
                if existing is not None:
                    step.what = f"inspect {s.ifname} in {ctx.netns}"
                    found = ns.link_info(s.ifname)
                    if found is not None:
                        if found[1] != existing:
                            raise BridgeError(f"{s.ifname} already exists in {ctx.netns} and is not the peer of {host}")
                        peer = found[0]
                if existing is not None and peer is not None:
                    # Setup again for the same pod: keep the pair and make sure it is configured.
                    step.what = f"attach {host} to {s.name}"
                    root.attach(existing, mtu, bridge)
                    index = existing
                    step.what = f"enable hairpin on {host}"
                    root.hairpin(index)
                else:
                    if existing is not None:
                        step.what = f"delete stale veth {host}"
                        self.reaper.delete(host, existing, ctx.timeout)
                    step.what = f"create veth {host} with peer {s.ifname} in {ctx.netns}"
                    # The peer is created inside the pod netns: moving a link there costs much more.
                    # One sendmsg also sets hairpin and brings the port up (see RawNetlink.add_veth).
                    root.add_veth(host, s.ifname, nsfd, mtu, bridge)
                    created = _root_ifindex(host)
                    found = ns.link_info(s.ifname)
                    if created is None or found is None:
                        raise OSError(errno.ENODEV, f"veth {host} vanished right after it was created")
                    index, peer = created, found[0]
                _configure_pod_end(ns, s, ctx, peer, allocs, step)
            return tuple(dict.fromkeys(str(a.ip) for a in allocs)), found[2] if found is not None else None
        except BaseException:
            # Undo only what this call did: a repeated setup must not break the running pod.
            self._undo_setup(pod, host, created, ipam, new_allocation, ctx.timeout)
            raise

    def _undo_setup(
        self, pod: PodRef, host: str, created: int | None, ipam: PodIPAM, new_allocation: list[int], timeout: float
    ) -> None:
        """Delete the veth a failed setup created and release what it allocated, each best effort."""
        if created is not None:
            try:
                self.reaper.delete(host, created, timeout)
            except Exception:
                pass
        if new_allocation:
            try:
                ipam.release(pod.infra_id, new_allocation, timeout=timeout)
            except Exception:
                pass

    # --- teardown ----------------------------------------------------------------------------------

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        """Take the host veth off the network, release the addresses; the veth's deletion (and so the
        pair's) finishes after the return. Idempotent.

        Works whether or not the netns, the veth or the address still exist. On return the pod is off
        the bridge (its host end down, out of forwarding) and its addresses are free; the kernel's
        deletion of the pair, most of a teardown's time, runs after (:meth:`LinkReaper.retire`:
        concurrent teardowns share one deletion; a setup of the same pod waits for it; gc deletes
        what a crash left).
        """
        with self._action("teardown", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir, subnets_optional=True)
            host = host_veth_name(pod.infra_id)
            # Deleting either end removes the pair; when the netns is gone the kernel already did (or
            # is about to: the pair dies asynchronously with the netns).
            step.what = f"take veth {host} off the network"
            index = _root_ifindex(host)
            if index is not None:
                # Down and retired: the old pod is off the bridge, so its addresses may go to a new pod
                # now; the kernel's deletion (most of a teardown's time) finishes after the answer.
                self.reaper.retire(host, index)
            # Only now: the address must not be handed out while the old pod is still on the network.
            step.what = f"release the addresses of {pod.infra_id}"
            self.ipam(s).release(pod.infra_id, timeout=ctx.timeout)

    # --- repair ----------------------------------------------------------------------------------------

    def repair(self, pod: PodRef, ctx: CallContext) -> tuple[str, ...]:
        """The bridge (addresses, MTU, up) and the pod's port (master, hairpin), put back where lost."""
        with self._action("repair", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir)
            mtu = s.mtu if s.mtu is not None else read_record(s.mtu_record) or DEFAULT_MTU
            step.what = f"repair bridge {s.name}"
            bridge, lines = repair_bridge(s, mtu, lambda: self._init(s, step))
            step.what = f"repair the port of {pod}"
            lines += repair_port(host_veth_name(pod.infra_id), bridge, s.name, mtu)
        return tuple(lines)

    def node(self, ctx: CallContext) -> tuple[str, ...]:
        return ()  # not declared: the bridge is kept through its pods' repair

    # --- status ----------------------------------------------------------------------------------------

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        """The pod interface's addresses (one per family, the primary first), or None when the netns
        or interface is gone."""
        with self._action("status", pod, ctx.timeout) as step:
            step.what = "read the settings"
            s = self.settings(ctx.env, ctx.state_dir, subnets_optional=True)
            step.what = f"read {s.ifname} in {ctx.netns}"
            try:
                ns = RawNetlink(netns_socket(ctx.netns))
            except FileNotFoundError:
                return None
            with ns:
                found = ns.link(s.ifname)
                addrs = ns.addresses(found[0]) if found is not None else {}
            order = [n.version for n in s.subnets] + [4, 6]
            ips = tuple(dict.fromkeys(addrs[v] for v in order if v in addrs))
            return PodNetworkStatus(ip=ips[0], ips=ips) if ips else None
