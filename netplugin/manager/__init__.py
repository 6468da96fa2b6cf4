"""The plugin manager (selection, init once, per-pod actions) and gc, which repairs after crashes."""

from netplugin.manager.manager import Manager

__all__ = ["Manager"]
