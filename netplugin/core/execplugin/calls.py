"""Call tokens: how netplugin recognises the processes it started, and nobody else's.

Every plugin call gets ``NETPLUGIN_CALL_ID=<time>.<nonce>.<mac>`` in its environment:
``time`` is when the call started (ms since boot, ``CLOCK_BOOTTIME``: the clock process start
times are counted in, immune to wall-clock steps), ``nonce`` is random, and ``mac`` an
HMAC-SHA256, under a key only root can read (``<state_dir>/call.key``, mode 0600, made on
first use), of the time, the nonce and the call's own ``NETPLUGIN_*`` identity (action,
plugin, pod, state dir). A process is one of netplugin's plugin processes only if its token
verifies against its own environment, it runs as netplugin's uid, and it started no earlier
than the token says. Anybody can put ``NETPLUGIN_*`` variables into a process's environment;
nobody without the key can make a token, and copying a real one (root's environments are
not readable by other users) would still fail the uid check.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import errno
import os
import threading
import time
from collections.abc import Mapping

from netplugin.core.errors import SystemFailure
from netplugin.core.fileio import FileRefused, create_file, read_bounded

__all__ = ["ENV", "KEY_FILE", "boot_clock", "call_key", "make_token", "token_time", "verify_token"]

ENV = "NETPLUGIN_CALL_ID"
KEY_FILE = "call.key"
_KEY_BYTES = 32
_MAC_HEX = 32
#: the variables a token binds (absent ones count as empty)
_BOUND = (
    "NETPLUGIN_ACTION",
    "NETPLUGIN_PLUGIN",
    "NETPLUGIN_POD_NAMESPACE",
    "NETPLUGIN_POD_NAME",
    "NETPLUGIN_INFRA_ID",
    "NETPLUGIN_STATE_DIR",
)

_keys: dict[str, tuple[tuple[int, int], bytes]] = {}
_keys_lock = threading.Lock()


def _read_key(path: str) -> tuple[tuple[int, int], bytes]:
    refused = SystemFailure(
        "refusing the call key", path, f"must be a regular file of uid {os.geteuid()} with mode 0600"
    )
    seen: list[os.stat_result] = []

    def owned(st: os.stat_result) -> None:
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise refused
        seen.append(st)

    try:
        key = read_bounded(path, _KEY_BYTES, check=owned)
    except FileRefused:
        raise refused from None
    st = seen[0]
    if len(key) != _KEY_BYTES:
        raise SystemFailure("refusing the call key", path, f"must hold exactly {_KEY_BYTES} bytes")
    return (st.st_dev, st.st_ino), key


def call_key(state_dir: str, *, create: bool = True) -> bytes | None:
    """The node's call key under ``state_dir`` (created, 0600, if absent and ``create``).

    The caller has made sure ``state_dir`` is trusted (it is one of netplugin's own dirs).
    Returns None when the key does not exist and ``create`` is False.
    """
    path = os.path.join(state_dir, KEY_FILE)
    with _keys_lock:
        cached = _keys.get(path)
        try:
            if cached is not None:
                st = os.lstat(path)
                if (st.st_dev, st.st_ino) == cached[0]:
                    return cached[1]
            found = _read_key(path)
        except FileNotFoundError:
            if not create:
                return None
            found = _create_key(path)
        except OSError as e:
            raise SystemFailure("cannot read the call key", path, e.strerror or str(e)) from e
        _keys[path] = found
        return found[1]


def _create_key(path: str) -> tuple[tuple[int, int], bytes]:
    import secrets  # here, not at the top: a CLI call that execs no plugin never needs it

    key = secrets.token_bytes(_KEY_BYTES)
    try:
        create_file(path, key, mode=0o600)  # False if another process made the key meanwhile: use theirs
        return _read_key(path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise SystemFailure("cannot create the call key", path, "its directory does not exist") from e
        raise SystemFailure("cannot create the call key", path, e.strerror or str(e)) from e


def _mac(key: bytes, stamp: str, nonce: str, env: Mapping[str, str]) -> str:
    import hashlib
    import hmac

    msg = "\0".join([stamp, nonce, *(env.get(k, "") for k in _BOUND)]).encode("utf-8", "surrogateescape")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()[:_MAC_HEX]


def boot_clock() -> float:
    """Seconds since boot (``CLOCK_BOOTTIME``), the clock of tokens and of process start times."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def make_token(key: bytes, env: Mapping[str, str], *, now: float | None = None) -> str:
    """A fresh token for a call whose ``NETPLUGIN_*`` variables are already in ``env``."""
    import secrets

    stamp = str(int((boot_clock() if now is None else now) * 1000))
    nonce = secrets.token_hex(8)
    return f"{stamp}.{nonce}.{_mac(key, stamp, nonce, env)}"


def token_time(token: str) -> float | None:
    """When the call of ``token`` started (seconds since boot), or None if malformed."""
    stamp = token.split(".", 1)[0]
    return int(stamp) / 1000 if stamp.isascii() and stamp.isdigit() and len(stamp) < 16 else None


def verify_token(key: bytes, env: Mapping[str, str]) -> bool:
    """Whether ``env`` (a process's environment) carries a token netplugin made for exactly these variables."""
    token = env.get(ENV, "")
    parts = token.split(".")
    if len(parts) != 3 or token_time(token) is None:
        return False
    stamp, nonce, mac = parts
    import hmac

    return hmac.compare_digest(mac, _mac(key, stamp, nonce, env))
