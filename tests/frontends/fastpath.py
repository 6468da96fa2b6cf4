"""netplugin's per-call import set, named here once: what one ``netplugin`` or ``netplugin-cni`` process
may import.

Through the daemon (``cli/entry.py``, ``cni/router.py``: BENCHMARKS.md rows H and Gpy): the standard
library (minus its expensive ``json`` and ``typing``) and :data:`ALLOWED_NETPLUGIN`, nothing else.
Running the call itself (no daemon: the CLI's cold start B-i and per-pod B, and the router's local
run): :data:`PER_CALL`. Only these modules may keep the speed tricks (``core/plaindata`` instead of
``dataclasses``, imports inside functions); tests/test_per_call_imports.py checks that they hold."""

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
#: the modules a call run in its own process adds (the CLI's ``setup``/``status``/``teardown`` with the
#: built-in no-op and with an exec plugin, the CNI shim's ADD/CHECK/DEL with no daemon answering; a
#: config file read through its cache)
LOCAL_RUN = frozenset(
    {
        "netplugin.core._yaml",
        "netplugin.core.chaining",
        "netplugin.core.config",
        "netplugin.core.configcache",
        "netplugin.core.configkeys",
        "netplugin.core.dirs",
        "netplugin.core.discovery",
        "netplugin.core.errors",
        "netplugin.core.execplugin",
        "netplugin.core.execplugin._launch",
        "netplugin.core.execplugin._proctree",
        "netplugin.core.execplugin._pump",
        "netplugin.core.execplugin.calls",
        "netplugin.core.execplugin.environ",
        "netplugin.core.execplugin.exec_plugin",
        "netplugin.core.execplugin.invoke",
        "netplugin.core.execplugin.status",
        "netplugin.core.execplugin.trust",
        "netplugin.core.fileio",
        "netplugin.core.hostports",
        "netplugin.core.names",
        "netplugin.core.netlink",
        "netplugin.core.netns",
        "netplugin.core.nlwire",
        "netplugin.core.node",
        "netplugin.core.plaindata",
        "netplugin.core.plugin",
        "netplugin.core.podlink",
        "netplugin.core.procs",
        "netplugin.core.spares",
        "netplugin.frontends.cni.attachments",
        "netplugin.frontends.cni.netconf",
        "netplugin.frontends.cni.operations",
        "netplugin.frontends.cni.result",
        "netplugin.frontends.cni.spec",
        "netplugin.hosts",
        "netplugin.hosts.base",
        "netplugin.hosts.static",
        "netplugin.manager",
        "netplugin.manager.chain",
        "netplugin.manager.initonce",
        "netplugin.manager.manager",
        "netplugin.manager.reporting",
        "netplugin.plugins",
        "netplugin.plugins.bounded",
        "netplugin.plugins.noop",
        "netplugin.store",
        "netplugin.store.commit",
        "netplugin.store.ipclaims",
        "netplugin.store.locks",
        "netplugin.store.records",
        "netplugin.store.state",
        "netplugin.store.statenetplugin",
    }
)
#: netplugin's per-call import set
PER_CALL = ALLOWED_NETPLUGIN | LOCAL_RUN
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
