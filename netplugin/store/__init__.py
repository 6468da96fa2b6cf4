"""The node's durable state: pod records, locks, durable files, and orphaned plugin processes."""
