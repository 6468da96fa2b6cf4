"""Front ends: the CLI, the daemon and its stdlib client, the CNI shim, and the demo."""
