"""What the daemon tells systemd, and how its log lines reach the journal.

* :func:`sd_notify` sends sd_notify(3) datagrams: ``READY=1`` once serving, ``RELOADING=1`` then
  ``READY=1`` around a SIGHUP rescan (``MONOTONIC_USEC`` as systemd 253's ``Type=notify-reload``
  asks), ``STOPPING=1`` at SIGTERM, ``WATCHDOG=1`` keep-alives.
* :class:`Watchdog` reads ``WATCHDOG_USEC``/``WATCHDOG_PID`` (``WatchdogSec=`` in the unit) and says
  how often to ping: half the interval, as sd_watchdog_enabled(3) advises. The pings come from the
  event loop itself, so a loop that stops turning stops them and systemd restarts the daemon.
* :func:`configure_logging` sets the daemon's log lines up (:mod:`netplugin.core.logs`): with a
  syslog priority prefix (``<3>`` error ... ``<7>`` debug), which journald turns into the entry's
  PRIORITY (``SyslogLevelPrefix=``, on by default), and no timestamp (journald has its own) when
  :func:`stderr_is_journal` says stderr really is the journal stream (``JOURNAL_STREAM`` names
  its device and inode), so a terminal or a file never sees the prefixes and always the time.
  A reload that changes ``log_level`` or ``log_format`` sets them up again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from netplugin.core.logs import configure

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = [
    "Watchdog",
    "configure_logging",
    "keep_watchdog",
    "monotonic_usec",
    "reloading_message",
    "sd_notify",
    "stderr_is_journal",
]

log = logging.getLogger(__name__)

def sd_notify(message: str, address: str | None) -> bool:
    """Send a sd_notify(3) datagram (``READY=1``, ``STOPPING=1``, ``STATUS=...``). False if not sent."""
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(message.encode())
    except OSError as e:
        log.warning("cannot notify systemd at %s: %s", address, e)
        return False
    return True


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares ``MONOTONIC_USEC`` with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Watchdog:
    """The service manager's watchdog settings for this process, from its environment."""

    def __init__(self, environ: Mapping[str, str], pid: int | None = None) -> None:
        self.interval: float | None = None
        usec = environ.get("WATCHDOG_USEC", "")
        owner = environ.get("WATCHDOG_PID", "")
        mine = pid if pid is not None else os.getpid()
        if not usec.isdigit() or int(usec) == 0:
            return
        if owner and (not owner.isdigit() or int(owner) != mine):
            return  # meant for another process (a parent that exec'd us without clearing it)
        self.interval = int(usec) / 1e6

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    @property
    def ping_every(self) -> float:
        """Seconds between ``WATCHDOG=1`` pings: half the interval, so one late ping is no restart."""
        if self.interval is None:
            raise ValueError("the watchdog is not enabled")
        return self.interval / 2


def stderr_is_journal(environ: Mapping[str, str], fd: int = 2) -> bool:
    """True when ``fd`` is the stream systemd connected to the journal (``JOURNAL_STREAM=dev:ino``)."""
    dev, sep, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def reloading_message() -> str:
    """``RELOADING=1`` with the ``MONOTONIC_USEC`` that systemd 253+ requires (older ones ignore it)."""
    return f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec()}\nSTATUS=rescanning plugins"


async def keep_watchdog(watchdog: Watchdog, address: str | None) -> None:
    """Send ``WATCHDOG=1`` every ``watchdog.ping_every`` seconds until cancelled (an event-loop task)."""
    while True:
        sd_notify("WATCHDOG=1", address)
        await asyncio.sleep(watchdog.ping_every)


def configure_logging(environ: Mapping[str, str], config: Config, was: Config | None = None) -> None:
    """The daemon's log lines, at ``log_level`` in ``log_format``, for the journal when stderr is it.

    ``was``: the settings a reload replaces; the lines change only when their log keys differ
    (a reload takes the log keys as it takes the plugin's).
    """
    if was is not None and (was.log_level, was.log_format) == (config.log_level, config.log_format):
        return

    configure(config.log_level, config.log_format, journal=stderr_is_journal(environ))
