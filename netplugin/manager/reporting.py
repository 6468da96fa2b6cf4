"""What the manager tells its front end of each pod action, once, as it ends (the daemon logs it)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from netplugin.core.config import Config
from netplugin.core.errors import NetpluginError
from netplugin.core.names import PodRef
from netplugin.core.plugin import NOOP_NAME, Action

__all__ = ["ActionObserver", "Reporting", "reported"]

#: ``(action, pod, chain, seconds, error)`` of one pod action, once it ended: ``chain`` the
#: configured members' names, ``seconds`` the whole action's (the wait for the pod's lock
#: included), ``error`` None when it succeeded
ActionObserver = Callable[[str, PodRef, tuple[str, ...], float, NetpluginError | None], None]

F = TypeVar("F", bound=Callable[..., Any])


class Reporting:
    """The part of a manager :func:`reported` uses: its config (the chain) and whom to tell."""

    config: Config
    #: told each pod action's end (the daemon's log); None: nobody
    on_action: ActionObserver | None = None


def reported(action: Action) -> Callable[[F], F]:
    """A pod action method (``self, pod, ...``) that tells ``self.on_action`` how it ended."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: Reporting, pod: PodRef, *args: Any, **kwargs: Any) -> Any:
            report = self.on_action
            if report is None:
                return method(self, pod, *args, **kwargs)
            chain = self.config.chain or (NOOP_NAME,)
            start = time.monotonic()
            try:
                result = method(self, pod, *args, **kwargs)
            except NetpluginError as e:
                report(action.value, pod, chain, time.monotonic() - start, e)
                raise
            report(action.value, pod, chain, time.monotonic() - start, None)
            return result

        return run  # type: ignore[return-value]

    return wrap
