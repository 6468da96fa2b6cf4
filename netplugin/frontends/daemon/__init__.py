"""``netplugin serve``: the long-running node daemon (socket server, wire calls, listener, metrics, systemd, reload).

The node's control loops it runs (node keeper, gc keeper, pod repairer) are :mod:`netplugin.agent`'s.
"""
