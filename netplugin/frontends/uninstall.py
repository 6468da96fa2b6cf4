"""The kernel half of ``scripts/install.sh --uninstall`` (``python -m netplugin.frontends.uninstall``).

In order: the daemon is stopped (SIGTERM: it drains, then removes its egress table; a daemon
under systemd was stopped by the script before), at the socket the node's config names and at the
run dir's (a config with its own ``socket:`` runs its daemon there); with ``--purge`` every
recorded pod is torn down (its plugin releases its address); then what netplugin owns in the
kernel outside pods (:mod:`netplugin.nodenet.owned`) is removed. Each thing is printed as it goes
(``stopped``, ``tore down``, ``removed``, ``kept``); ``--dry-run`` prints ``would ...`` and changes
nothing.

Without ``--purge`` pods keep their network: their records and addresses stay for a reinstall, and
so does what their network needs in the kernel (the hostPort table with its DNATs and its
localhost guard). With ``--purge``, a pod that cannot be torn down (its teardown fails, or the
config that says how does not load) keeps its state: the exit status says so, and the script then
keeps the state and run dirs, whose records are all that can still free its veths and addresses.

Exit status: 0 done, 1 something could not be removed (said on stderr; the rest was done),
3 with ``--purge``: recorded pods could not be torn down (the state must stay; also said on stderr).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from netplugin.core.config import load_config
from netplugin.core.errors import NetpluginError
from netplugin.frontends.wire.client import request
from netplugin.manager.manager import Manager
from netplugin.nodenet.owned import remove_owned
from netplugin.store.state import StateStore

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = ["EXIT_PODS_LEFT", "main"]

#: how long a daemon gets to drain and exit after SIGTERM (its own bound is its time limits)
STOP_WAIT = 120.0
#: --purge left recorded pods (their state must not be removed)
EXIT_PODS_LEFT = 3


def _stop_daemon(socket_path: str, dry_run: bool, say: list[str]) -> None:
    try:
        pid = int(request(socket_path, "health", timeout=5)["pid"])
    except (NetpluginError, KeyError, TypeError, ValueError):
        return  # nobody answers: nothing to stop
    if dry_run:
        say.append(f"would stop the daemon (pid {pid}) at {socket_path}")
        return
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + STOP_WAIT
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    say.append(f"stopped the daemon (pid {pid}) at {socket_path}")


def _config(path: str) -> tuple[Config | None, str | None]:
    """(the node's Config, None), or (None, why it cannot be used)."""
    if not os.path.exists(path):
        return None, f"the config file {path} is gone"
    try:
        return load_config(path, environ={}), None
    except NetpluginError as e:
        return None, f"the config file {path} does not load: {e.message}"


def _recorded(state_dir: str | None) -> int:
    """How many pods the state dir records (0 when there is none)."""
    if not state_dir or not os.path.isdir(state_dir):
        return 0
    scan = StateStore(state_dir).scan()
    return len(scan.records) + len(scan.corrupt)


def _purge_pods(config: Config, dry_run: bool, say: list[str], errors: list[str]) -> int:
    """Tear down every recorded pod; how many are left recorded."""
    manager = Manager(config)
    assert manager.state is not None
    left = 0
    for rec in manager.state.scan().records:
        pod = f"{rec.ref.namespace}/{rec.ref.name} ({rec.ref.infra_id})"
        if dry_run:
            say.append(f"would tear down pod {pod}")
            continue
        try:
            manager.teardown(rec.ref)
            say.append(f"tore down pod {pod}")
        except NetpluginError as e:
            errors.append(f"pod {pod}: {e.message}")
            left += 1
    return left


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netplugin.frontends.uninstall", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the node's config file (its socket; the pods' chain for --purge)")
    p.add_argument("--socket", required=True, help="the daemon's socket in the run dir (also tried)")
    p.add_argument("--state-dir", help="the install's state dir: its records decide whether --purge freed every pod")
    p.add_argument("--purge", action="store_true", help="tear down every recorded pod first")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)

    say: list[str] = []
    errors: list[str] = []
    config, unusable = _config(args.config)
    sockets = [config.socket_path] if config is not None else []
    for sock in dict.fromkeys([*sockets, args.socket]):
        _stop_daemon(sock, args.dry_run, say)
    state_dir = config.state_dir if config is not None else args.state_dir
    left = 0
    if args.purge:
        if config is None:
            left = _recorded(args.state_dir)
            if left:
                errors.append(f"{left} recorded pod(s) cannot be torn down: {unusable}")
        else:
            try:
                left = _purge_pods(config, args.dry_run, say, errors)
            except NetpluginError as e:
                errors.append(f"pods: {e.message}")
                left = max(1, _recorded(state_dir))
    # Without --purge (or after one that left pods) pods may be live: what their network needs stays.
    pods_live = not args.purge or left > 0
    removed, kept, failed = remove_owned(dry_run=args.dry_run, pods_live=pods_live)
    say += [f"{'would remove' if args.dry_run else 'removed'} {what}" for what in removed]
    why = "the pods' hostPorts and localhost guard; --purge removes it" if not args.purge else "pods are left"
    say += [f"{'would keep' if args.dry_run else 'kept'} {what} ({why})" for what in kept]
    if left and not args.dry_run:
        say.append(f"kept {state_dir}/ and the run dir: {left} recorded pod(s) could not be torn down")
    for line in say:
        print(line)
    for line in [*errors, *failed]:
        print(f"install.sh: cannot remove: {line}", file=sys.stderr)
    if left:
        return EXIT_PODS_LEFT
    return 1 if errors or failed else 0


if __name__ == "__main__":
    sys.exit(main())
