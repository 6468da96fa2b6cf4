"""The ``netplugin`` command line, a package shaped like pip's ``commands/``.

:mod:`.fast` is the console script's entry point (setup/teardown/status through the daemon,
standard library only); everything else goes to :mod:`.app` (the click group, its lazy registry
of command modules named by job, and the one place errors become exit codes and text).
Nothing is imported here: the fast path loads this package on every call.
"""
