"""The compiled shim under ASan+UBSan against a hostile daemon, hostile environments and stdin; and a fuzz run.

The daemon is a Python fake on a unix socket that decodes the shim's request with the protocol
module (so the C encoder is checked against it) and then misbehaves as each case says: hangs,
closes mid-frame, sends garbage, lies about sizes, sends a huge answer. The shim is built with its
waits shortened (1.5 s) so a hang costs the test little; any sanitizer report fails the case
(it aborts the shim, and stderr is checked for it).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from netplugin.frontends.cni.native import SANITIZE, build_native, compiler, source_path
from netplugin.frontends.wire.protocol import FRAME_MAGIC as MAGIC
from netplugin.frontends.wire.protocol import (
    FRAME_MAX_ANSWER,
    FRAME_MAX_ENV,
    FRAME_MAX_REQUEST,
    FRAME_MAX_STDIN,
    c_header,
    decode_request,
    encode_answer,
    encode_unavailable,
    read_frame_header,
)

HEADER = 8  # magic + u32 body length

HERE = Path(__file__).resolve().parent
WAIT = ("-DNP_ANSWER_TIMEOUT_MS=1500", "-DNP_IO_TIMEOUT_MS=1500")
SAN_ENV = {"ASAN_OPTIONS": "abort_on_error=1:detect_leaks=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
FALLBACK = '#!/bin/sh\necho "fallback ran $CNI_COMMAND"\nexec cat\n'

Behaviour = Callable[[socket.socket, bytes], None]


class FakeDaemon:
    """A unix socket that reads one request frame per connection, then runs ``behaviour``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.behaviour: Behaviour = lambda conn, body: conn.sendall(encode_answer(0))
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.errors: list[str] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read(self, conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise EOFError(f"got {len(data)} of {n} bytes")
            data += chunk
        return data

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    size = read_frame_header(self._read(conn, HEADER), FRAME_MAX_REQUEST)
                    body = self._read(conn, size)
                    self.requests.append(decode_request(body))
                    self.behaviour(conn, body)
                except Exception as e:  # recorded: the test asserts there were none
                    self.errors.append(f"{type(e).__name__}: {e}")

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture(scope="module")
def san_shims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    try:
        compiler()
    except Exception as e:
        pytest.fail(f"a C compiler is required for the shim's tests (scripts/install-deps.sh installs gcc): {e}")
    d = tmp_path_factory.mktemp("san")
    fallback = d / "fallback"
    fallback.write_text(FALLBACK)
    fallback.chmod(0o755)
    return {
        "standalone": Path(build_native(str(d / "shim"), fallback=str(fallback), flags=SANITIZE, defines=WAIT)),
        "cluster": Path(build_native(str(d / "shim-cluster"), fallback="", flags=SANITIZE, defines=WAIT)),
    }


@pytest.fixture
def daemon() -> Iterator[FakeDaemon]:
    with tempfile.TemporaryDirectory(prefix="npsan") as d:  # short: AF_UNIX paths are limited
        fake = FakeDaemon(os.path.join(d, "s"))
        try:
            yield fake
        finally:
            fake.close()


def _run(
    shim: Path, daemon: FakeDaemon, stdin: bytes = b'{"cniVersion":"1.1.0"}', **env: str
) -> subprocess.CompletedProcess[bytes]:
    full = {"PATH": "/usr/bin:/bin", **SAN_ENV, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc",
            "NETPLUGIN_SOCKET": daemon.path, **env}  # fmt: skip
    done = subprocess.run([str(shim)], input=stdin, env=full, capture_output=True, timeout=60)
    assert b"Sanitizer" not in done.stderr and b"runtime error" not in done.stderr, done.stderr.decode()
    assert done.returncode >= 0, done  # not killed by a signal (an ASan abort)
    return done


def _hang(conn: socket.socket, body: bytes) -> None:
    threading.Event().wait(3)


def _half_answer(conn: socket.socket, body: bytes) -> None:
    conn.sendall(MAGIC + struct.pack(">I", 100) + b"X\x00\x00\x00\x01")


def _garbage(conn: socket.socket, body: bytes) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + os.urandom(64))


def _too_long(conn: socket.socket, body: bytes) -> None:
    conn.sendall(MAGIC + struct.pack(">I", FRAME_MAX_ANSWER + 1) + b"X" * 64)


def _fields(raw: bytes) -> Behaviour:
    return lambda conn, body: conn.sendall(MAGIC + struct.pack(">I", len(raw)) + raw)


def _close(conn: socket.socket, body: bytes) -> None:
    conn.close()


# (behaviour, the CNI error message's part) for answers the shim must refuse as error 11
BROKEN = {
    "hang": (_hang, "no answer to cni after 1s; the operation may still be running"),
    "close-mid-frame": (_half_answer, "in the middle of its answer"),
    "close-before-answer": (_close, "it closed the connection while it ran cni, before answering"),
    "garbage": (_garbage, "answer is not a netplugin frame"),
    "size-past-limit": (_too_long, "answer too long"),
    "field-past-body": (_fields(b"O\x00\x00\x10\x00abc"), "field runs past the body"),
    "exit-twice": (_fields(b"X\x00\x00\x00\x01\x00X\x00\x00\x00\x01\x01"), "field given twice"),
    "exit-two-bytes": (_fields(b"X\x00\x00\x00\x02\x00\x00"), "exit status is not one byte"),
    "no-exit": (_fields(b"O\x00\x00\x00\x02hi"), "no exit status"),
    "unknown-field": (_fields(b"Z\x00\x00\x00\x00"), "unknown field"),
    "truncated-field": (_fields(b"X\x00\x00"), "truncated field header"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_daemon_is_cni_error_11_naming_what_broke(
    case: str, san_shims: dict[str, Path], daemon: FakeDaemon
) -> None:
    import json

    daemon.behaviour, expected = BROKEN[case]
    done = _run(san_shims["standalone"], daemon)
    err = json.loads(done.stdout)
    assert done.returncode == 1 and err["code"] == 11, done
    assert expected in err["msg"] and daemon.path in err["msg"], err["msg"]
    assert daemon.requests and daemon.errors == []


def test_the_answer_is_written_as_sent_with_its_exit_status(san_shims: dict[str, Path], daemon: FakeDaemon) -> None:
    big = os.urandom(3 << 20)  # a huge but valid answer: written whole
    daemon.behaviour = lambda conn, body: conn.sendall(encode_answer(3, big, b"plugin said no\n"))
    done = _run(san_shims["standalone"], daemon)
    assert (done.returncode, done.stdout, done.stderr) == (3, big, b"plugin said no\n")


def test_unavailable_execs_the_fallback_with_the_same_environment_and_stdin(
    san_shims: dict[str, Path], daemon: FakeDaemon
) -> None:
    import json

    daemon.behaviour = lambda conn, body: conn.sendall(encode_unavailable("it is shutting down"))
    stdin = b'{"cniVersion":"1.1.0","name":"x"}'
    done = _run(san_shims["standalone"], daemon, stdin=stdin, CNI_COMMAND="DEL")
    assert (done.returncode, done.stdout) == (0, b"fallback ran DEL\n" + stdin)
    cluster = _run(san_shims["cluster"], daemon, stdin=stdin)
    err = json.loads(cluster.stdout)
    assert err["code"] == 11 and "it is shutting down" in err["msg"], err
    # no daemon at all: the same two outcomes, without any request
    daemon.close()
    os.unlink(daemon.path)
    assert _run(san_shims["standalone"], daemon, stdin=stdin).stdout == b"fallback ran ADD\n" + stdin
    gone = json.loads(_run(san_shims["cluster"], daemon, stdin=stdin).stdout)
    assert gone["code"] == 11 and "unavailable" in gone["msg"], gone


def test_huge_stdin_is_cut_one_byte_past_the_limit(san_shims: dict[str, Path], daemon: FakeDaemon) -> None:
    stdin = b"x" * (FRAME_MAX_STDIN + 12345)
    done = _run(san_shims["standalone"], daemon, stdin=stdin)
    assert done.returncode == 0, done
    (environ, sent) = daemon.requests[-1]
    assert sent == stdin[:FRAME_MAX_STDIN] and environ["CNI_COMMAND"] == "ADD"


def test_a_stdin_that_never_ends_is_a_bounded_wait(san_shims: dict[str, Path], daemon: FakeDaemon) -> None:
    import json

    r, w = os.pipe()
    try:
        full = {"PATH": "/usr/bin:/bin", **SAN_ENV, "CNI_COMMAND": "ADD", "NETPLUGIN_SOCKET": daemon.path}
        done = subprocess.run([str(san_shims["standalone"])], stdin=r, env=full, capture_output=True, timeout=60)
    finally:
        os.close(r)
        os.close(w)
    err = json.loads(done.stdout)
    assert done.returncode == 1 and err["code"] == 5 and "no end of input" in err["msg"], done
    assert daemon.requests == []


@pytest.mark.parametrize(
    ("env", "forwarded"),
    [
        ({f"UNRELATED_{i}": "v" * 1000 for i in range(2000)}, True),  # a huge environment not ours: ignored
        ({f"CNI_X{i}": "v" for i in range(FRAME_MAX_ENV)}, False),  # too many of ours
        ({"CNI_ARGS": "K=" + "v" * (64 << 10)}, False),  # one too long
    ],
    ids=["unrelated", "too-many", "too-long"],
)
def test_environments_past_the_frames_limits_fall_back(
    env: dict[str, str], forwarded: bool, san_shims: dict[str, Path], daemon: FakeDaemon
) -> None:
    import json

    done = _run(san_shims["standalone"], daemon, **env)
    assert done.returncode == 0, done
    assert bool(daemon.requests) is forwarded
    assert done.stdout.startswith(b"fallback ran") is not forwarded
    if forwarded:
        assert not any(k.startswith("UNRELATED") for k in daemon.requests[-1][0])
    else:
        err = json.loads(_run(san_shims["cluster"], daemon, **env).stdout)
        assert err["code"] == 11 and "than the frame allows" in err["msg"], err


def test_the_answer_parser_survives_a_bounded_random_fuzz(tmp_path: Path) -> None:
    """A fixed budget (200k cases, fixed seeds) under ASan+UBSan; libFuzzer's entry point exists for clang."""
    (tmp_path / "netplugin_frame.h").write_text(c_header())
    exe = tmp_path / "fuzz"
    subprocess.run(
        [compiler(), *SANITIZE, "-I", str(tmp_path), "-I", os.path.dirname(source_path()), "-o", str(exe),
         str(HERE / "fuzz_answer.c")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    for seed in ("1", "20261125"):
        done = subprocess.run([str(exe), "100000", seed], capture_output=True, env=SAN_ENV, timeout=300)
        assert done.returncode == 0 and done.stdout == b"fuzzed 100000 answers\n", done.stderr.decode()[-2000:]
