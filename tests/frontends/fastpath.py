"""What the per-call fast paths (``cli/entry.py``, ``cni/router.py``) may import: the standard library
(minus its expensive ``json`` and ``typing``) and these netplugin modules, nothing else."""

from __future__ import annotations

import sys

ALLOWED_NETPLUGIN = frozenset(
    {
        "netplugin",
        "netplugin.core",
        "netplugin.core.defaults",
        "netplugin.frontends",
        "netplugin.frontends.wire",
        "netplugin.frontends.wire.codec",
        "netplugin.frontends.wire.fingerprint",
        "netplugin.frontends.wire.protocol",
        "netplugin.frontends.wire.client",
        "netplugin.frontends.cli",
        "netplugin.frontends.cli.entry",
        "netplugin.frontends.wire.codes",
        "netplugin.frontends.cni",
        "netplugin.frontends.cni.router",
    }
)
#: standard modules that cost about as much as the interpreter's start each
EXPENSIVE_STDLIB = ("json", "typing")


def outside_allowed(modules: list[str]) -> list[str]:
    """The modules in ``modules`` (a ``sorted(sys.modules)``) that a fast path must not import."""
    bad = []
    for name in modules:
        top = name.partition(".")[0]
        if top == "netplugin":
            ok = name in ALLOWED_NETPLUGIN
        else:
            ok = (top in sys.stdlib_module_names or top == "__main__") and top not in EXPENSIVE_STDLIB
        if not ok:
            bad.append(name)
    return bad
