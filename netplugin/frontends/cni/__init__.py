"""``netplugin-cni``: the CNI shim (its reference: ``docs/cni.md``).

Modules: :mod:`.router` (the entry point: the daemon path, stdlib only), :mod:`.spec` (CNI
requests, versions, error codes), :mod:`.netconf` (network config to netplugin config and pod
identity), :mod:`.result` (CNI results), :mod:`.attachments` (the per-network attachment index
behind GC), :mod:`.operations` (the operations, run here or in the daemon), :mod:`.installed`
(the conflists and the shim installed for the runtime, as doctor and version read them).
"""

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).

__all__ = ["main"]


def main(argv: object = None) -> None:
    # The package stays empty (not even typing) so that the entry point's start-up costs only
    # the modules of the daemon path; see netplugin.frontends.cni.router.
    from netplugin.frontends.cni.router import main as fast_main

    fast_main(argv)
