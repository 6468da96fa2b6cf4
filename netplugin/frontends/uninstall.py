"""The kernel half of ``scripts/install.sh --uninstall`` (``python -m netplugin.frontends.uninstall``).

In order: the daemon answering on the node's socket is stopped (SIGTERM: it drains, then removes
its egress table; a daemon under systemd was stopped by the script before); with ``--purge`` every
recorded pod is torn down (its plugin releases its address); then what netplugin owns in the
kernel outside pods (:mod:`netplugin.nodenet.owned`) is removed. Each thing is printed as it goes
(``stopped``, ``tore down``, ``removed``); ``--dry-run`` prints ``would ...`` and changes nothing.
Without ``--purge`` pods keep their network: the records and addresses stay for a reinstall.

Exit status: 0 done, 1 something could not be removed (said on stderr; the rest was done).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from netplugin.core.errors import NetpluginError

__all__ = ["main"]

#: how long a daemon gets to drain and exit after SIGTERM (its own bound is its time limits)
STOP_WAIT = 120.0


def _stop_daemon(socket_path: str, dry_run: bool, say: list[str]) -> None:
    from netplugin.frontends.wire.client import request

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


def _purge_pods(config_path: str, dry_run: bool, say: list[str], errors: list[str]) -> None:
    from netplugin.core.config import load_config
    from netplugin.manager.manager import Manager

    manager = Manager(load_config(config_path, environ={}))
    assert manager.state is not None
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m netplugin.frontends.uninstall", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the node's config file (for --purge)")
    p.add_argument("--socket", required=True, help="the daemon's socket")
    p.add_argument("--purge", action="store_true", help="tear down every recorded pod first")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    from netplugin.nodenet.owned import remove_owned

    say: list[str] = []
    errors: list[str] = []
    _stop_daemon(args.socket, args.dry_run, say)
    if args.purge and os.path.exists(args.config):
        try:
            _purge_pods(args.config, args.dry_run, say, errors)
        except NetpluginError as e:
            errors.append(f"pods: {e.message}")
    removed, failed = remove_owned(dry_run=args.dry_run)
    say += [f"{'would remove' if args.dry_run else 'removed'} {what}" for what in removed]
    for line in say:
        print(line)
    for line in [*errors, *failed]:
        print(f"install.sh: cannot remove: {line}", file=sys.stderr)
    return 1 if errors or failed else 0


if __name__ == "__main__":
    sys.exit(main())
