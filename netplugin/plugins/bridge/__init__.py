"""The native bridge (``netplugin.io/bridge``): the bash plugin ``exec_plugins/bridge/bridge`` in Python.

``plugin`` (:class:`~netplugin.plugins.bridge.bridge_plugin.NativeBridgePlugin`), ``settings`` (its
``NETPLUGIN_BRIDGE_*`` settings), ``ipam`` (one family), ``ipam_files`` (its lock and record
files), ``podipam`` (a pod's addresses of every family under one lock) and ``reaper`` (coalesced
link deletion). Nothing is imported here: pyroute2 stays off every path that does not select it.
"""
