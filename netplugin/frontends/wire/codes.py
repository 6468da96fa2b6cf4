"""netplugin's exit codes, and which error class maps to which (the README's table).

Shared by the full CLI (:mod:`netplugin.frontends.cli.app`, which alone turns errors into exit
codes) and its stdlib-only fast path (:mod:`netplugin.frontends.cli.entry`), so the two can never
disagree. Standard library only.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

__all__ = [
    "EXIT_CODES",
    "EXIT_DAEMON",
    "EXIT_DOCTOR_PROBLEMS",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PLUGIN_FAILED",
    "EXIT_SYSTEM",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
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


def exit_code_for_classes(classes: list[str]) -> int:
    """The exit code of an error whose class and bases (most derived first) are ``classes``."""
    for name in classes:
        if name in EXIT_CODES:
            return EXIT_CODES[name]
    return EXIT_SYSTEM


def exit_code_for(err: BaseException) -> int:
    """The exit code of a NetpluginError (one the daemon reported in a class unknown here, a
    RemoteError, carries its remote class names)."""
    return exit_code_for_classes([*getattr(err, "remote_classes", ()), *(cls.__name__ for cls in type(err).__mro__)])
