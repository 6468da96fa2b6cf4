"""Node-level networking the daemon keeps: routes to other nodes' pod CIDRs, egress masquerade."""
