"""What the CLI's global options decided, and the objects built from them (lazily): :class:`State`.

Every command gets it through :data:`pass_state`; nothing is built before a command needs it.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from netplugin.core._yaml import dump_yaml
from netplugin.core.config import Config, load_config
from netplugin.core.errors import DaemonUnavailable
from netplugin.frontends.wire.client import request
from netplugin.manager.manager import Manager

__all__ = ["LOCAL", "State", "pass_state"]


class _Local:
    """The type of :data:`LOCAL`."""

    def __repr__(self) -> str:
        return "LOCAL"


#: what :meth:`State.daemon` returns when the command must run in this process
LOCAL: Any = _Local()


class State:
    """The global options' decisions, the config and the manager built from them."""

    #: as the module's LOCAL, for commands that only hold the state
    LOCAL = LOCAL

    def __init__(self, overrides: dict[str, Any], config_path: str | None, output: str, verbose: int) -> None:
        self.overrides = overrides
        self.config_path = config_path
        self.output = output
        self.verbose = verbose
        self._config: Config | None = None
        self._manager: Manager | None = None

    @property
    def json(self) -> bool:
        return self.output == "json"

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path, overrides=self.overrides)
        return self._config

    @property
    def manager(self) -> Manager:
        if self._manager is None:
            self._manager = Manager(self.config)
        return self._manager

    def daemon(self, op: str, **args: Any) -> Any:
        """The daemon's result for ``op``, or LOCAL when this process must do the work itself.

        ``use_daemon``: never -> LOCAL; auto -> the daemon when its socket answers (and it runs
        with our settings), else LOCAL; always -> the daemon or DaemonUnavailable (exit 6).
        """
        cfg = self.config
        if cfg.use_daemon == "never" or (cfg.use_daemon == "auto" and not os.path.exists(cfg.socket_path)):
            return LOCAL

        try:
            return request(cfg.socket_path, op, config=cfg, **args)
        except DaemonUnavailable as e:
            if cfg.use_daemon == "always":
                raise
            if self.verbose:
                click.echo(f"netplugin: {e.message}; working alone", err=True)
            return LOCAL

    def emit(self, data: Any, text: str | None, *, wide: str | None = None) -> None:
        """Print data: as JSON or YAML when asked, else ``text`` (``wide``: the wider table for
        ``-o wide``, where a command has one; nothing when None)."""
        if self.output in ("json", "yaml"):
            doc = json.dumps(data, indent=None, sort_keys=True, default=str)
            if self.output == "json":
                click.echo(doc)
                return
            # Through JSON: YAML of exactly the JSON document (tuples as lists, no Python tags).
            click.echo(dump_yaml(json.loads(doc)))
        elif self.output == "wide" and wide is not None:
            click.echo(wide)
        elif text is not None:
            click.echo(text)


pass_state = click.make_pass_decorator(State)
