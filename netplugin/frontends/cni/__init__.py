"""``netplugin-cni``: the CNI shim (see :mod:`netplugin.frontends.cni.shim` for the contract).

Modules: :mod:`.protocol` (CNI requests, versions, error codes), :mod:`.netconf` (network config
to netplugin config and pod identity), :mod:`.result` (CNI results), :mod:`.attachments` (the
per-network attachment index behind GC), :mod:`.shim` (operations and the entry point).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

__all__ = ["main"]


def main(argv: Iterable[str] | None = None) -> NoReturn:
    # The package stays empty so that importing one of its modules costs only that module.
    from netplugin.frontends.cni.shim import main as shim_main

    shim_main(argv)
