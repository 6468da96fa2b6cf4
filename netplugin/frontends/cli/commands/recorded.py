"""The commands over the recorded pods: ``pods`` (list them) and ``gc`` (tear down what is gone).

Each asks the daemon first (:meth:`State.daemon`) and runs here when it must.
"""

from __future__ import annotations

import click

from netplugin.core.errors import error_from_dict
from netplugin.frontends.cli.context import LOCAL, State, pass_state
from netplugin.frontends.cli.options import command
from netplugin.manager.forget import forget_pod
from netplugin.manager.gc import GcIncomplete, run_gc
from netplugin.store.listing import list_pods

__all__ = ["NO_PODS", "gc", "pods"]

#: what ``pods`` prints when no pod is recorded (a table of no rows would print nothing)
NO_PODS = "No pods"


def _corrupt_warning(path: str, reason: str) -> None:
    click.echo(f"netplugin: warning: corrupt pod record {path}: {reason} (`netplugin gc` sets it aside)", err=True)


def _deleting_note(names: list[str]) -> None:
    if names:
        click.echo(f"netplugin: {len(names)} host veth(s) of torn-down pods not deleted by the kernel yet, off the "
                   f"network (a crash's are gc's): {', '.join(names)}", err=True)  # fmt: skip


@command()
@pass_state
def pods(st: State) -> None:
    """List the pods netplugin has recorded, and their state.

    -o wide adds each chain member with its state, the host veth, the netns and the age.

    \b
    Examples:
      netplugin pods
      netplugin pods -o wide
      netplugin pods -o json
      netplugin pods --state-dir /var/lib/netplugin
    """
    remote = st.daemon("pods")
    if remote is not LOCAL:
        st.emit(remote["listing"], remote["table"] or NO_PODS, wide=remote["wide"] or NO_PODS)
        for c in remote["listing"]["corrupt"]:
            _corrupt_warning(c["path"], c["reason"])
        _deleting_note(remote["listing"].get("deleting") or [])
        return

    listing = list_pods(st.config.state_dir, st.config.run_dir, st.config.chain)
    if listing.rows:
        st.emit(listing.to_dict(), listing.table(), wide=listing.wide_table())
    else:
        st.emit(listing.to_dict(), NO_PODS, wide=NO_PODS)
    for corrupt in listing.corrupt:
        _corrupt_warning(corrupt.path, corrupt.reason)
    _deleting_note(listing.deleting)


@command()
@click.option("--dry-run", is_flag=True, help="Only show what would be done.")
@click.option("--no-host-check", is_flag=True, help="Do not ask the host whether recorded pods still exist.")
@click.option(
    "--forget",
    metavar="POD",
    help="Drop the record of POD (NAMESPACE/NAME[/INFRA_ID]) that can never be torn down, after "
    "printing what it may have left; nothing is torn down.",
)
@pass_state
def gc(st: State, dry_run: bool, no_host_check: bool, forget: str | None) -> None:
    """Tear down the recorded pods that are gone or whose setup or teardown was interrupted.

    \b
    Examples:
      netplugin gc --dry-run
      netplugin gc
      netplugin gc --forget default/web-0
    """
    if forget is not None:
        if dry_run:
            raise click.UsageError("--forget does not take --dry-run: netplugin pods shows the record")
        done = forget_pod(st.manager, forget)
        st.emit(done.to_dict(), done.text())
        return

    def progress(line: str) -> None:
        click.echo(f"gc: {line}", err=True)

    remote = st.daemon(
        "gc", dry_run=dry_run or None, check_host=False if no_host_check else None, on_progress=progress
    )
    if remote is not LOCAL:
        st.emit(remote["report"], remote["text"])
        if remote["error"] is not None:
            raise error_from_dict(remote["error"], remote["classes"])
        return

    report = run_gc(st.manager, dry_run=dry_run, check_host=not no_host_check, progress=progress)
    st.emit(report.to_dict(), report.text())
    if report.failed:
        raise GcIncomplete(report.failed)
