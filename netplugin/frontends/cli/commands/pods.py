"""The per-pod commands: ``setup``, ``teardown``, ``status``, and the records: ``pods``, ``gc``.

Each asks the daemon first (:meth:`State.daemon`) and runs here when it must; the results are
shaped by :mod:`netplugin.frontends.wire.protocol`, as the fast path and the daemon shape them.
"""

from __future__ import annotations

import click

from netplugin.frontends.cli.context import LOCAL, State, pass_state
from netplugin.frontends.cli.options import command, pod_arguments
from netplugin.frontends.wire.protocol import pod_output, pod_result

__all__ = ["gc", "pods", "setup", "status", "teardown"]


def _pod_action(st: State, op: str, namespace: str, pod: str, infra_id: str) -> None:
    from netplugin.core.names import PodRef

    ref = PodRef(namespace, pod, infra_id)
    result = st.daemon(op, namespace=namespace, pod=pod, infra_id=infra_id)
    if result is LOCAL:
        m = st.manager
        if op == "setup":
            result = pod_result(op, m.setup(ref))
        elif op == "teardown":
            m.teardown(ref)
            result = pod_result(op, None)
        else:
            result = pod_result(op, m.status(ref))
    st.emit(*pod_output(op, namespace, pod, infra_id, result))


@command()
@pod_arguments
@pass_state
def setup(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Set up the network of a pod."""
    _pod_action(st, "setup", namespace, pod, infra_id)


@command()
@pod_arguments
@pass_state
def teardown(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Tear down the network of a pod (idempotent)."""
    _pod_action(st, "teardown", namespace, pod, infra_id)


@command()
@pod_arguments
@pass_state
def status(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Print the pod's IP (text) or its PodNetworkStatus (json); nothing if unknown."""
    _pod_action(st, "status", namespace, pod, infra_id)


def _corrupt_warning(path: str, reason: str) -> None:
    click.echo(f"netplugin: warning: corrupt pod record {path}: {reason} (`netplugin gc` sets it aside)", err=True)


@command()
@pass_state
def pods(st: State) -> None:
    """List the pods netplugin has recorded, and their state."""
    remote = st.daemon("pods")
    if remote is not LOCAL:
        st.emit(remote["listing"], remote["table"])
        for c in remote["listing"]["corrupt"]:
            _corrupt_warning(c["path"], c["reason"])
        return
    from netplugin.store.listing import list_pods

    listing = list_pods(st.config.state_dir, st.config.run_dir)
    st.emit(listing.to_dict(), listing.table() if listing.rows else None)
    for corrupt in listing.corrupt:
        _corrupt_warning(corrupt.path, corrupt.reason)


@command()
@click.option("--dry-run", is_flag=True, help="Only show what would be done.")
@click.option("--no-host-check", is_flag=True, help="Do not ask the host whether recorded pods still exist.")
@pass_state
def gc(st: State, dry_run: bool, no_host_check: bool) -> None:
    """Tear down recorded pods that are gone or whose setup/teardown was interrupted."""
    remote = st.daemon("gc", dry_run=dry_run or None, check_host=False if no_host_check else None)
    if remote is not LOCAL:
        st.emit(remote["report"], remote["text"])
        if remote["error"] is not None:
            from netplugin.core.errors import error_from_dict

            raise error_from_dict(remote["error"], remote["classes"])
        return
    from netplugin.manager.gc import GcIncomplete, run_gc

    report = run_gc(st.manager, dry_run=dry_run, check_host=not no_host_check)
    st.emit(report.to_dict(), report.text())
    if report.failed:
        raise GcIncomplete(report.failed)
