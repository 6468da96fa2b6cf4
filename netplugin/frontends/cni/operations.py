"""The CNI operations (spec 1.1) of ``netplugin-cni``, each mapped onto the :class:`~netplugin.manager.Manager`.

A container runtime runs the shim with ``CNI_*`` variables and the network config on stdin; the
entry point (:mod:`netplugin.frontends.cni.router`) hands the call to ``netplugin serve`` when it
answers with the same settings (the daemon then calls :func:`run` with its manager), else :func:`run`
runs here. The result is the same either way, and CNI pods get netplugin's guarantees (init once,
per-pod locks across processes, time limits, rollback of a failed setup). The reference for the
operations, network-config keys, pod identity, results and error codes is ``docs/cni.md``.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import functools
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from netplugin.core.errors import ConfigError, InvalidArgument, NetpluginError
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
from netplugin.frontends.cni.netconf import build_config, built_config, call_options, pod_ref_for
from netplugin.frontends.cni.result import host_link_mac, link_mac, make_result, prev_ips
from netplugin.frontends.cni.spec import (
    LATEST,
    NO_NETNS,
    CniError,
    CniRequest,
    check_version_rules,
    error_for,
    parse_request,
)
from netplugin.frontends.wire.codes import (
    CNI_INTERNAL,
    CNI_INVALID_CONFIG,
    CNI_PLUGIN_UNAVAILABLE,
    CNI_TRY_AGAIN,
    CNI_UNKNOWN_CONTAINER,
)
from netplugin.frontends.wire.fingerprint import differing_settings, fingerprint
from netplugin.frontends.wire.protocol import CNI_COMMANDS, version_answer

if TYPE_CHECKING:
    from netplugin.core.config import Config, FileSnapshot
    from netplugin.core.plugin import PodNetworkStatus
    from netplugin.frontends.wire.fingerprint import BuiltSettings
    from netplugin.manager.manager import CallOptions, Manager

__all__ = ["DaemonSide", "Refused", "run"]


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
    action under its metrics (``op``: setup, teardown or status); ``built`` the configs it built
    for callers' settings; ``snapshot`` its config file as it read it last: the call's settings
    are built on it, not on the file as it is now.
    """

    manager: Manager
    fingerprint: dict[str, Any]
    timed: Callable[[str, Callable[[], Any]], Any]
    built: BuiltSettings
    snapshot: FileSnapshot | None = None


class _Ops:
    """The manager a call uses, the per-call options, and the metrics wrapper."""

    def __init__(
        self,
        req: CniRequest,
        cfg: Config,
        environ: Mapping[str, str],
        daemon: DaemonSide | None,
        unavailable: str | None = None,
        cfg_print: dict[str, Any] | None = None,
    ) -> None:
        """``cfg_print``: ``cfg``'s fingerprint (with ``daemon``, compared with the daemon's)."""
        self.req = req
        self.cfg = cfg
        self.call = call_options(req, settings=cfg.env)
        self.in_daemon = daemon is not None
        if daemon is None:
            from netplugin.manager.manager import Manager

            if cfg.use_daemon == "always":
                # A cluster node: the daemon owns what the plugin needs (the Node's pod CIDRs).
                where = f" (use_daemon: always in {cfg.config_path})" if cfg.config_path else ""
                msg = f"the netplugin daemon is required{where} but did not run the call"
                raise CniError(CNI_TRY_AGAIN, msg, unavailable or f"no daemon answers at {cfg.socket_path}")

            self.manager = Manager(cfg, environ=dict(environ))
            self.timed: Callable[[str, Callable[[], Any]], Any] = lambda op, fn: fn()
            return

        if cfg.use_daemon == "never":
            raise Refused("the call's settings say use_daemon: never")
        differ = differing_settings(cfg_print if cfg_print is not None else fingerprint(cfg), daemon.fingerprint)
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


# --- operations -----------------------------------------------------------------------------------------


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
    hif = status.host_interface if status is not None else None
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
        host=(hif, host_link_mac(hif)) if hif else None,
    )


def _recorded_attachment(cfg: Config, network: str, container_id: str, ifname: str) -> Attachment | None:
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
        raise CniError(CNI_INVALID_CONFIG, "CHECK needs prevResult in the network config")
    pod = pod_ref_for(req)
    status: PodNetworkStatus | None = ops.manager.status(pod, ops.call)
    if status is None:
        raise CniError(
            CNI_UNKNOWN_CONTAINER,
            f"network plugin reports no address for container {req.container_id} (pod {pod})",
        )
    expected = prev_ips(prev)
    for ip in status.ips:
        if ip not in expected:
            raise CniError(
                CNI_INTERNAL,
                f"pod {pod} has address {ip}, but prevResult has {', '.join(sorted(expected)) or 'none'}",
            )


def _status(ops: _Ops) -> None:
    m = ops.manager
    _ = m.plugin
    m.init()


def _gc(ops: _Ops) -> None:
    """Tear down this network's recorded attachments that are not in the valid set (see "GC")."""
    req, cfg = ops.req, ops.cfg
    valid = valid_attachments(req.conf)
    network = req.conf.get("name")
    if not isinstance(network, str) or not network:
        raise CniError(CNI_INVALID_CONFIG, "GC needs the network name in the network config")
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
        raise CniError(CNI_INTERNAL, f"GC: {len(failures)} problem(s); the rest was collected", "; ".join(failures))


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
        return 1, CniError(CNI_INTERNAL, f"internal error: {type(e).__name__}: {e}").to_dict(version)


def _dispatch(
    req: CniRequest, environ: Mapping[str, str], daemon: DaemonSide | None, unavailable: str | None = None
) -> dict[str, Any] | None:
    if req.command == "VERSION":
        return version_answer(req.conf.get("cniVersion"))
    check_version_rules(req)
    if req.refused:
        return None  # a DEL of an attachment whose ADD was refused: nothing of it exists

    try:
        if daemon is None:
            cfg, cfg_print = build_config(req, environ), None
        else:
            cfg, cfg_print = built_config(req, environ, daemon.built, daemon.snapshot)
    except ConfigError:
        raise  # code 7 naming the key, for STATUS too
    except NetpluginError as e:
        if req.command == "STATUS":
            raise CniError(CNI_PLUGIN_UNAVAILABLE, e.message) from None
        raise
    ops = _Ops(req, cfg, environ, daemon, unavailable, cfg_print)
    timed, _ = CNI_COMMANDS[req.command]
    if timed is not None:
        action = {"ADD": _add, "DEL": _del, "CHECK": _check}[req.command]
        result: dict[str, Any] | None = ops.timed(timed, lambda: action(ops))
        return result
    if req.command == "STATUS":
        _status(ops)
    else:
        _gc(ops)
    return None
