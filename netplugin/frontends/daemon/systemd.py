"""TODO docstring."""

from __future__ import annotations

import logging
import socket

__all__ = ["sd_notify"]

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
