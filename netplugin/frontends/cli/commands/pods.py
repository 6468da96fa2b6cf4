"""The per-pod commands: ``setup``, ``teardown``, ``status`` (the CLI's own cold path: nothing heavy).

Each asks the daemon first (:meth:`State.daemon`) and runs here when it must; the results are
shaped by :mod:`netplugin.frontends.wire.protocol`, as the fast path and the daemon shape them.
"""

from __future__ import annotations

from netplugin.core.names import PodRef
from netplugin.frontends.cli.context import LOCAL, State, pass_state
from netplugin.frontends.cli.options import command, pod_arguments
from netplugin.frontends.wire.protocol import pod_output, run_pod_op

__all__ = ["setup", "status", "teardown"]


def _pod_action(st: State, op: str, namespace: str, pod: str, infra_id: str) -> None:
    ref = PodRef(namespace, pod, infra_id)
    result = st.daemon(op, namespace=namespace, pod=pod, infra_id=infra_id)
    if result is LOCAL:
        result = run_pod_op(st.manager, op, ref)
    st.emit(*pod_output(op, namespace, pod, infra_id, result))


@command()
@pod_arguments
@pass_state
def setup(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Set up the network of a pod.

    \b
    Examples:
      netplugin setup default web-0 4f2a9c
      netplugin setup default web-0 4f2a9c --plugin bridge -o json
    """
    _pod_action(st, "setup", namespace, pod, infra_id)


@command()
@pod_arguments
@pass_state
def teardown(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Tear down the network of a pod; tearing down twice is no error.

    \b
    Examples:
      netplugin teardown default web-0 4f2a9c
    """
    _pod_action(st, "teardown", namespace, pod, infra_id)


@command()
@pod_arguments
@pass_state
def status(st: State, namespace: str, pod: str, infra_id: str) -> None:
    """Print the pod's IP, or its whole network status with -o json or yaml (nothing when unknown).

    \b
    Examples:
      netplugin status default web-0 4f2a9c
      netplugin status default web-0 4f2a9c -o yaml
    """
    _pod_action(st, "status", namespace, pod, infra_id)
