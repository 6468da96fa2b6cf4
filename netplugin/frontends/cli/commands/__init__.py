"""The ``netplugin`` commands, one module per job (the registry: :data:`..app.COMMANDS`)."""
