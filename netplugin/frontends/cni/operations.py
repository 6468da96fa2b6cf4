"""``netplugin-cni``: a CNI plugin (spec 1.1) that drives netplugin's exec plugins.

A container runtime (kubelet's CRI runtime, podman's CNI backend, cnitool)
runs this executable with ``CNI_*`` variables and the network config on stdin.
The shim maps each CNI operation onto the :class:`~netplugin.manager.Manager`,
so CNI pods get the same guarantees as netplugin's own (init once, per-pod
locks across processes, time limits, rollback of a failed setup).

Operations
    ``ADD``     setup and status (one locked action); prints a CNI result (see "Result" below).
    ``DEL``     teardown. Idempotent: it succeeds when the pod's resources or its
                network namespace are gone, and when ``CNI_NETNS`` is empty.
    ``CHECK``   status; fails when the plugin reports no address (code 3) or an
                address that is not in ``prevResult`` (code 999).
    ``VERSION`` ``{"cniVersion", "supportedVersions"}``.
    ``STATUS``  exit 0 when the plugin can be selected and initialised, else code 50.
    ``GC``      tears down every attachment this network recorded (ADD records
                ``<stateDir>/cni/<network>/<containerID>:<ifname>.json`` before setup,
                a successful DEL removes it) that is not in ``cni.dev/valid-attachments``;
                continues past errors and reports all of them. Pods that netplugin's
                CLI or daemon set up in the same state dir are never touched.

Network config (stdin), besides the CNI keys
    ``plugin``           netplugin plugin name (e.g. ``"bridge"``)
    ``pluginDir``        exec dir; ``stateDir``, ``runDir`` as netplugin's
    ``configFile``       a netplugin YAML file to load (must exist); without it the
                         default ``/etc/netplugin/netplugin.yaml`` is read if present
                         (or the file named by ``NETPLUGIN_CONFIG``)
    ``netplugin``        an object of any netplugin config keys (``timeouts``, ``host``, ...)
    ``env``              variables added to the exec plugin's environment, on top of the
                         config's ``env:`` (e.g. ``{"NETPLUGIN_BRIDGE_SUBNET": "10.201.3.0/24"}``)
    ``defaultNamespace`` the pod namespace when ``CNI_ARGS`` has none (default ``"default"``)
    ``logFile``          append one JSON line per call (command, container, outcome, time)
    Precedence, rising: defaults < config file < ``NETPLUGIN_*`` environment < ``netplugin``
    object < the top-level keys above. A bad value is error code 7 naming the key.

Pod identity
    The infra id is ``CNI_CONTAINERID``; the namespace and name come from
    ``CNI_ARGS`` ``K8S_POD_NAMESPACE`` / ``K8S_POD_NAME`` (Kubernetes runtimes send
    both; an invalid namespace is error code 4). Runtimes that send no namespace
    (podman sends ``IgnoreUnknown=1;K8S_POD_NAME=<container name>`` only) get
    ``defaultNamespace``. The name is used when it is a valid DNS-1123
    subdomain, else (podman allows ``_`` and capitals, critest names sandboxes with
    capitals) the name is ``cni-`` + the first 12 alphanumerics of the container id, lowercased.
    The derivation depends only on the call's inputs; ``DEL`` uses the identity that ``ADD``
    recorded for the attachment (see GC) when there is one, so a renamed container is
    still torn down as the pod it was set up as.

Network namespace and interface
    ``NETPLUGIN_NETNS`` is ``CNI_NETNS`` for the call (the config's ``netns_template`` is not
    used). When ``CNI_NETNS`` is empty (allowed for DEL and GC) it is ``/dev/null/no-netns``, a
    path that can never exist, so a plugin's "netns gone" branch runs. ``CNI_IFNAME`` is given
    to the plugin as ``NETPLUGIN_IFNAME`` and ``NETPLUGIN_BRIDGE_IFNAME``; the ``CNI_*``
    variables themselves are inherited as well (unless ``inherit_env`` is false). These are
    per-call options (:class:`~netplugin.manager.manager.CallOptions`), not settings: they are
    no part of init's marker nor of the settings compared with the daemon's.

Where it runs
    The entry point (:mod:`netplugin.frontends.cni.router`) hands the call to ``netplugin serve``
    when it answers and runs with the same settings (the daemon then calls :func:`run` with
    its manager); otherwise :func:`run` runs here. The result is the same either way.

Result
    ``interfaces: [{name: CNI_IFNAME, mac, sandbox: CNI_NETNS}]``, ``ips: [{address,
    interface: 0, gateway?}]``. The MAC is read from the netns after setup (podman
    refuses a container interface without one); it is left out when the
    interface does not exist or cannot be read. A status reports only an address, so the prefix
    length comes from ``NETPLUGIN_BRIDGE_SUBNET`` in the plugin environment when the
    address is inside it (and the gateway from ``NETPLUGIN_BRIDGE_GATEWAY``, or the
    subnet's first host); otherwise the address is a host route, ``/32`` or ``/128``.
    A plugin that reports no address yields ``ips: []``. The result is in the config's
    ``cniVersion`` (0.3.x and 0.4.0 results carry ``ips[].version``). A ``prevResult``
    (chaining) is passed through with ours appended.

Errors
    The CNI error JSON ``{cniVersion, code, msg, details}`` on stdout and exit 1:

    ====  =================================================================
    1     ``cniVersion`` not supported, or too old for the command (CHECK, STATUS, GC)
    3     CHECK: the plugin reports no address for the container
    4     a ``CNI_*`` variable is missing or invalid (command, container id,
          ifname, netns, ``CNI_ARGS``)
    5     I/O: the exec dir, a lock, state or a host lookup failed
    6     stdin is not a JSON object
    7     invalid network or netplugin config (names the key; STATUS too); the plugin is
          not found or not usable; CHECK without ``prevResult``
    11    try again later: the plugin timed out (its process tree was killed); the
          daemon is required (``use_daemon: always``) but unavailable, or it was lost
          while it ran the call
    50    STATUS: the plugin cannot be selected or initialised
    999   the plugin failed (details: its stderr tail), or an internal error
    ====  =================================================================

    No traceback ever reaches the runtime: anything unexpected is code 999.

Installing
    The runtime finds the plugin by its ``type`` in its CNI bin dirs (``CNI_PATH``;
    podman: ``cni_plugin_dirs``, on Debian ``/usr/lib/cni``; containerd: ``/opt/cni/bin``),
    so put the entry script there: ``netplugin install-shim /opt/cni/bin`` (it starts
    ``python -I -S`` with an explicit path; a console script works too, slower), and install a
    conflist like ``etc/cni/10-netplugin.conflist`` in ``/etc/cni/net.d``. Use
    ``"cniVersion": "1.0.0"`` with podman 4.x and containerd 1.6: their libcni cannot read
    1.1.0 results (podman never sends STATUS, GC or CHECK); ``"cniVersions": ["1.0.0", "1.1.0"]``
    lets newer runtimes pick 1.1.0. CHECK needs a config version >= 0.4.0, STATUS and GC
    >= 1.1.0 (as libcni applies them); older ones get code 1. ``scripts/podman-setup.sh`` prepares
    podman's CNI backend for trying this.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from netplugin.core.plaindata import dataclass, replace
from netplugin.frontends.cni.attachments import (
    Attachment,
    attached_elsewhere,
    attachment_path,
    claim_attachment,
    forget_attachment,
    list_attachments,
    prune_netns_index,
    refuse_foreign_netns,
    remove_stale_temps,
    stock_attachments,
    valid_attachments,
)
from netplugin.frontends.cni.netconf import build_config, call_options, pod_ref_for
from netplugin.frontends.cni.result import link_mac, make_result, prev_ips
from netplugin.frontends.cni.spec import (
    E_CONFIG,
    E_INTERNAL,
    E_TRY_AGAIN,
    E_UNAVAILABLE,
    E_UNKNOWN_CONTAINER,
    LATEST,
    NO_NETNS,
    SUPPORTED_VERSIONS,
    CniError,
    CniRequest,
    check_version_rules,
    error_for,
    parse_request,
)

if TYPE_CHECKING:
    from netplugin.core.config import Config
    from netplugin.core.plugin import PodNetworkStatus
    from netplugin.manager.manager import CallOptions, Manager

__all__ = [
    "NO_NETNS",
    "SUPPORTED_VERSIONS",
    "Attachment",
    "CniError",
    "CniRequest",
    "DaemonSide",
    "Refused",
    "build_config",
    "error_for",
    "link_mac",
    "list_attachments",
    "make_result",
    "parse_request",
    "pod_ref_for",
    "run",
]


# --- where the operations run ----------------------------------------------------------------------------


class Refused(Exception):
    """The daemon must not run this call (its settings differ); the shim runs it itself."""


#: (state dir, network) pairs whose attachment spares this daemon has made
_STOCKED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class DaemonSide:
    """What the daemon lends a call the shim forwarded (see :mod:`netplugin.frontends.cni.router`).

    ``manager`` is the daemon's own (its plugin, init marker, host, state store, locks);
    ``fingerprint`` its settings, which the call's must equal; ``timed(op, fn)`` runs a pod
    action under its metrics (``op``: setup, teardown or status); ``environ`` the daemon's
    environment, on which the call's ``CNI_*`` variables are laid for the plugin.
    """

    manager: Manager
    fingerprint: dict[str, Any]
    timed: Callable[[str, Callable[[], Any]], Any]


class _Ops:
    """The manager a call uses, the per-call options, and the metrics wrapper."""

    def __init__(
        self,
        req: CniRequest,
        cfg: Config,
        environ: Mapping[str, str],
        daemon: DaemonSide | None,
        unavailable: str | None = None,
    ) -> None:
        self.req = req
        self.cfg = cfg
        self.call = call_options(req)
        self.in_daemon = daemon is not None
        if daemon is None:
            from netplugin.manager.manager import Manager

            if cfg.use_daemon == "always":
                # A cluster node: the daemon owns what the plugin needs (the Node's pod CIDRs).
                where = f" (use_daemon: always in {cfg.config_path})" if cfg.config_path else ""
                msg = f"the netplugin daemon is required{where} but did not run the call"
                raise CniError(E_TRY_AGAIN, msg, unavailable or f"no daemon answers at {cfg.socket_path}")

            self.manager = Manager(cfg, environ=dict(environ))
            self.timed: Callable[[str, Callable[[], Any]], Any] = lambda op, fn: fn()
            return
        from netplugin.frontends.wire.fingerprint import differing_settings

        if cfg.use_daemon == "never":
            raise Refused("the call's settings say use_daemon: never")
        differ = differing_settings(_fingerprint(cfg), daemon.fingerprint)
        if differ:
            raise Refused(f"the call's settings differ from the daemon's ({', '.join(differ)})")
        self.manager = daemon.manager
        self.timed = daemon.timed
        if cfg.inherit_env:
            # The plugin sees the daemon's environment; the call's CNI_* variables are the runtime's.
            cni = {k: v for k, v in environ.items() if k.startswith("CNI_")}
            self.call = replace(self.call, env={**cni, **self.call.env})

    def with_netns(self, netns: str, ifname: str) -> CallOptions:
        env = dict(self.call.env)
        if ifname:
            env["NETPLUGIN_IFNAME"] = env["NETPLUGIN_BRIDGE_IFNAME"] = ifname
        return replace(self.call, netns=netns, env=env)


#: id(config) -> (config, its fingerprint): the daemon's configs come from build_config's cache, so a
#: call of known settings is compared without rebuilding the fingerprint (the config is held, so its
#: id cannot be reused while it is here)
_FINGERPRINTS: dict[int, tuple[Config, dict[str, Any]]] = {}


def _fingerprint(cfg: Config) -> dict[str, Any]:
    from netplugin.frontends.wire.fingerprint import fingerprint

    hit = _FINGERPRINTS.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    fp = fingerprint(cfg)
    if len(_FINGERPRINTS) >= 64:
        _FINGERPRINTS.clear()  # more distinct settings than a node has: start again
    _FINGERPRINTS[id(cfg)] = (cfg, fp)
    return fp


# --- operations -----------------------------------------------------------------------------------------


def _version(req: CniRequest) -> dict[str, Any]:
    asked = req.conf.get("cniVersion")
    version = asked if isinstance(asked, str) and asked in SUPPORTED_VERSIONS else LATEST
    return {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}


def _network(req: CniRequest) -> str | None:
    name = req.conf.get("name")
    return name if isinstance(name, str) and name else None


def _add(ops: _Ops) -> dict[str, Any]:
    req, cfg = ops.req, ops.cfg
    pod = pod_ref_for(req)
    m = ops.manager
    network = _network(req)
    refuse_foreign_netns(req.netns)
    call = replace(ops.call, want_status=True)
    if network:
        if ops.in_daemon and (cfg.state_dir, network) not in _STOCKED:
            _STOCKED.add((cfg.state_dir, network))
            stock_attachments(cfg.state_dir, network)  # once per network: its first pods make no file
        att = Attachment(req.container_id, req.ifname, req.netns, pod.namespace, pod.name)
        # a second attachment of the container: CNI error 4; the record becomes durable with the pod's
        call = replace(call, durable_with=(claim_attachment(cfg, network, att),))
    # A failed setup is rolled back by the manager; a failed status after a good setup fails the
    # ADD and is left for the DEL that the runtime must send after any failed ADD.
    # The status comes with the setup, under its lock and in its record (no second lock,
    # record write or init check); a plugin that reports no address gives ips: [].
    status = m.setup(pod, call)
    prev = req.conf.get("prevResult")
    return make_result(
        req.cni_version,
        req.ifname,
        req.netns,
        status.ips if status else None,
        cfg.env,
        prev if isinstance(prev, dict) else None,
        # podman rejects a container interface without a MAC ("invalid MAC address"); a plugin that
        # reported it with its setup spares entering the netns again
        mac=status.mac if status is not None and status.mac else link_mac(req.netns, req.ifname),
    )


def _recorded_attachment(cfg: Config, network: str, container_id: str, ifname: str) -> Attachment | None:
    from netplugin.core.errors import InvalidArgument

    path = attachment_path(cfg.state_dir, network, container_id, ifname)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        att = Attachment(container_id, ifname, str(doc.get("netns", "")), doc["namespace"], doc["name"])
        _ = att.pod
    except (OSError, ValueError, KeyError, TypeError, InvalidArgument):
        return None  # no (usable) record: the pod is named from this call's arguments
    return att


def _del(ops: _Ops) -> None:
    req, cfg = ops.req, ops.cfg
    network = _network(req)
    recorded = _recorded_attachment(cfg, network, req.container_id, req.ifname) if network else None
    if recorded is None and network and attached_elsewhere(cfg.state_dir, network, req.container_id, req.ifname):
        return  # this attachment's ADD was refused: nothing of it exists, and the other is not ours
    # The identity ADD used, even if the arguments changed since (podman rename, say), so the
    # teardown takes the same pod lock and removes the same pod record.
    pod = recorded.pod if recorded is not None else pod_ref_for(req)
    ops.manager.teardown(pod, ops.call)
    if network:
        forget_attachment(cfg, network, req.container_id, req.ifname, recorded.netns if recorded else None)


def _check(ops: _Ops) -> None:
    req = ops.req
    prev = req.conf.get("prevResult")
    if not isinstance(prev, dict):
        raise CniError(E_CONFIG, "CHECK needs prevResult in the network config")
    pod = pod_ref_for(req)
    status: PodNetworkStatus | None = ops.manager.status(pod, ops.call)
    if status is None:
        raise CniError(
            E_UNKNOWN_CONTAINER,
            f"network plugin reports no address for container {req.container_id} (pod {pod})",
        )
    expected = prev_ips(prev)
    for ip in status.ips:
        if ip not in expected:
            raise CniError(
                E_INTERNAL,
                f"pod {pod} has address {ip}, but prevResult has {', '.join(sorted(expected)) or 'none'}",
            )


def _status(ops: _Ops) -> None:
    m = ops.manager
    _ = m.plugin
    m.init()


def _gc(ops: _Ops) -> None:
    """Tear down this network's recorded attachments that are not in the valid set (see "GC")."""
    from netplugin.core.errors import NetpluginError

    req, cfg = ops.req, ops.cfg
    valid = valid_attachments(req.conf)
    network = req.conf.get("name")
    if not isinstance(network, str) or not network:
        raise CniError(E_CONFIG, "GC needs the network name in the network config")
    attachments, failures = list_attachments(cfg.state_dir, network)
    failures += remove_stale_temps(cfg.state_dir, network)
    prune_netns_index(cfg.state_dir)
    for att in attachments:
        if (att.container_id, att.ifname) in valid or (att.container_id, "") in valid:
            continue
        # Tear down in the netns recorded at ADD (usually gone by now; the plugin copes).
        call = ops.with_netns(att.netns or NO_NETNS, att.ifname)
        try:
            ops.timed("teardown", functools.partial(ops.manager.teardown, att.pod, call))
            forget_attachment(cfg, network, att.container_id, att.ifname)
        except NetpluginError as e:
            failures.append(f"{att.pod} (container {att.container_id}, {att.ifname}): {e.message}")
    if failures:
        raise CniError(E_INTERNAL, f"GC: {len(failures)} problem(s); the rest was collected", "; ".join(failures))


def run(
    environ: Mapping[str, str], stdin: bytes, *, daemon: DaemonSide | None = None, unavailable: str | None = None
) -> tuple[int, dict[str, Any] | None]:
    """One CNI call: (exit status, JSON document to print or None). Never raises, but :class:`Refused`.

    With ``daemon``, the call runs with the daemon's manager and metrics, and raises Refused
    (before doing anything) when the call's settings are not the daemon's. Without it,
    ``unavailable`` is why the daemon did not run the call (for the error of ``use_daemon: always``).
    """
    req: CniRequest | None = None
    try:
        req = parse_request(environ, stdin)
        return 0, _dispatch(req, environ, daemon, unavailable)
    except Refused:
        raise
    except CniError as e:
        return 1, e.to_dict(req.cni_version if req else e.cni_version)
    except Exception as e:  # the runtime must get CNI JSON, never a traceback
        from netplugin.core.errors import NetpluginError

        version = req.cni_version if req else LATEST
        if isinstance(e, NetpluginError):
            return 1, error_for(e, req.command if req else "").to_dict(version)
        return 1, CniError(E_INTERNAL, f"internal error: {type(e).__name__}: {e}").to_dict(version)


#: CNI command -> the daemon metrics' operation
_TIMED = {"ADD": "setup", "DEL": "teardown", "CHECK": "status"}


def _dispatch(
    req: CniRequest, environ: Mapping[str, str], daemon: DaemonSide | None, unavailable: str | None = None
) -> dict[str, Any] | None:
    if req.command == "VERSION":
        return _version(req)
    check_version_rules(req)
    if req.refused:
        return None  # a DEL of an attachment whose ADD was refused: nothing of it exists
    from netplugin.core.errors import ConfigError, NetpluginError

    try:
        cfg = build_config(req, environ, cached=daemon is not None)
    except ConfigError:
        raise  # code 7 naming the key, for STATUS too
    except NetpluginError as e:
        if req.command == "STATUS":
            raise CniError(E_UNAVAILABLE, e.message) from None
        raise
    ops = _Ops(req, cfg, environ, daemon, unavailable)
    if req.command in _TIMED:
        action = {"ADD": _add, "DEL": _del, "CHECK": _check}[req.command]
        result: dict[str, Any] | None = ops.timed(_TIMED[req.command], lambda: action(ops))
        return result
    if req.command == "STATUS":
        _status(ops)
    else:
        _gc(ops)
    return None
