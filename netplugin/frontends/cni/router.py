"""``netplugin-cni``'s entry point: hand the call to the daemon when it answers, else run it here.

A container runtime starts this process for every CNI call, so its start-up is on every pod's
start path. On the daemon path it imports only ``os``, ``sys``, ``time``, ``_socket``, ``struct`` and
``_json`` (through netplugin's :mod:`netplugin.core.defaults`, :mod:`netplugin.frontends.wire.protocol` and
:mod:`netplugin.frontends.wire.client`):
not even ``json`` or ``typing`` (each costs about as much as the interpreter's own start), and
no click, yaml, psutil, nor the manager or the plugin machinery.

How it works, in detail: ``docs/cni.md``, "Routing a call to the daemon".
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).
import posix
import sys
import time

from netplugin.core.defaults import answer_timeout as _answer_timeout
from netplugin.core.defaults import socket_path
from netplugin.frontends.wire.codec import dumps, loads
from netplugin.frontends.wire.codes import CNI_IO_FAILURE, CNI_TRY_AGAIN
from netplugin.frontends.wire.protocol import (
    CNI_COMMANDS,
    CNI_VERSIONS,
    MAX_STDIN,
    cni_request,
    process_environ,
    version_answer,
)

# Not typing's TYPE_CHECKING: importing typing would put the CLI's daemon path (and the Python shim's) over its target.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["answer_timeout", "conf_of", "daemon_target", "forward", "log_call", "main", "run_call", "run_call_why"]

#: commands the daemon can run for the shim (VERSION is answered here, without any state)
FORWARDED = tuple(command for command, (_, waits_for) in CNI_COMMANDS.items() if waits_for is not None)
LATEST = CNI_VERSIONS[-1]


def _nested(conf: dict[str, object]) -> dict[str, object]:
    nested = conf.get("netplugin")
    return nested if isinstance(nested, dict) else {}


def _setting(nested: dict[str, object], key: str) -> object:
    """A ``netplugin`` object key, written with ``_`` or ``-`` (as core.config accepts)."""
    if key in nested:
        return nested[key]
    return nested.get(key.replace("_", "-"))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def daemon_target(conf: dict[str, object], environ: "Mapping[str, str]") -> tuple[str, str]:
    """(use_daemon, socket path) as far as the call's own inputs say; see the module docstring."""
    nested = _nested(conf)
    mode = _text(_setting(nested, "use_daemon")) or environ.get("NETPLUGIN_USE_DAEMON") or "auto"
    sock = socket_path(
        _text(_setting(nested, "socket")) or environ.get("NETPLUGIN_SOCKET"),
        _text(conf.get("runDir")) or _text(_setting(nested, "run_dir")) or environ.get("NETPLUGIN_RUN_DIR"),
    )
    return mode, sock


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def answer_timeout(conf: dict[str, object], command: str) -> float | None:
    """How long to wait for the daemon: :func:`netplugin.core.defaults.answer_timeout` with the
    limits the network config's ``netplugin`` object sets (None: as long as it takes)."""
    nested = _nested(conf)
    per_action = _setting(nested, "timeouts")
    limits: dict[str, float] = {}
    if isinstance(per_action, dict):
        for action, value in per_action.items():
            seconds = _number(value)
            if isinstance(action, str) and seconds is not None:
                limits[action] = seconds
    kill_grace = _number(_setting(nested, "kill_grace"))
    _, waits_for = CNI_COMMANDS.get(command, (None, None))
    return _answer_timeout(
        waits_for or "setup",
        limits,
        _number(_setting(nested, "timeout")),
        **({} if not kill_grace else {"kill_grace": kill_grace}),
    )


def cni_error(code: int, msg: str, details: str = "", version: str = LATEST) -> dict[str, object]:
    out: dict[str, object] = {"cniVersion": version, "code": code, "msg": msg}
    if details:
        out["details"] = details
    return out


def forward(
    sock: str, environ: "Mapping[str, str]", stdin: bytes, conf: dict[str, object], mode: str
) -> tuple[int, dict[str, object] | None] | str:
    """The daemon's (exit status, document) for this call, or why this process must run it."""
    from netplugin.frontends.wire.client import NoAnswer, NotSent, exchange

    command = environ.get("CNI_COMMAND", "")
    version = _text(conf.get("cniVersion")) or LATEST
    try:
        text = stdin.decode()
    except UnicodeDecodeError:
        return "stdin is not UTF-8"  # the local run reports it
    try:
        response = exchange(sock, cni_request(environ, text), timeout=answer_timeout(conf, command))
    except NotSent as e:
        if mode == "always":
            msg = f"the netplugin daemon at {sock} is required (use_daemon: always) but unavailable: {e}"
            return 1, cni_error(CNI_TRY_AGAIN, msg, version=version)
        return f"no netplugin daemon answers at {sock}: {e}"
    except NoAnswer as e:
        return 1, cni_error(CNI_TRY_AGAIN, f"netplugin daemon at {sock}: {e}", version=version)
    result = response.get("result")
    if response["ok"] and isinstance(result, dict) and isinstance(result.get("code"), int):
        doc = result.get("doc")
        return result["code"], doc if isinstance(doc, dict) else None
    # Not run: another daemon's settings, use_daemon: never in its config, draining, or a daemon
    # that predates op "cni". Only the daemon's word "unavailable" counts as such for "always".
    err = response.get("error")
    said = err.get("message") if isinstance(err, dict) else None
    why = str(said or f"the netplugin daemon at {sock} did not run the call")
    if mode == "always":
        return 1, cni_error(CNI_TRY_AGAIN, why, version=version)
    return why


def conf_of(stdin: bytes) -> dict[str, object] | None:
    try:
        conf = loads(stdin)
    except (ValueError, RecursionError):
        return None
    return conf if isinstance(conf, dict) else None


def _log(path: str, entry: dict[str, object]) -> None:
    try:
        line = dumps(entry) + "\n"
        fd = posix.open(path, posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT | posix.O_CLOEXEC, 0o600)
        try:
            posix.write(fd, line.encode())
        finally:
            posix.close(fd)
    except (OSError, TypeError, ValueError):
        pass  # a log that cannot be written must not fail the network operation


def log_call(
    conf: dict[str, object] | None,
    environ: "Mapping[str, str]",
    code: int,
    doc: dict[str, object] | None,
    via: str,
    seconds: float,
    pid: int,
    why: str | None = None,
) -> None:
    """Append the call's line to the network config's ``logFile``, if it names one (never raises).

    The daemon writes it for the compiled shim, which reads no JSON (``pid`` is then the shim's).
    """
    log = _text(conf.get("logFile")) if conf is not None else None
    if not log or conf is None:
        return
    _log(
        log,
        {
            "time": time.time(),
            "command": environ.get("CNI_COMMAND", ""),
            "containerID": environ.get("CNI_CONTAINERID", ""),
            "ifname": environ.get("CNI_IFNAME", ""),
            "netns": environ.get("CNI_NETNS", ""),
            "args": environ.get("CNI_ARGS", ""),
            "cniVersion": conf.get("cniVersion"),
            "prevResult": isinstance(conf.get("prevResult"), dict),
            # the capabilities the runtime passed (their names: the values are the pod's business)
            "runtimeConfig": sorted(rc) if isinstance(rc := conf.get("runtimeConfig"), dict) else [],
            "pid": pid,
            "via": via,
            **({"daemon": why} if why else {}),
            "ms": round(seconds * 1000, 1),
            "result": doc if code else "ok",
        },
    )


def _emit(doc: dict[str, object] | None) -> None:
    if doc is not None:
        sys.stdout.write(dumps(doc) + "\n")
    sys.stdout.flush()


def run_call(environ: "Mapping[str, str]", stdin: bytes) -> tuple[int, dict[str, object] | None, str]:
    """One CNI call: (exit status, document, "daemon" or "local"). Never raises."""
    code, doc, via, _ = _run(environ, stdin, conf_of(stdin))
    return code, doc, via


def run_call_why(
    environ: "Mapping[str, str]", stdin: bytes
) -> tuple[int, dict[str, object] | None, str, str | None]:
    """As :func:`run_call`, and why a local run was not the daemon's (None: not asked)."""
    return _run(environ, stdin, conf_of(stdin))


def _run(
    environ: "Mapping[str, str]", stdin: bytes, conf: dict[str, object] | None
) -> tuple[int, dict[str, object] | None, str, str | None]:
    """:func:`run_call_why` with the network config already parsed (``conf``: None when it is not an object)."""
    if environ.get("CNI_COMMAND") == "VERSION" and (conf is not None or not stdin.strip()):
        return 0, version_answer(conf.get("cniVersion") if conf is not None else None), "local", None
    why: str | None = None
    if conf is not None and environ.get("CNI_COMMAND") in FORWARDED:
        mode, sock = daemon_target(conf, environ)
        if mode in ("auto", "always"):
            try:
                outcome = forward(sock, environ, stdin, conf, mode)
            except Exception as e:  # never a traceback to the runtime; the local run may still work
                outcome = f"daemon path failed ({type(e).__name__}: {e})"
                print(f"netplugin-cni: {outcome}; working alone", file=sys.stderr)
            if not isinstance(outcome, str):
                return outcome[0], outcome[1], "daemon", None
            why = outcome
    from netplugin.frontends.cni.operations import run

    code, doc = run(environ, stdin, unavailable=why)
    return code, doc, "local", why


def main(argv: object = None) -> None:
    """Entry point of ``netplugin-cni``: CNI_* from the environment, the config on stdin."""
    del argv  # CNI passes everything in the environment and on stdin
    start = time.monotonic()
    via, why = "local", None
    doc: dict[str, object] | None
    conf: dict[str, object] | None = None
    env = process_environ()
    try:
        # Bounded: one byte past the limit is enough for the parser to refuse the config as too large.
        stdin = sys.stdin.buffer.read(MAX_STDIN + 1)
    except Exception as e:
        stdin = b""
        code, doc = 1, cni_error(CNI_IO_FAILURE, f"cannot read stdin: {e}")
    else:
        # Parsed once here: the routing, the daemon's answer timeout and the log line all read it.
        conf = conf_of(stdin) if stdin else None
        code, doc, via, why = _run(env, stdin, conf)
    try:
        _emit(doc)
    except Exception:  # stdout closed: nothing left to tell the runtime
        code = code or 1
    log_call(conf, env, code, doc, via, time.monotonic() - start, posix.getpid(), why)
    sys.exit(code)
