"""The code tables: netplugin's exit codes, the CNI error codes, and which error class maps to which.

One home for both tables, as data: the full CLI (:mod:`netplugin.frontends.cli.app`, which alone
turns errors into exit codes), its stdlib-only entry point (:mod:`netplugin.frontends.cli.entry`),
the CNI operations (:mod:`netplugin.frontends.cni.spec`), the daemon, and the compiled shim (through
the generated C header) read them here, so they can never disagree. Errors are matched by class
name along the MRO (:func:`error_classes`), so this module imports nothing. Standard library only.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

__all__ = [
    "CNI_CODES",
    "CNI_DECODE_FAILURE",
    "CNI_INCOMPATIBLE_VERSION",
    "CNI_INTERNAL",
    "CNI_INVALID_CONFIG",
    "CNI_INVALID_ENV",
    "CNI_IO_FAILURE",
    "CNI_PLUGIN_UNAVAILABLE",
    "CNI_TRY_AGAIN",
    "CNI_UNKNOWN_CONTAINER",
    "EXIT_CODES",
    "EXIT_DAEMON",
    "EXIT_DOCTOR_PROBLEMS",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_MEANINGS",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PLUGIN_FAILED",
    "EXIT_SYSTEM",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "cni_code_for_classes",
    "error_classes",
    "exit_code_for",
    "exit_code_for_classes",
]

EXIT_OK = 0
EXIT_PLUGIN_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4
EXIT_SYSTEM = 5
EXIT_DAEMON = 6
#: ``netplugin doctor`` found at least one problem on this node
EXIT_DOCTOR_PROBLEMS = 7
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

#: exit code -> what it means (docs/cli.md's table, the man page's EXIT STATUS)
EXIT_MEANINGS = {
    EXIT_OK: "success",
    EXIT_PLUGIN_FAILED: "the plugin failed (non-zero exit, signal, bad status output)",
    EXIT_USAGE: "bad input or usage: an argument, an option or the config is wrong",
    EXIT_NOT_FOUND: "the plugin was not found or is invalid (permissions, not executable)",
    EXIT_TIMEOUT: "the plugin timed out (its process tree was killed)",
    EXIT_SYSTEM: "a system error: exec dir unreadable, lock, state, host lookup, I/O",
    EXIT_DAEMON: "the daemon was required (use_daemon: always) but did not answer",
    EXIT_DOCTOR_PROBLEMS: "doctor found at least one problem on this node",
    EXIT_INTERNAL: "an internal error (a bug: please report it, run with -v for details)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}

#: error class name -> exit code; subclasses are matched through the MRO
EXIT_CODES = {
    "PluginTimeout": EXIT_TIMEOUT,
    "PluginError": EXIT_PLUGIN_FAILED,
    "InvalidArgument": EXIT_USAGE,
    "ConfigError": EXIT_USAGE,
    "PluginNotFound": EXIT_NOT_FOUND,
    "PluginInvalid": EXIT_NOT_FOUND,
    "DaemonUnavailable": EXIT_DAEMON,
    "InternalError": EXIT_INTERNAL,  # only ever reported by the daemon
    "NetpluginError": EXIT_SYSTEM,
}


# CNI error codes (the spec's "Error" section, plus libcni's 999)
CNI_INCOMPATIBLE_VERSION = 1
CNI_UNKNOWN_CONTAINER = 3
CNI_INVALID_ENV = 4
#: I/O failure (reading stdin, talking to the daemon)
CNI_IO_FAILURE = 5
CNI_DECODE_FAILURE = 6
CNI_INVALID_CONFIG = 7
#: try again later (also: the daemon is required but did not run the call)
CNI_TRY_AGAIN = 11
#: the STATUS answer "plugin not available"
CNI_PLUGIN_UNAVAILABLE = 50
CNI_INTERNAL = 999

#: error class name -> CNI error code; subclasses are matched through the MRO, the rest is CNI_INTERNAL
CNI_CODES = {
    "PluginTimeout": CNI_TRY_AGAIN,
    "PluginError": CNI_INTERNAL,
    "ConfigError": CNI_INVALID_CONFIG,
    "PluginNotFound": CNI_INVALID_CONFIG,
    "PluginInvalid": CNI_INVALID_CONFIG,
    "InvalidArgument": CNI_INVALID_ENV,
    "HostError": CNI_TRY_AGAIN,
    "DiscoveryError": CNI_IO_FAILURE,
    "SystemFailure": CNI_IO_FAILURE,
    "StateError": CNI_IO_FAILURE,
}


def error_classes(cls: type) -> list[str]:
    """An error class and its bases up to NetpluginError, by name, most derived first (the wire's ``classes``)."""
    names = []
    for c in cls.__mro__:
        names.append(c.__name__)
        if c.__name__ == "NetpluginError":
            break
    return names


def cni_code_for_classes(classes: list[str]) -> int:
    """The CNI error code of an error whose class and bases (most derived first) are ``classes``."""
    for name in classes:
        if name in CNI_CODES:
            return CNI_CODES[name]
    return CNI_INTERNAL


def exit_code_for_classes(classes: list[str]) -> int:
    """The exit code of an error whose class and bases (most derived first) are ``classes``."""
    for name in classes:
        if name in EXIT_CODES:
            return EXIT_CODES[name]
    return EXIT_SYSTEM


def exit_code_for(err: BaseException) -> int:
    """The exit code of a NetpluginError (one the daemon reported in a class unknown here, a
    RemoteError, carries its remote class names)."""
    return exit_code_for_classes([*getattr(err, "remote_classes", ()), *error_classes(type(err))])
