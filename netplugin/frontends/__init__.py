"""Front ends, by role: ``wire`` (the daemon protocol and its client), ``cni`` (the CNI shim), ``daemon``,
``cli`` and ``lab`` (demos, the simulated cluster); ``checks``, ``nodeconfig``, ``entrypoints`` and
``uninstall`` at the top.

They rank as the layers do (``tests/test_layers.py``): wire < cni, lab < daemon < checks, nodeconfig,
entrypoints, uninstall < cli, and only the ``demo`` command imports ``lab``.
"""
