"""Running exec plugins: the one place netplugin starts plugin processes and checks what it runs.

``plugin`` (:class:`ExecPlugin`, the contract for an executable), ``environ`` (the environment a
call gets), ``status`` (parsing a ``status`` action's stdout), ``invoke`` (**the only module that
starts plugin processes**), ``_launch`` (re-check, open and exec one call), ``_pump`` (pipes and
exit), ``_proctree`` (killing trees), ``trust`` (which paths root may trust) and ``calls`` (call
tokens: which processes are netplugin's). The contract itself is ``docs/plugin-contract.md``.
"""
