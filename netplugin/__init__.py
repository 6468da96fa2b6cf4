"""netplugin: a node agent that manages kubelet exec network plugins.

The library's entry points are :class:`netplugin.manager.Manager`,
:func:`netplugin.core.config.load_config` and :class:`netplugin.core.names.PodRef`; the
plugin contract is ``docs/plugin-contract.md``. ARCHITECTURE.md maps the
layers (core, store/hosts/plugins/nodenet, manager, agent, frontends). Submodules are
imported on demand so that the CLI stays fast to start.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
