"""Building the compiled ``netplugin-cni`` (C, libc only) from the source shipped in this package.

The source (``netplugin_cni.c``) includes a header generated from
:mod:`netplugin.frontends.wire.protocol`, so the frame's numbers have one home. :func:`build_native`
compiles it with warnings as errors and hardening flags, with netplugin's version compiled in
(``netplugin-cni --version``, :func:`version_of`), the socket path and the fallback
(the Python shim to exec, or none: cluster mode, CNI error 11) in two slots of the binary;
:func:`install_built` installs a binary built elsewhere (the image's build stage) with this node's
socket and fallback written into those slots, so a node without a compiler needs none. Why C: it needs
only the compiler every distribution ships, no runtime and no toolchain download (Rust or Go would
need theirs on the node or in the image's build stage), and the program is a few hundred lines of poll,
read, write and a length-prefixed frame, where libc is all one needs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from netplugin import __version__
from netplugin.frontends.wire.protocol import c_header

__all__ = [
    "CFLAGS",
    "LINKS",
    "MAX_BINARY",
    "SANITIZE",
    "SLOT_MARKS",
    "SLOT_SIZE",
    "VERSION_MARK",
    "NoCompiler",
    "build_native",
    "compiler",
    "install_built",
    "main",
    "slots",
    "source_path",
    "version_of",
]

#: warnings as errors, and the hardening Debian's dpkg-buildflags gives (fortify, stack protector,
#: PIE, full RELRO); linked as a static PIE (see :data:`LINKS`), else dynamically
CFLAGS = (
    "-std=c11",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wformat=2",
    "-Wshadow",
    "-Wvla",
    "-D_FORTIFY_SOURCE=2",
    "-fstack-protector-strong",
    "-fstack-clash-protection",
    "-fPIE",
    "-Wl,-z,relro,-z,now",
)
#: how the shim is linked, in order of preference. A static PIE keeps ASLR and RELRO and starts
#: sooner than a dynamic one (no loader, no relocations, on the path of every CNI call), and it
#: runs on any node whatever its libc (the image's build stage builds the binary that a DaemonSet
#: copies onto the host). It needs the static libc (libc6-dev's libc.a); a toolchain without it
#: links the shim dynamically.
LINKS = (("-static-pie",), ("-pie",))
#: the test build: AddressSanitizer and UndefinedBehaviorSanitizer, aborting on the first report
SANITIZE = (
    "-std=c11",
    "-O1",
    "-g",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
)


#: bytes per slot (marker, value, NUL): a socket path is at most 107 bytes (sun_path), a fallback
#: path is the Python shim's in the CNI bin dir
SLOT_SIZE = 256
#: each slot's marker, which occurs exactly once in a built binary
SLOT_MARKS = {"socket": "@netplugin-cni:socket=", "fallback": "@netplugin-cni:fallback="}
#: what precedes netplugin's version (compiled in, read-only) in a built binary
VERSION_MARK = "@netplugin-cni:version="
#: a built shim is well under a MiB, static or dynamic; anything far larger is not one
MAX_BINARY = 4 << 20


class NoCompiler(Exception):
    """No C compiler on this machine (the Python shim is installed instead)."""


def source_path() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "netplugin_cni.c")


def compiler() -> str:
    """``$CC`` when set (only it), else cc, gcc or clang from PATH; NoCompiler when none is there."""
    chosen = os.environ.get("CC")
    for name in (chosen,) if chosen else ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise NoCompiler(f"no C compiler ({chosen or 'cc, gcc or clang'}) found")


def _c_string(value: str, what: str) -> str:
    if any(c in value for c in '"\\\n\0') or not value.isprintable():
        raise ValueError(f"{what} {value!r}: must not contain quotes, backslashes or control characters")
    return f'"{value}"'


def build_native(
    dest: str,
    *,
    socket: str | None = None,
    fallback: str = "",
    flags: tuple[str, ...] | None = None,
    extra_sources: tuple[str, ...] = (),
    defines: tuple[str, ...] = (),
) -> str:
    """Compile the shim to ``dest`` (atomically, mode 0755); returns ``dest``.

    ``socket``: the daemon's socket when ``NETPLUGIN_SOCKET`` is unset (default
    ``/run/netplugin/netplugin.sock``); ``fallback``: the Python shim to exec when the daemon does not
    run a call, or "" for cluster mode (CNI error 11). ``flags``: the whole command line's flags
    (the sanitizer build); by default :data:`CFLAGS` with the first of :data:`LINKS` that links.
    Raises NoCompiler, ValueError for a path that cannot be a C string, or
    subprocess.CalledProcessError with the compiler's output (of the last link tried).
    """
    cc = compiler()
    args = [f"-DNP_FALLBACK={_c_string(fallback, 'fallback')}", f"-DNP_SLOT_SIZE={SLOT_SIZE}", *defines]
    args += [f"-DNP_VERSION={_c_string(__version__, 'version')}"]
    args += [f"-DNP_VERSION_MARK={_c_string(VERSION_MARK, 'marker')}"]
    args += [f"-DNP_{name.upper()}_MARK={_c_string(mark, 'marker')}" for name, mark in SLOT_MARKS.items()]
    if socket:
        args.append(f"-DNP_SOCKET={_c_string(socket, 'socket')}")
    with tempfile.TemporaryDirectory(prefix="netplugin-cni-build.") as tmp:
        with open(os.path.join(tmp, "netplugin_frame.h"), "w") as f:
            f.write(c_header())
        out = os.path.join(tmp, "netplugin-cni")
        tries = [flags] if flags is not None else [CFLAGS + link for link in LINKS]
        for i, tried in enumerate(tries):
            cmd = [cc, *tried, "-I", tmp, *args, "-o", out, source_path(), *extra_sources]
            try:
                subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
                break
            except subprocess.CalledProcessError:
                if i == len(tries) - 1:
                    raise
        with open(out, "rb") as f:
            return _write(dest, f.read())


def _write(dest: str, data: bytes) -> str:
    """``data`` to ``dest`` (a directory: its ``netplugin-cni``), atomically, mode 0755."""
    if os.path.isdir(dest):
        dest = os.path.join(dest, "netplugin-cni")
    tmp_dest = f"{dest}.tmp{os.getpid()}"
    with open(tmp_dest, "wb") as f:
        f.write(data)
    os.chmod(tmp_dest, 0o755)
    os.replace(tmp_dest, dest)
    return dest


def _read_built(path: str) -> bytearray:
    with open(path, "rb") as f:
        data = bytearray(f.read(MAX_BINARY + 1))
    if len(data) > MAX_BINARY or not data.startswith(b"\x7fELF"):
        raise ValueError(f"{path}: not a compiled netplugin-cni (not an ELF file of at most {MAX_BINARY} bytes)")
    for name, mark in SLOT_MARKS.items():
        if data.count(mark.encode()) != 1:
            raise ValueError(f"{path}: not a compiled netplugin-cni of this netplugin (its {name} slot is missing)")
    return data


def slots(path: str) -> dict[str, str]:
    """The socket and the fallback ("": cluster mode) the compiled shim at ``path`` has in its slots.

    Raises ValueError when ``path`` is not a compiled netplugin-cni, OSError when it cannot be read.
    """
    data = _read_built(path)
    out = {}
    for name, mark in SLOT_MARKS.items():
        start = data.index(mark.encode()) + len(mark)
        value = bytes(data[start : start - len(mark) + SLOT_SIZE - 1])
        out[name] = value.split(b"\0", 1)[0].decode()
    return out


def version_of(path: str) -> str | None:
    """The netplugin version the compiled shim at ``path`` was built from (None: one built before
    shims carried it). Read from the file, not by running it. Raises as :func:`slots`."""
    data = _read_built(path)
    start = data.find(VERSION_MARK.encode())
    if start < 0:
        return None
    value = bytes(data[start + len(VERSION_MARK) : start + SLOT_SIZE]).split(b"\0", 1)[0]
    return value.decode("ascii", "replace")


def install_built(built: str, dest: str, *, socket: str | None = None, fallback: str = "") -> str:
    """Install the compiled shim ``built`` (made by :func:`build_native`, anywhere) as ``dest`` with
    ``socket`` (None: the one it has) and ``fallback`` ("" for cluster mode) written into its slots.

    Raises ValueError when ``built`` is not such a binary (a slot's marker missing or repeated) or a
    value does not fit its slot, OSError when it cannot be read or ``dest`` written.
    """
    data = _read_built(built)
    for name, value in (("socket", socket), ("fallback", fallback)):
        mark = SLOT_MARKS[name].encode()
        if value is None:
            continue
        raw = _c_string(value, name)[1:-1].encode()
        start = data.index(mark) + len(mark)
        room = SLOT_SIZE - len(mark) - 1
        if len(raw) > room:
            raise ValueError(f"{name} {value!r}: longer than its slot's {room} bytes")
        data[start : start - len(mark) + SLOT_SIZE] = raw.ljust(SLOT_SIZE - len(mark), b"\0")
    return _write(dest, bytes(data))


def main(argv: list[str] | None = None) -> int:
    """``python -m netplugin.frontends.cni.native DEST [--socket PATH] [--fallback PATH|none] [--from BUILT]``.

    For install scripts that run an interpreter without netplugin's CLI (stdlib only). Exit 0 built,
    3 no compiler, 1 the build failed (the compiler's output on stderr), 2 usage.
    """
    parser = argparse.ArgumentParser(prog="python -m netplugin.frontends.cni.native")
    parser.add_argument("dest")
    parser.add_argument("--socket", default=None)
    parser.add_argument("--fallback", default="", help="the Python shim to exec, or none (cluster mode)")
    parser.add_argument("--from", dest="built", default=None, help="install this compiled shim instead of compiling")
    args = parser.parse_args(argv)
    fallback = "" if args.fallback == "none" else args.fallback
    try:
        if args.built:
            print(install_built(args.built, args.dest, socket=args.socket, fallback=fallback))
        else:
            print(build_native(args.dest, socket=args.socket, fallback=fallback))
    except NoCompiler as e:
        print(f"netplugin-cni build: {e}", file=sys.stderr)
        return 3
    except subprocess.CalledProcessError as e:
        print(f"netplugin-cni build failed:\n{e.stderr}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"netplugin-cni build: {e}", file=sys.stderr)
        return 1
    return 0
