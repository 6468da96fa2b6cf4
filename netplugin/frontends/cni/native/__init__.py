"""Building the compiled ``netplugin-cni`` (C, libc only) from the source shipped in this package.

The source (``netplugin_cni.c``) includes a header generated from
:mod:`netplugin.frontends.rpc`, so the frame's numbers have one home. :func:`build_native`
compiles it with warnings as errors and hardening flags, with the socket path and the fallback
(the Python shim to exec, or none: cluster mode, CNI error 11) fixed at build time. Why C: it needs
only the compiler every distribution ships, no runtime and no toolchain download (Rust or Go would
need theirs on the node or in the image's build stage), and the program is ~400 lines of poll,
read, write and a length-prefixed frame, where libc is all one needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

__all__ = ["CFLAGS", "SANITIZE", "NoCompiler", "build_native", "compiler", "main", "source_path"]

#: warnings as errors, and the hardening Debian's dpkg-buildflags gives (fortify, stack protector,
#: PIE, full RELRO)
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
    "-pie",
    "-Wl,-z,relro,-z,now",
)
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
    flags: tuple[str, ...] = CFLAGS,
    extra_sources: tuple[str, ...] = (),
    defines: tuple[str, ...] = (),
) -> str:
    """Compile the shim to ``dest`` (atomically, mode 0755); returns ``dest``.

    ``socket``: the daemon's socket when ``NETPLUGIN_SOCKET`` is unset (default
    ``/run/netplugin/netplugin.sock``); ``fallback``: the Python shim to exec when the daemon does not
    run a call, or "" for cluster mode (CNI error 11). Raises NoCompiler, ValueError for a path
    that cannot be a C string, or subprocess.CalledProcessError with the compiler's output.
    """
    from netplugin.frontends.rpc import c_header

    cc = compiler()
    args = [f"-DNP_FALLBACK={_c_string(fallback, 'fallback')}", *defines]
    if socket:
        args.append(f"-DNP_SOCKET={_c_string(socket, 'socket')}")
    with tempfile.TemporaryDirectory(prefix="netplugin-cni-build.") as tmp:
        with open(os.path.join(tmp, "netplugin_frame.h"), "w") as f:
            f.write(c_header())
        out = os.path.join(tmp, "netplugin-cni")
        cmd = [cc, *flags, "-I", tmp, *args, "-o", out, source_path(), *extra_sources]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
        os.chmod(out, 0o755)
        if os.path.isdir(dest):
            dest = os.path.join(dest, "netplugin-cni")
        tmp_dest = f"{dest}.tmp{os.getpid()}"
        shutil.copyfile(out, tmp_dest)
        os.chmod(tmp_dest, 0o755)
        os.replace(tmp_dest, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    """``python -m netplugin.frontends.cni.native DEST [--socket PATH] [--fallback PATH|none]``.

    For install scripts that run an interpreter without netplugin's CLI (stdlib only). Exit 0 built,
    3 no compiler, 1 the build failed (the compiler's output on stderr), 2 usage.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m netplugin.frontends.cni.native")
    parser.add_argument("dest")
    parser.add_argument("--socket", default=None)
    parser.add_argument("--fallback", default="", help="the Python shim to exec, or none (cluster mode)")
    args = parser.parse_args(argv)
    try:
        print(build_native(args.dest, socket=args.socket, fallback="" if args.fallback == "none" else args.fallback))
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
