"""What the manager tells its front end of its work: each pod action once, as it ends (the daemon
logs it), and each chain member's call (the daemon's metrics)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from netplugin.core.config import Config
from netplugin.core.errors import NetpluginError
from netplugin.core.names import PodRef
from netplugin.core.plaindata import dataclass
from netplugin.core.plugin import NOOP_NAME, Action
from netplugin.manager.chain import Observer

__all__ = ["ActionObserver", "Hooks", "Reporting"]

#: ``(action, pod, chain, seconds, error)`` of one pod action, once it ended: ``chain`` the
#: configured members' names, ``seconds`` the whole action's (the wait for the pod's lock
#: included), ``error`` None when it succeeded
ActionObserver = Callable[[str, PodRef, tuple[str, ...], float, NetpluginError | None], None]

T = TypeVar("T")


@dataclass(frozen=True)
class Hooks:
    """Whom a manager tells of its work, given when it is built; None: nobody."""

    #: told each chain member call's duration and outcome (the daemon's metrics)
    observe: Observer | None = None
    #: told each pod action's end (the daemon's log)
    on_action: ActionObserver | None = None


class Reporting:
    """Runs a manager's pod actions, telling ``on_action`` how each ended (with ``config``'s chain)."""

    def __init__(self, config: Config, on_action: ActionObserver | None) -> None:
        self._config = config
        self._on_action = on_action

    def run(self, action: Action, pod: PodRef, body: Callable[[], T]) -> T:
        """``body()``, the pod action ``action`` on ``pod``, reported as it ends (raised errors too)."""
        report = self._on_action
        if report is None:
            return body()
        chain = self._config.chain or (NOOP_NAME,)
        start = time.monotonic()
        try:
            result = body()
        except NetpluginError as e:
            report(action.value, pod, chain, time.monotonic() - start, e)
            raise
        report(action.value, pod, chain, time.monotonic() - start, None)
        return result
