"""The netplugin exception hierarchy.

Every error netplugin raises on purpose is a :class:`NetpluginError`. Errors
are data: besides a stable, human-readable message they carry the fields a
caller needs to act on them (the plugin, the action, the exit status, the tail
of the plugin's stderr, the offending field). Messages are stable: people grep
logs for them, so change them only on purpose.

Only ``netplugin.frontends.cli.app`` (and the CNI shim, which speaks CNI error JSON) turns
these into exit codes and text; library code never prints or exits.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
from typing import Any

__all__ = [
    "TAIL",
    "ChainInvalid",
    "ConfigError",
    "DaemonUnavailable",
    "DiscoveryError",
    "HostError",
    "InvalidArgument",
    "NetpluginError",
    "PluginError",
    "PluginFailed",
    "PluginInvalid",
    "PluginNotFound",
    "PluginOutputError",
    "PluginTimeout",
    "RemoteError",
    "StateError",
    "SystemFailure",
    "error_from_dict",
    "short_repr",
]

#: how many bytes (or characters) of a command's output an error quotes: its last ones, where the reason is
TAIL = 2048


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, without ever building the whole repr."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = limit
    r.maxlevel = 3
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class NetpluginError(Exception):
    """Base of every error netplugin raises on purpose."""

    #: True once a log line carried this error with its data (the daemon's line of a failed pod
    #: action): a front end that catches it later does not log it again
    logged: bool = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = {k: v for k, v in details.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form: ``{"error": class name, "message": ..., **details}``."""
        out: dict[str, Any] = {"error": type(self).__name__, "message": self.message}
        out.update(self.details)
        return out

    def __str__(self) -> str:
        return self.message


# --- bad input -----------------------------------------------------------------------------------


class InvalidArgument(NetpluginError):
    """A value given by the caller is malformed; nothing was run."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        # Cut to 80 characters (docs/trust.md, "Input limits"): a 1 MB op must not make a 2 MB answer and log line.
        shown = short_repr(value)
        text = value if isinstance(value, str) and len(value) <= 80 else shown
        super().__init__(f"invalid {field} {shown}: {reason}", field=field, value=str(text), reason=reason)
        self.field = field
        self.value = value
        self.reason = reason


class ConfigError(NetpluginError):
    """The configuration (file, environment or flags) is wrong; names the key."""

    def __init__(self, key: str, reason: str, *, source: str | None = None) -> None:
        where = f" (in {source})" if source else ""
        super().__init__(f"config key {key!r}{where}: {reason}", key=key, reason=reason, source=source)
        self.key = key
        self.reason = reason
        self.source = source


# --- plugins -------------------------------------------------------------------------------------


class PluginNotFound(NetpluginError):
    """No plugin of that name exists (exec dir and built-ins)."""

    def __init__(self, name: str, *, available: list[str] | None = None, problems: list[str] | None = None):
        msg = f"network plugin {name!r} not found"
        if available:
            msg += f" (available: {', '.join(available)})"
        super().__init__(msg, plugin=name, available=available, problems=problems or None)
        self.plugin = name
        self.problems = problems or []


class PluginInvalid(NetpluginError):
    """A plugin of that name exists but may not be used (permissions, not executable, ...)."""

    def __init__(self, name: str, problem: str, *, path: str | None = None) -> None:
        super().__init__(f"network plugin {name!r} is invalid: {problem}", plugin=name, problem=problem, path=path)
        self.plugin = name
        self.problem = problem
        self.path = path


class ChainInvalid(PluginInvalid):
    """A chain with at least one member that cannot be used; names every bad member."""

    def __init__(self, chain: list[str], problems: list[str]) -> None:
        NetpluginError.__init__(
            self,
            f"plugin chain {', '.join(chain)} is invalid: " + "; ".join(problems),
            plugin=",".join(chain),
            chain=chain,
            problems=problems,
        )
        self.plugin = ",".join(chain)
        self.problem = "; ".join(problems)
        self.path = None
        self.problems = problems


class PluginError(NetpluginError):
    """A plugin action ran and did not succeed. Carries the plugin's own words."""

    def __init__(
        self,
        message: str,
        *,
        plugin: str,
        action: str,
        exit_status: int | None = None,
        signal: int | None = None,
        stderr_tail: str | None = None,
        stdout_tail: str | None = None,
        **details: Any,
    ) -> None:
        if stderr_tail:
            message = f"{message}; stderr: {stderr_tail.strip()!r}"
        super().__init__(
            message,
            plugin=plugin,
            action=action,
            exit_status=exit_status,
            signal=signal,
            stderr_tail=stderr_tail or None,
            stdout_tail=stdout_tail or None,
            **details,
        )
        self.plugin = plugin
        self.action = action
        self.exit_status = exit_status
        self.signal = signal
        self.stderr_tail = stderr_tail or ""
        self.stdout_tail = stdout_tail or ""


class PluginFailed(PluginError):
    """Non-zero exit, death by signal, or processes left behind."""


class PluginTimeout(PluginError):
    """The action exceeded its time limit; the plugin's process tree was killed."""

    def __init__(self, *, plugin: str, action: str, timeout: float, **kw: Any) -> None:
        super().__init__(
            f"network plugin {plugin!r} {action} timed out after {timeout:g}s (process tree killed)",
            plugin=plugin,
            action=action,
            timeout=timeout,
            **kw,
        )
        self.timeout = timeout


class PluginOutputError(PluginError):
    """The plugin succeeded but printed something we cannot accept (for example bad status JSON)."""


# --- the machine ---------------------------------------------------------------------------------


class DiscoveryError(NetpluginError):
    """The exec dir cannot be read."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot read plugin dir {path}: {reason}", path=path, reason=reason)
        self.path = path
        self.reason = reason


class SystemFailure(NetpluginError):
    """An operating-system operation netplugin itself needed failed (lock, marker, spawn, I/O)."""

    def __init__(self, what: str, path: str | None, reason: str) -> None:
        at = f" {path}" if path else ""
        super().__init__(f"{what}{at}: {reason}", path=path, reason=reason)
        self.what = what
        self.path = path
        self.reason = reason


class StateError(NetpluginError):
    """A pod state record is corrupt or cannot be written."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"pod state {path}: {reason}", path=path, reason=reason)
        self.path = path
        self.reason = reason


class HostError(NetpluginError):
    """The host (for example the Kubernetes API) could not answer a pod lookup."""

    def __init__(self, message: str, *, status: int | None = None, url: str | None = None) -> None:
        super().__init__(message, status=status, url=url)
        self.status = status
        self.url = url


# --- the daemon ----------------------------------------------------------------------------------


class DaemonUnavailable(NetpluginError):
    """The daemon did not take the request (absent, not answering, draining, or configured differently).

    The request was not run, so a caller that may work alone can safely do it itself.
    """

    def __init__(self, socket: str, reason: str) -> None:
        super().__init__(f"netplugin daemon at {socket} is unavailable: {reason}", socket=socket, reason=reason)
        self.socket = socket
        self.reason = reason


class RemoteError(NetpluginError):
    """An error the daemon reported whose class this process does not know.

    ``remote_classes`` is the remote class and its bases, most derived first, so
    the CLI maps it to the exit code the daemon's own class would have.
    """

    def __init__(self, message: str, remote_classes: list[str], **details: Any) -> None:
        super().__init__(message, **details)
        self.remote_classes = list(remote_classes)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.remote_classes:
            out["error"] = self.remote_classes[0]
        return out


def error_from_dict(data: dict[str, Any], classes: list[str] | None = None) -> NetpluginError:
    """Rebuild an error from :meth:`NetpluginError.to_dict` (as the daemon sends it).

    A class of this module comes back as itself, with the same message, details and
    attributes (``to_dict()`` is equal to the original's); any other becomes a
    :class:`RemoteError` carrying ``classes`` (the remote MRO names) for the exit code.
    """
    name = str(data.get("error", "NetpluginError"))
    message = str(data.get("message", ""))
    details = {k: v for k, v in data.items() if k not in ("error", "message")}
    cls = globals().get(name) if name in __all__ else None
    if not (isinstance(cls, type) and issubclass(cls, NetpluginError)) or cls is RemoteError:
        return RemoteError(message, classes or [name], **details)
    # Constructors differ per class and rebuild the message; bypass them and restore the state.
    err = cls.__new__(cls)
    NetpluginError.__init__(err, message, **details)
    for key, value in {**_ABSENT_DETAILS, **details}.items():
        setattr(err, key, value)
    if isinstance(err, PluginError):
        err.stderr_tail = err.details.get("stderr_tail") or ""
        err.stdout_tail = err.details.get("stdout_tail") or ""
    if isinstance(err, PluginNotFound):
        err.problems = err.details.get("problems") or []
    return err


# Attributes whose None value to_dict() leaves out; restored so a rebuilt error has them all.
_ABSENT_DETAILS: dict[str, Any] = {
    "path": None,
    "source": None,
    "status": None,
    "url": None,
    "exit_status": None,
    "signal": None,
}
