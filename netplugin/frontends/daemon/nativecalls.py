"""Calls of the compiled CNI shim: one binary frame in, one frame out (the frame: :mod:`..wire.protocol`).

The call runs exactly as the Python shim's op ``cni`` (:func:`.cnicalls.run_cni`): the same
settings check (the call's config must be the daemon's), the container's turn, the pod metrics,
the shim's own code for the answer; so codes and messages are the Python shim's. What the daemon
did not run (other settings, draining, too many waiting) is answered ``U`` and the shim falls
back. The daemon writes the network config's ``logFile`` line (``"via": "daemon"``), since the
compiled shim reads no JSON.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from netplugin.core.errors import DaemonUnavailable
from netplugin.frontends.cni.router import conf_of, log_call
from netplugin.frontends.daemon.podqueue import container_turn
from netplugin.frontends.wire.codec import dumps
from netplugin.frontends.wire.protocol import (
    CNI_VERSIONS,
    FRAME_MAGIC,
    FRAME_MAX_REQUEST,
    FrameError,
    decode_request,
    encode_answer,
    encode_unavailable,
    read_frame_header,
)

__all__ = ["read_frame", "run_frame"]

log = logging.getLogger("netplugin.daemon")


async def read_frame(
    first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int
) -> bytes | None:
    """The request body after its first byte ``first``, or None when the connection must close.

    A frame with bad magic or size is answered (exit 1, the reason on stderr); a caller that
    closes mid-frame gets nothing. Either way nothing runs.
    """
    try:
        head = first + await reader.readexactly(len(FRAME_MAGIC) + 4 - 1)  # the rest of magic and length
        size = read_frame_header(head, FRAME_MAX_REQUEST)
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None
    except FrameError as e:
        log.warning("bad frame from pid %d: %s; closing", pid, e)
        writer.write(frame_error_answer(e))
        await writer.drain()
        return None


def frame_error_answer(e: FrameError) -> bytes:
    """A request the frame cannot carry, answered as CNI does: an error document (its code) on stdout."""
    doc = {"cniVersion": CNI_VERSIONS[-1], "code": e.code, "msg": f"netplugin daemon: {e}"}
    return encode_answer(1, (dumps(doc) + "\n").encode(), f"netplugin daemon: {e}\n".encode())


def _answer(code: int, doc: dict[str, Any] | None) -> bytes:
    return encode_answer(code, (dumps(doc) + "\n").encode() if doc is not None else b"")


Outcome = tuple[int, "dict[str, Any] | None"]


async def run_frame(
    body: bytes,
    peer_pid: int,
    turn: Callable[[str, str], Any],
    call: Callable[[dict[str, str], bytes], Awaitable[Outcome]],
) -> tuple[bytes, str]:
    """(answer frame, outcome for the request metrics: "ok" when the call succeeded) for one body.

    ``turn(key, what)`` is the daemon's per-key turn (an async context manager), ``call(environ,
    stdin)`` runs the call with the daemon's settings (in its threads or a worker process), raising
    DaemonUnavailable when the daemon must not run it.
    """
    start = time.monotonic()
    try:
        environ, stdin = decode_request(body)
    except FrameError as e:
        return frame_error_answer(e), "FrameError"
    container = environ.get("CNI_CONTAINERID", "")
    try:
        if container:
            async with turn(*container_turn(container)):
                code, doc = await call(environ, stdin)
        else:
            code, doc = await call(environ, stdin)
    except DaemonUnavailable as e:
        return encode_unavailable(e.message), "DaemonUnavailable"
    except Exception as e:  # a bug: the shim still gets an answer (it falls back), never a dropped call
        log.exception("internal error in a framed cni call")
        return encode_unavailable(f"internal error: {type(e).__name__}: {e}"), "InternalError"
    log_call(conf_of(stdin), environ, code, doc, "daemon", time.monotonic() - start, peer_pid)
    return _answer(code, doc), "ok" if code == 0 else "failed"
