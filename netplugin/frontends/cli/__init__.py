"""The ``netplugin`` command line, a package shaped like pip's ``commands/``; here, the global options' table.

:mod:`.entry` is the console script's entry point (setup/teardown/status through the daemon,
standard library only); everything else goes to :mod:`.app` (the click group, its lazy registry
of command modules named by job, and the one place errors become exit codes and text).

The table of the global options that take a value, :data:`GLOBAL_VALUE_OPTIONS`, lives here
because both paths load this package anyway: :mod:`.options` builds the click options from it,
:mod:`.entry` recognises the same options in argv. So this module imports only the standard
library and :mod:`netplugin.core.defaults`.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

from netplugin.core.defaults import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR

__all__ = ["GLOBAL_VALUE_OPTIONS", "OUTPUTS", "Flag", "by_name"]

#: the values of ``-o/--output``
OUTPUTS = ("text", "json")


class Flag:
    """A global option that takes a value: its spellings, where it goes, how ``--help`` shows it.

    ``dest`` is the click parameter; ``config_key`` the config key it overrides (None: not a
    config key, as ``--config`` and ``--output``).
    """

    __slots__ = ("config_key", "dest", "help", "metavar", "names")

    def __init__(self, names: tuple[str, ...], dest: str, config_key: str | None, metavar: str, help: str) -> None:
        self.names = names
        self.dest = dest
        self.config_key = config_key
        self.metavar = metavar
        self.help = help


GLOBAL_VALUE_OPTIONS = (
    Flag(("--plugin-dir",), "plugin_dir", "plugin_dir", "DIR", "Exec plugin dir [NETPLUGIN_PLUGIN_DIR]."),
    Flag(
        ("--plugin",),
        "plugin",
        "plugin",
        "NAME",
        "Plugin to use; none selects kubernetes.io/no-op [NETPLUGIN_PLUGIN].",
    ),
    Flag(
        ("--state-dir",), "state_dir", "state_dir", "DIR", f"Durable state [NETPLUGIN_STATE_DIR; {DEFAULT_STATE_DIR}]."
    ),
    Flag(
        ("--run-dir",), "run_dir", "run_dir", "DIR", f"Locks, markers, socket [NETPLUGIN_RUN_DIR; {DEFAULT_RUN_DIR}]."
    ),
    Flag(("--config",), "config_path", None, "FILE", "Config file [NETPLUGIN_CONFIG]."),
    Flag(("--timeout",), "timeout", "timeout", "SECONDS", "Time limit for every action [NETPLUGIN_TIMEOUT]."),
    Flag(("-o", "--output"), "output", None, "", "Output format [NETPLUGIN_OUTPUT]."),
)


def by_name() -> dict[str, Flag]:
    """Every spelling of a global value option -> its Flag."""
    return {name: flag for flag in GLOBAL_VALUE_OPTIONS for name in flag.names}
