"""The daemon protocol's one home: version, ops, limits, requests and answers, and the binary frame.

Standard library only, and cheap to import: the per-call fast paths (``netplugin`` through
:mod:`netplugin.frontends.cli.entry`, ``netplugin-cni`` through :mod:`netplugin.frontends.cni.router`)
load it on every call. :mod:`netplugin.frontends.wire.client` carries these messages (transport only),
:mod:`netplugin.frontends.daemon.server` answers them.

How it works, in detail: ``docs/daemon.md``, "The wire format".
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows H and Gpy: the CLI and the Python shim through the daemon).
import posix
import sys

from netplugin.frontends.wire.codec import dumps
from netplugin.frontends.wire.codes import CNI_INVALID_ENV, CNI_IO_FAILURE, CNI_TRY_AGAIN

__all__ = [
    "CNI_COMMANDS",
    "CNI_VERSIONS",
    "FRAME_MAGIC",
    "FRAME_MAX_ANSWER",
    "FRAME_MAX_ENV",
    "FRAME_MAX_ENV_ENTRY",
    "FRAME_MAX_REQUEST",
    "FRAME_MAX_STDIN",
    "MAX_MESSAGE",
    "MAX_STDIN",
    "OPS",
    "POD_OPS",
    "PROTOCOL_VERSION",
    "FrameAnswer",
    "FrameError",
    "c_header",
    "cni_request",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_line",
    "encode_request",
    "encode_unavailable",
    "init_result",
    "pod_output",
    "pod_request",
    "pod_result",
    "process_environ",
    "read_frame_header",
    "request",
    "run_pod_op",
    "settings",
    "version_answer",
]

# Not typing's TYPE_CHECKING: importing typing would put the CLI's daemon path (and the Python shim's) over its target.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Protocol

    from netplugin.core.names import PodRef

    class _PodStatus(Protocol):
        @property
        def ip(self) -> str | None: ...

        def to_dict(self) -> dict[str, Any]: ...

    class _PodActions(Protocol):
        """What a pod op calls: the Manager's three pod actions."""

        def setup(self, pod: PodRef) -> _PodStatus | None: ...

        def teardown(self, pod: PodRef) -> None: ...

        def status(self, pod: PodRef) -> _PodStatus | None: ...


# --- the messages' limits and names --------------------------------------------------------------

PROTOCOL_VERSION = 1
POD_OPS = ("setup", "teardown", "status")
OPS = (*POD_OPS, "init", "plugins", "pods", "gc", "health", "cni")
#: the longest line either side accepts (a plugins or pods listing is far smaller)
MAX_MESSAGE = 16 << 20
#: the largest network config a CNI call reads from stdin (a conflist with a prevResult is a few KB)
MAX_STDIN = 4 << 20
#: the CNI versions op ``cni`` (and the shim that sends it) speaks, oldest first
CNI_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
#: The CNI commands (spec order), each with (its timed operation: the daemon metrics' and the
#: kubelet's operation type, or None; the daemon op or plugin action its answer may wait for, or
#: None: never forwarded, the shim answers it). GC waits for one teardown per stale attachment.
#: Here, not in :mod:`netplugin.frontends.cni.spec`: the router reads it on every call, and this
#: module is already in its import set (BENCHMARKS.md, runtime-add row Gpy).
CNI_COMMANDS: "dict[str, tuple[str | None, str | None]]" = {
    "ADD": ("setup", "setup"),
    "DEL": ("teardown", "teardown"),
    "CHECK": ("status", "status"),
    "VERSION": (None, None),
    "STATUS": (None, "init"),
    "GC": (None, "gc"),
}

# --- requests ----------------------------------------------------------------------------------------


def process_environ() -> "dict[str, str]":
    """This process's environment, decoded as ``os.environ`` decodes it, without importing ``os``
    (with ``os.path`` and ``_collections_abc`` it would weigh on the fast paths; requests carry variables)."""
    enc = sys.getfilesystemencoding()
    return {k.decode(enc, "surrogateescape"): v.decode(enc, "surrogateescape") for k, v in posix.environ.items()}


def encode_line(message: "dict[str, Any]") -> bytes:
    """One message as it goes on the socket: compact JSON and a newline (a request line starts with ``{``)."""
    return dumps(message).encode() + b"\n"


def request(op: str, **args: "Any") -> "dict[str, Any]":
    """The request for ``op``; arguments that are None are left out (the daemon's defaults apply)."""
    return {"v": PROTOCOL_VERSION, "op": op, **{k: v for k, v in args.items() if v is not None}}


def is_progress(response: "dict[str, Any]") -> bool:
    """Whether an answer line is a progress line (see above), not the request's answer."""
    return isinstance(response.get("progress"), str) and "result" not in response and "error" not in response


def progress_line(text: str) -> "dict[str, Any]":
    """A progress line's object."""
    return {"ok": True, "progress": text}


def settings(config_path: str | None, environ: "Mapping[str, str]", overrides: "Mapping[str, str]") -> "dict[str, Any]":
    """A caller's raw settings (instead of its fingerprint): the daemon builds the config from them."""
    return {
        "config_path": config_path,
        "environ": {k: v for k, v in environ.items() if k.startswith("NETPLUGIN_")},
        "overrides": dict(overrides),
    }


def pod_request(op: str, namespace: str, pod: str, infra_id: str, **args: "Any") -> "dict[str, Any]":
    """A setup, teardown or status request (``config`` or ``settings`` among ``args``)."""
    return request(op, namespace=namespace, pod=pod, infra_id=infra_id, **args)


def cni_request(environ: "Mapping[str, str]", stdin: str) -> "dict[str, Any]":
    """Op ``cni``: one CNI call, its ``CNI_*`` and ``NETPLUGIN_*`` variables and its network config."""
    forwarded = {k: v for k, v in environ.items() if k.startswith(("CNI_", "NETPLUGIN_"))}
    return request("cni", environ=forwarded, stdin=stdin)


# --- answers ------------------------------------------------------------------------------------------


def init_result(chain: "tuple[str, ...]", members: "Mapping[str, bool]") -> "dict[str, Any]":
    """An init's answer: the chain (``plugin``, its names joined by commas), whether any member's init
    ran now, and for a longer chain than one each member's (a chain of one answers as before chains)."""
    out: dict[str, Any] = {"plugin": ",".join(chain), "ran": any(members.values())}
    if len(chain) > 1:
        out["members"] = [{"plugin": name, "ran": members.get(name, False)} for name in chain]
    return out


def pod_result(op: str, status: "_PodStatus | None") -> "dict[str, Any] | None":
    """A pod action's result from the manager's answer (``status``: the pod's network status or None)."""
    if op == "setup":
        return {"ip": status.ip if status is not None else None}
    if op == "teardown":
        return None
    return status.to_dict() if status is not None else None


def run_pod_op(actions: "_PodActions", op: str, pod: "PodRef") -> "dict[str, Any] | None":
    """Run pod op ``op`` (one of :data:`POD_OPS`) with the manager's call, answered as :func:`pod_result`."""
    if op == "setup":
        return pod_result(op, actions.setup(pod))
    if op == "teardown":
        actions.teardown(pod)
        return pod_result(op, None)
    return pod_result(op, actions.status(pod))


def version_answer(asked: object) -> "dict[str, Any]":
    """CNI ``VERSION``'s answer: the config's ``cniVersion`` when spoken here (else the latest), and every version."""
    version = asked if isinstance(asked, str) and asked in CNI_VERSIONS else CNI_VERSIONS[-1]
    return {"cniVersion": version, "supportedVersions": list(CNI_VERSIONS)}


def pod_output(op: str, namespace: str, pod: str, infra_id: str, result: "Any") -> "tuple[Any, str | None]":
    """What the CLI prints for a pod action's result: (the JSON document, the text line or None)."""
    ref = {"namespace": namespace, "pod": pod, "infra_id": infra_id}
    if op == "setup":
        return {**ref, "ip": result.get("ip") if isinstance(result, dict) else None}, None
    if op == "teardown":
        return ref, None
    if not isinstance(result, dict):
        return result, None
    ip = result.get("ip")
    return result, "" if ip is None else str(ip)


# --- the compiled shim's frame (see the module docstring) ---------------------------------------------

FRAME_MAGIC = b"NPF\x01"
FRAME_MAX_ENV = 128
FRAME_MAX_ENV_ENTRY = 32 << 10
FRAME_MAX_STDIN = MAX_STDIN + 1
_FIELD = 5  # tag + u32 length
_HEADER = 8  # magic + u32 body length
FRAME_MAX_REQUEST = FRAME_MAX_ENV * (_FIELD + FRAME_MAX_ENV_ENTRY) + _FIELD + FRAME_MAX_STDIN
FRAME_MAX_ANSWER = MAX_MESSAGE
#: GC has no fixed bound (one teardown per stale attachment); the compiled shim waits at most this
FRAME_GC_WAIT = 3600.0
_ENV, _STDIN, _EXIT, _STDOUT, _STDERR, _UNAVAILABLE = b"EIXORU"
_ENV_PREFIXES = ("CNI_", "NETPLUGIN_")
_TAGS: "tuple[tuple[str, int], ...]" = (("ENV", _ENV), ("STDIN", _STDIN), ("EXIT", _EXIT), ("STDOUT", _STDOUT))
_TAGS += (("STDERR", _STDERR), ("UNAVAILABLE", _UNAVAILABLE))


class FrameError(ValueError):
    """A frame that breaks the format; the text names the field and the reason.

    ``code`` is the CNI error code the caller gets: :data:`CNI_INVALID_ENV` for a variable the call
    cannot carry, :data:`CNI_IO_FAILURE` for one too large (or too many) or a broken frame.
    """

    def __init__(self, message: str, code: int = CNI_IO_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def _field(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + len(value).to_bytes(4, "big") + value


def _frame(body: bytes) -> bytes:
    return FRAME_MAGIC + len(body).to_bytes(4, "big") + body


def read_frame_header(head: bytes, limit: int) -> int:
    """The body length of a frame from its first 8 bytes; FrameError on bad magic or past ``limit``."""
    if len(head) != _HEADER or head[:4] != FRAME_MAGIC:
        raise FrameError(f"frame: bad magic {head[:4]!r} (want {FRAME_MAGIC!r})")
    size = int.from_bytes(head[4:], "big")
    if size > limit:
        raise FrameError(f"frame: body of {size} bytes exceeds the limit of {limit}")
    return size


def _fields(body: bytes) -> "list[tuple[int, bytes]]":
    out = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < _FIELD:
            raise FrameError(f"frame: truncated field header at byte {pos}")
        tag, size = body[pos], int.from_bytes(body[pos + 1 : pos + _FIELD], "big")
        pos += _FIELD
        if size > len(body) - pos:
            raise FrameError(f"frame: field {chr(tag)!r} of {size} bytes runs past the body")
        out.append((tag, body[pos : pos + size]))
        pos += size
    return out


def encode_request(environ: "Mapping[str, str]", stdin: bytes) -> bytes:
    """A request frame (the C shim's, written in Python for tests and tools)."""
    fields = [_field(_ENV, f"{k}={v}".encode()) for k, v in environ.items() if k.startswith(_ENV_PREFIXES)]
    return _frame(b"".join(fields) + _field(_STDIN, stdin))


def _env_entry(value: bytes) -> "tuple[str, str]":
    if len(value) > FRAME_MAX_ENV_ENTRY:
        raise FrameError(f"frame: environment entry of {len(value)} bytes (limit {FRAME_MAX_ENV_ENTRY})")
    name, eq, val = value.partition(b"=")
    try:
        key, text = name.decode(), val.decode()
    except UnicodeDecodeError:
        raise FrameError(f"frame: environment entry {name[:40]!r} is not UTF-8", CNI_INVALID_ENV) from None
    if not eq or not key.startswith(_ENV_PREFIXES) or "\0" in key or "\0" in text:
        raise FrameError(f"frame: environment entry {name[:40]!r} is not a CNI_/NETPLUGIN_ NAME=VALUE", CNI_INVALID_ENV)
    return key, text


def decode_request(body: bytes) -> "tuple[dict[str, str], bytes]":
    """(environment, stdin) of a request body; FrameError names what is wrong."""
    environ: dict[str, str] = {}
    stdin: bytes | None = None
    for tag, value in _fields(body):
        if tag == _ENV:
            if len(environ) >= FRAME_MAX_ENV:
                raise FrameError(f"frame: more than {FRAME_MAX_ENV} environment entries")
            key, text = _env_entry(value)
            environ[key] = text
        elif tag == _STDIN:
            if stdin is not None:
                raise FrameError("frame: stdin given twice")
            if len(value) > FRAME_MAX_STDIN:
                raise FrameError(f"frame: stdin of {len(value)} bytes (limit {FRAME_MAX_STDIN})")
            stdin = value
        else:
            raise FrameError(f"frame: unknown request field {chr(tag)!r}")
    return environ, stdin or b""


def encode_answer(code: int, stdout: bytes = b"", stderr: bytes = b"") -> bytes:
    """An answer frame: exit status ``code`` (0-255), and what to write to stdout and stderr."""
    body = _field(_EXIT, bytes([code & 0xFF]))
    if stdout:
        body += _field(_STDOUT, stdout[: FRAME_MAX_ANSWER // 2])
    if stderr:
        body += _field(_STDERR, stderr[: FRAME_MAX_ANSWER // 4])
    return _frame(body)


def encode_unavailable(reason: str) -> bytes:
    """The answer "not run here" (the shim falls back); ``reason`` goes into its error 11."""
    return _frame(_field(_UNAVAILABLE, reason.encode()[:4096]))


class FrameAnswer:
    """A decoded answer frame: ``code`` (None when ``unavailable``), ``stdout``, ``stderr``."""

    def __init__(self, code: int | None, stdout: bytes, stderr: bytes, unavailable: str | None) -> None:
        self.code, self.stdout, self.stderr, self.unavailable = code, stdout, stderr, unavailable


def decode_answer(frame: bytes) -> FrameAnswer:
    """An answer frame (header included), checked as the C shim checks it."""
    size = read_frame_header(frame[:_HEADER], FRAME_MAX_ANSWER)
    if len(frame) != _HEADER + size:
        raise FrameError(f"frame: {len(frame) - _HEADER} body bytes, header says {size}")
    seen: dict[int, bytes] = {}
    for tag, value in _fields(frame[_HEADER:]):
        if tag not in (_EXIT, _STDOUT, _STDERR, _UNAVAILABLE):
            raise FrameError(f"frame: unknown answer field {chr(tag)!r}")
        if tag in seen:
            raise FrameError(f"frame: answer field {chr(tag)!r} given twice")
        seen[tag] = value
    if _UNAVAILABLE in seen:
        return FrameAnswer(None, b"", b"", seen[_UNAVAILABLE].decode("utf-8", "replace"))
    if _EXIT not in seen or len(seen[_EXIT]) != 1:
        raise FrameError("frame: answer without a 1-byte exit status")
    return FrameAnswer(seen[_EXIT][0], seen.get(_STDOUT, b""), seen.get(_STDERR, b""), None)


def c_header() -> str:
    """The C header of the frame's numbers (``netplugin_frame.h``), generated from this module."""
    from netplugin.core.defaults import CONNECT_TIMEOUT, answer_timeout

    versions = ",".join(f'\\"{v}\\"' for v in CNI_VERSIONS)
    add_wait = answer_timeout("setup") or FRAME_GC_WAIT  # the Python shim's bound with default settings
    defines = {
        "NPF_MAGIC": '"' + "".join(f"\\x{b:02x}" for b in FRAME_MAGIC) + '"',
        "NPF_MAGIC_LEN": len(FRAME_MAGIC),
        "NPF_HEADER": _HEADER,
        "NPF_FIELD": _FIELD,
        "NPF_MAX_ENV": FRAME_MAX_ENV,
        "NPF_MAX_ENV_ENTRY": FRAME_MAX_ENV_ENTRY,
        "NPF_MAX_STDIN": FRAME_MAX_STDIN,
        "NPF_MAX_REQUEST": FRAME_MAX_REQUEST,
        "NPF_MAX_ANSWER": FRAME_MAX_ANSWER,
        **{f"NPF_TAG_{name}": f"'{chr(tag)}'" for name, tag in _TAGS},
        "NPF_CONNECT_TIMEOUT_MS": int(CONNECT_TIMEOUT * 1000),
        "NPF_ANSWER_TIMEOUT_MS": int(add_wait * 1000),
        "NPF_GC_TIMEOUT_MS": int(FRAME_GC_WAIT * 1000),
        "NPF_E_TRY_AGAIN": CNI_TRY_AGAIN,
        "NPF_E_IO": CNI_IO_FAILURE,
        "NPF_E_INVALID_ENV": CNI_INVALID_ENV,
        "NPF_CNI_LATEST": f'"{CNI_VERSIONS[-1]}"',
        "NPF_CNI_VERSIONS": f'"{versions}"',
    }
    lines = [
        "/* Generated by `python3 -m netplugin.frontends.wire.protocol --c-header`: do not edit. */",
        "#ifndef NETPLUGIN_FRAME_H",
        "#define NETPLUGIN_FRAME_H",
        *(f"#define {k} {v}" for k, v in defines.items()),
        "#endif",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--c-header"]:
        sys.stderr.write("usage: python3 -m netplugin.frontends.wire.protocol --c-header\n")
        sys.exit(2)
    sys.stdout.write(c_header())
