"""The node's control loops, beside the daemon's socket server: the node keeper (routes, egress,
forwarding, kernel-driven repair), the gc keeper, the pod repairer and the worker thread each runs on.

They keep plain counters and status; the daemon (:mod:`netplugin.frontends.daemon`) reads them for
its health answer and its metrics.
"""
