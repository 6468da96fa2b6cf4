"""The binary frame of the compiled CNI shim (``netplugin-cni`` in C), and its C header.

The compiled shim parses no JSON: it sends the call's ``CNI_*``/``NETPLUGIN_*`` environment and
its stdin in one frame, and writes what the daemon answers. All integers are big-endian; a JSON
request line starts with ``{``, so the daemon's listener tells a frame by its first byte.

Request: :data:`MAGIC`, ``u32`` body length (at most :data:`FRAME_MAX_REQUEST`), then fields, each
``tag (1 byte) | u32 length | value``:

* ``E`` one environment entry ``NAME=VALUE`` whose NAME starts with ``CNI_`` or ``NETPLUGIN_``; at
  most :data:`FRAME_MAX_ENV` of them, each at most :data:`FRAME_MAX_ENV_ENTRY` bytes;
* ``I`` the standard input, at most once, at most :data:`FRAME_MAX_STDIN` bytes: the shim reads one
  byte past the CNI shim's ``MAX_STDIN``, so the daemon refuses an oversized config with the very
  message a local run gives.

Answer: :data:`MAGIC`, ``u32`` body length (at most :data:`FRAME_MAX_ANSWER`), then fields:

* ``X`` the exit status, 1 byte, exactly once; ``O`` bytes for stdout and ``R`` bytes for stderr,
  each at most once;
* ``U`` (instead of ``X``): the daemon did not run the call (it is unavailable, draining, or runs
  with other settings); the value says why. The shim then falls back: it execs the Python shim
  with the same environment and stdin (standalone nodes) or prints CNI error 11 (cluster mode).

The C source includes the header :func:`c_header` writes (``python3 -m
netplugin.frontends.shimframe --c-header``), so the numbers have this one home. Standard library
only: the daemon and the build step import it.
"""

from __future__ import annotations

import struct
import sys

from netplugin.frontends.client import CONNECT_TIMEOUT, MAX_MESSAGE
from netplugin.frontends.cni.fast import E_TRY_AGAIN, LATEST, MAX_STDIN, SUPPORTED_VERSIONS, answer_timeout

__all__ = [
    "FRAME_MAX_ANSWER",
    "FRAME_MAX_ENV",
    "FRAME_MAX_ENV_ENTRY",
    "FRAME_MAX_REQUEST",
    "FRAME_MAX_STDIN",
    "MAGIC",
    "Answer",
    "FrameError",
    "c_header",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
    "encode_unavailable",
    "read_header",
]

MAGIC = b"NPF\x01"
#: variable prefixes a frame may carry (the same the Python shim forwards)
ENV_PREFIXES = ("CNI_", "NETPLUGIN_")
FRAME_MAX_ENV = 128
FRAME_MAX_ENV_ENTRY = 32 << 10
FRAME_MAX_STDIN = MAX_STDIN + 1
_FIELD = 5  # tag + u32 length
FRAME_MAX_REQUEST = FRAME_MAX_ENV * (_FIELD + FRAME_MAX_ENV_ENTRY) + _FIELD + FRAME_MAX_STDIN
FRAME_MAX_ANSWER = MAX_MESSAGE
HEADER = 8  # magic + u32 body length

TAG_ENV, TAG_STDIN = ord("E"), ord("I")
TAG_EXIT, TAG_STDOUT, TAG_STDERR, TAG_UNAVAILABLE = ord("X"), ord("O"), ord("R"), ord("U")


class FrameError(ValueError):
    """A frame that breaks the format; the text names the field and the reason."""


def _field(tag: int, value: bytes) -> bytes:
    return struct.pack(">BI", tag, len(value)) + value


def _frame(body: bytes) -> bytes:
    return MAGIC + struct.pack(">I", len(body)) + body


def read_header(head: bytes, limit: int) -> int:
    """The body length of a frame from its first 8 bytes; FrameError past ``limit`` or on bad magic."""
    if len(head) != HEADER or head[:4] != MAGIC:
        raise FrameError(f"frame: bad magic {head[:4]!r} (want {MAGIC!r})")
    size = int.from_bytes(head[4:], "big")
    if size > limit:
        raise FrameError(f"frame: body of {size} bytes exceeds the limit of {limit}")
    return size


def _fields(body: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < _FIELD:
            raise FrameError(f"frame: truncated field header at byte {pos}")
        tag, size = struct.unpack_from(">BI", body, pos)
        pos += _FIELD
        if size > len(body) - pos:
            raise FrameError(f"frame: field {chr(tag)!r} of {size} bytes runs past the body")
        out.append((tag, body[pos : pos + size]))
        pos += size
    return out


def encode_request(environ: dict[str, str], stdin: bytes) -> bytes:
    """A request frame (the C shim's, written in Python for tests and tools)."""
    fields = [_field(TAG_ENV, f"{k}={v}".encode()) for k, v in environ.items() if k.startswith(ENV_PREFIXES)]
    return _frame(b"".join(fields) + _field(TAG_STDIN, stdin))


def decode_request(body: bytes) -> tuple[dict[str, str], bytes]:
    """(environment, stdin) of a request body; FrameError names what is wrong."""
    environ: dict[str, str] = {}
    stdin: bytes | None = None
    for tag, value in _fields(body):
        if tag == TAG_ENV:
            if len(environ) >= FRAME_MAX_ENV:
                raise FrameError(f"frame: more than {FRAME_MAX_ENV} environment entries")
            if len(value) > FRAME_MAX_ENV_ENTRY:
                raise FrameError(f"frame: environment entry of {len(value)} bytes (limit {FRAME_MAX_ENV_ENTRY})")
            name, eq, val = value.partition(b"=")
            try:
                key, text = name.decode(), val.decode()
            except UnicodeDecodeError:
                raise FrameError(f"frame: environment entry {name[:40]!r} is not UTF-8") from None
            if not eq or not key.startswith(ENV_PREFIXES) or "\0" in key or "\0" in text:
                raise FrameError(f"frame: environment entry {name[:40]!r} is not a CNI_/NETPLUGIN_ NAME=VALUE")
            environ[key] = text
        elif tag == TAG_STDIN:
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
    body = _field(TAG_EXIT, bytes([code & 0xFF]))
    if stdout:
        body += _field(TAG_STDOUT, stdout[: FRAME_MAX_ANSWER // 2])
    if stderr:
        body += _field(TAG_STDERR, stderr[: FRAME_MAX_ANSWER // 4])
    return _frame(body)


def encode_unavailable(reason: str) -> bytes:
    """The answer "not run here" (the shim falls back); ``reason`` is logged by the shim's fallback."""
    return _frame(_field(TAG_UNAVAILABLE, reason.encode()[:4096]))


class Answer:
    """A decoded answer frame: ``code`` (None when ``unavailable``), ``stdout``, ``stderr``."""

    def __init__(self, code: int | None, stdout: bytes, stderr: bytes, unavailable: str | None) -> None:
        self.code, self.stdout, self.stderr, self.unavailable = code, stdout, stderr, unavailable


def decode_answer(frame: bytes) -> Answer:
    """An answer frame (header included), checked as the C shim checks it."""
    size = read_header(frame[:HEADER], FRAME_MAX_ANSWER)
    if len(frame) != HEADER + size:
        raise FrameError(f"frame: {len(frame) - HEADER} body bytes, header says {size}")
    seen: dict[int, bytes] = {}
    for tag, value in _fields(frame[HEADER:]):
        if tag not in (TAG_EXIT, TAG_STDOUT, TAG_STDERR, TAG_UNAVAILABLE):
            raise FrameError(f"frame: unknown answer field {chr(tag)!r}")
        if tag in seen:
            raise FrameError(f"frame: answer field {chr(tag)!r} given twice")
        seen[tag] = value
    if TAG_UNAVAILABLE in seen:
        return Answer(None, b"", b"", seen[TAG_UNAVAILABLE].decode("utf-8", "replace"))
    if TAG_EXIT not in seen or len(seen[TAG_EXIT]) != 1:
        raise FrameError("frame: answer without a 1-byte exit status")
    return Answer(seen[TAG_EXIT][0], seen.get(TAG_STDOUT, b""), seen.get(TAG_STDERR, b""), None)


def c_header() -> str:
    """The C header of the frame's numbers (``netplugin_frame.h``), generated from this module."""
    versions = ",".join(f'\\"{v}\\"' for v in SUPPORTED_VERSIONS)
    defines = {
        "NPF_MAGIC": '"' + "".join(f"\\x{b:02x}" for b in MAGIC) + '"',
        "NPF_MAGIC_LEN": len(MAGIC),
        "NPF_HEADER": HEADER,
        "NPF_FIELD": _FIELD,
        "NPF_MAX_ENV": FRAME_MAX_ENV,
        "NPF_MAX_ENV_ENTRY": FRAME_MAX_ENV_ENTRY,
        "NPF_MAX_STDIN": FRAME_MAX_STDIN,
        "NPF_MAX_REQUEST": FRAME_MAX_REQUEST,
        "NPF_MAX_ANSWER": FRAME_MAX_ANSWER,
        "NPF_TAG_ENV": f"'{chr(TAG_ENV)}'",
        "NPF_TAG_STDIN": f"'{chr(TAG_STDIN)}'",
        "NPF_TAG_EXIT": f"'{chr(TAG_EXIT)}'",
        "NPF_TAG_STDOUT": f"'{chr(TAG_STDOUT)}'",
        "NPF_TAG_STDERR": f"'{chr(TAG_STDERR)}'",
        "NPF_TAG_UNAVAILABLE": f"'{chr(TAG_UNAVAILABLE)}'",
        "NPF_CONNECT_TIMEOUT_MS": int(CONNECT_TIMEOUT * 1000),
        # the Python shim's bound with default settings; GC waits as long as it does there
        "NPF_ANSWER_TIMEOUT_MS": int(answer_timeout({}, "ADD") * 1000),
        "NPF_GC_TIMEOUT_MS": int(answer_timeout({}, "GC") * 1000),
        "NPF_E_TRY_AGAIN": E_TRY_AGAIN,
        "NPF_CNI_LATEST": f'"{LATEST}"',
        "NPF_CNI_VERSIONS": f'"{versions}"',
    }
    lines = [
        "/* Generated by `python3 -m netplugin.frontends.shimframe --c-header`: do not edit. */",
        "#ifndef NETPLUGIN_FRAME_H",
        "#define NETPLUGIN_FRAME_H",
        *(f"#define {k} {v}" for k, v in defines.items()),
        "#endif",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["--c-header"]:
        print("usage: python3 -m netplugin.frontends.shimframe --c-header", file=sys.stderr)
        return 2
    sys.stdout.write(c_header())
    return 0


if __name__ == "__main__":
    sys.exit(main())
