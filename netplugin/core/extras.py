"""Optional dependencies ("extras"): which extra brings which module, and the error when one is absent.

``pip install netplugin`` gives the CLI, the CNI shim and exec plugins; ``netplugin[daemon]`` adds
what ``netplugin serve``, the native ``netplugin.io/bridge`` plugin and ``host: kube`` need. A
command that needs an absent module fails with :class:`MissingExtra` (exit 5), naming the extra to
install, instead of an ImportError traceback.
"""

from __future__ import annotations

import importlib.util

from netplugin.core.errors import SystemFailure

__all__ = ["EXTRA_OF_MODULE", "MissingExtra", "extra_for", "require"]

#: top-level module -> the extra of pyproject.toml that installs it
EXTRA_OF_MODULE = {
    "prometheus_client": "daemon",
    "pyroute2": "daemon",
    "lightkube": "daemon",
    "matplotlib": "bench",
}


class MissingExtra(SystemFailure):
    """A feature needs a module of an optional extra that is not installed."""

    def __init__(self, what: str, module: str, extra: str) -> None:
        super().__init__(
            what,
            None,
            f"needs the Python module {module}, which is not installed: install netplugin's "
            f"'{extra}' extra (pip install 'netplugin[{extra}]', or scripts/install.sh --extras {extra})",
        )
        self.module = module
        self.extra = extra


def extra_for(module: str | None) -> str | None:
    """The extra that installs ``module`` (or a submodule of it), None for a module of no extra."""
    if not module:
        return None
    return EXTRA_OF_MODULE.get(module.split(".", 1)[0])


def require(what: str, *modules: str) -> None:
    """Raise MissingExtra unless every module can be imported (found; nothing is imported here)."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingExtra(what, module, extra_for(module) or "daemon")
