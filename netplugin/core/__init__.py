"""Core primitives: names, errors, config, the plugin contract, discovery and process invocation.

Everything else builds on these; they import nothing from the rest of netplugin.
"""
