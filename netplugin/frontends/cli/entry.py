"""The ``netplugin`` command's entry point: ``setup``/``teardown``/``status`` through the daemon, fast.

When the command line is one of ``netplugin [global options] setup|teardown|status NS POD ID``
and the daemon's socket exists, this module sends the request without importing click, yaml,
psutil or any of netplugin's machinery: it sends the raw settings (``--config``, the flags,
the ``NETPLUGIN_*`` variables) and the daemon builds the config from them exactly as
:mod:`netplugin.frontends.cli.app` would, runs the action only when that config's fingerprint
equals its own and its ``use_daemon`` is not ``never``, and otherwise answers "unavailable".
Output, messages and exit codes are those of the full CLI. With no daemon to ask, the pod command
runs here (:func:`locally`: the config and the manager, without importing click).
Everything else (other commands, ``--help``, ``-v``, an unusual option, a refusal, ``use_daemon:
always``) goes to :func:`netplugin.frontends.cli.app.main`, which decides again with the full
config (``use_daemon: always`` then fails with exit 6 there).

The socket is ``NETPLUGIN_SOCKET``, else ``<run dir>/netplugin.sock`` with the run dir from
``--run-dir``, ``NETPLUGIN_RUN_DIR`` or the default (:func:`netplugin.core.defaults.socket_path`;
a socket set only in the config file is found by the full CLI). The global options are
:mod:`netplugin.frontends.cli`' table, the one the full CLI is built from.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).
import posix
import sys

from netplugin.core.defaults import socket_path as _socket_path
from netplugin.frontends.cli import by_name
from netplugin.frontends.wire.codec import dumps
from netplugin.frontends.wire.codes import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SYSTEM,
    error_classes,
    exit_code_for_classes,
)
from netplugin.frontends.wire.protocol import POD_OPS, pod_output, pod_request, process_environ, run_pod_op, settings

__all__ = ["locally", "main", "parse_pod_command"]

# Not typing's TYPE_CHECKING: importing typing would put the CLI's daemon path (and the Python shim's) over its target.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_VALUE_OPTIONS = by_name()


class PodCommand:
    """A command line this module can serve: the action, the pod and the raw settings."""

    def __init__(self, action: str, pod: list[str], overrides: dict[str, str], config_path: str | None, output: str):
        self.action = action
        self.namespace, self.pod, self.infra_id = pod
        self.overrides = overrides
        self.config_path = config_path
        self.output = output


def parse_pod_command(argv: list[str], environ: "Mapping[str, str]") -> PodCommand | None:
    """The pod command on this command line, or None when the full CLI must parse it."""
    overrides: dict[str, str] = {}
    config_path: str | None = None
    output = environ.get("NETPLUGIN_OUTPUT", "text")
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in _VALUE_OPTIONS:
            return None  # -v, --help, --version, an unknown option: the full CLI's business
        if not eq:
            if i + 1 >= len(argv):
                return None
            i += 1
            value = argv[i]
        flag = _VALUE_OPTIONS[name]
        if flag.config_key is not None:
            overrides[flag.config_key] = value
        elif flag.dest == "config_path":
            config_path = value
        else:
            output = value
        i += 1
    rest = argv[i:]
    if len(rest) != 4 or rest[0] not in POD_OPS or any(a.startswith("-") for a in rest[1:]):
        return None
    if output not in ("text", "json") or environ.get("NETPLUGIN_VERBOSE"):
        return None
    return PodCommand(rest[0], rest[1:], overrides, config_path, output)


def socket_path(cmd: PodCommand, environ: "Mapping[str, str]") -> str:
    return _socket_path(
        environ.get("NETPLUGIN_SOCKET"), cmd.overrides.get("run_dir") or environ.get("NETPLUGIN_RUN_DIR")
    )


def _exists(path: str) -> bool:
    """``os.path.exists`` without ``os`` (see :func:`netplugin.frontends.wire.protocol.process_environ`)."""
    try:
        posix.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _say(text: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def via_daemon(cmd: PodCommand, environ: "Mapping[str, str]") -> int | None:
    """Run the command through the daemon: its exit status, or None when the full CLI must run it."""
    if environ.get("NETPLUGIN_USE_DAEMON", "auto") != "auto":
        return None  # never: work alone; always: the full CLI reports an absent daemon (exit 6)
    sock = socket_path(cmd, environ)
    if not _exists(sock):
        return None
    from netplugin.frontends.wire.client import NoAnswer, NotSent, exchange

    body = pod_request(
        cmd.action, cmd.namespace, cmd.pod, cmd.infra_id, settings=settings(cmd.config_path, environ, cmd.overrides)
    )
    try:
        # The daemon bounds every action by its limits; this only bounds a daemon that hangs.
        response = exchange(sock, body, timeout=None)
    except NotSent:
        return None
    except NoAnswer as e:
        _fail(f"netplugin daemon at {sock}: {e}", EXIT_SYSTEM, cmd, "SystemFailure")
        return EXIT_SYSTEM
    if response["ok"]:
        _emit_result(cmd, response.get("result"))
        return EXIT_OK
    err = response.get("error")
    classes = response.get("classes")
    names = [str(c) for c in classes] if isinstance(classes, list) else []
    if not isinstance(err, dict) or "DaemonUnavailable" in names:
        return None  # not run: the full CLI decides (work alone, or exit 6 for use_daemon: always)
    code = exit_code_for_classes(names)
    if cmd.output == "json":
        _say(dumps({"exit_code": code, **err}, sort_keys=True), err=True)
    else:
        _say(f"netplugin: error: {err.get('message', '')}", err=True)
    return code


def _fail(message: str, code: int, cmd: PodCommand, cls: str) -> None:
    if cmd.output == "json":
        _say(dumps({"error": cls, "message": message, "exit_code": code}, sort_keys=True), err=True)
    else:
        _say(f"netplugin: error: {message}", err=True)


def _emit_result(cmd: PodCommand, result: object) -> None:
    """Print what the full CLI prints for this action and result."""
    data, text = pod_output(cmd.action, cmd.namespace, cmd.pod, cmd.infra_id, result)
    if cmd.output == "json":
        _say(dumps(data, sort_keys=True))
    elif text is not None:
        _say(text)


def locally(cmd: PodCommand, environ: "Mapping[str, str]") -> int | None:
    """Run the command in this process, as the full CLI would but without click: its exit status,
    or None when the full CLI must run it (a daemon its config file names, or use_daemon: always,
    which it reports as exit 6). Output, messages and exit codes are the full CLI's."""
    from netplugin.core.config import load_config
    from netplugin.core.errors import NetpluginError
    from netplugin.core.names import PodRef

    try:
        cfg = load_config(cmd.config_path, environ=environ, overrides=cmd.overrides, cache=True)
        if cfg.use_daemon == "always" or (cfg.use_daemon == "auto" and _exists(cfg.socket_path)):
            return None
        from netplugin.manager.manager import Manager

        result = run_pod_op(Manager(cfg), cmd.action, PodRef(cmd.namespace, cmd.pod, cmd.infra_id))
    except NetpluginError as e:
        code = exit_code_for_classes(error_classes(type(e)))
        if cmd.output == "json":
            _say(dumps({"exit_code": code, **e.to_dict()}, sort_keys=True), err=True)
        else:
            _say(f"netplugin: error: {e.message}", err=True)
        return code
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except Exception as e:  # a bug: the full CLI's message and code, never a traceback
        if cmd.output == "json":
            _say(
                dumps({"error": "InternalError", "message": str(e), "exit_code": EXIT_INTERNAL}, sort_keys=True),
                err=True,
            )
        else:
            _say(f"netplugin: error: internal error: {type(e).__name__}: {e} (run with -v for details)", err=True)
        return EXIT_INTERNAL
    _emit_result(cmd, result)
    return EXIT_OK


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``netplugin``."""
    args = list(sys.argv[1:] if argv is None else argv)
    environ = process_environ()
    cmd = parse_pod_command(args, environ)
    if cmd is not None:
        try:
            code = via_daemon(cmd, environ)
            if code is None and environ.get("NETPLUGIN_USE_DAEMON", "auto") != "always":
                code = locally(cmd, environ)
        except BrokenPipeError:
            sys.exit(EXIT_OK)
        except KeyboardInterrupt:
            _say("netplugin: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        if code is not None:
            sys.exit(code)
    from netplugin.frontends.cli.app import main as full_main

    full_main(args)
