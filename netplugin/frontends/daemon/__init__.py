"""``netplugin serve``: the long-running node daemon (socket server, metrics, systemd integration)."""
