"""Plumbing shared by the benchmark: statistics, run-unique names, fast netns creation, cleanup.

Entering a network namespace is :mod:`netplugin.core.netns`'s job (a netlink socket inside a pod's
netns, the netns helper thread's way back); only creating one (unshare, bind mount) is here.

Everything the benchmark creates carries the run's tag (``np`` + 6 random hex digits) and lives
in 10.202.0.0/16, the block reserved for benchmarks; nothing here touches an interface, address
or route it did not create.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import random
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from netplugin.core.netns import CLONE_NEWNET, entered, setns

__all__ = [
    "BENCH_BLOCK",
    "NETNS_DIR",
    "REPO",
    "BenchError",
    "Cleanup",
    "NetnsFactory",
    "Pod",
    "Stats",
    "SubnetPool",
    "T",
    "ip",
    "links_with_prefix",
    "ms",
    "netns_with_prefix",
    "node_namespaces",
    "rotate",
    "wait_until",
]

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
BENCH_BLOCK = ipaddress.IPv4Network("10.202.0.0/16")
NETNS_DIR = "/var/run/netns"

_MS_BIND = 4096
_MNT_DETACH = 2


class BenchError(Exception):
    """The benchmark cannot go on (a contender failed, a prerequisite is missing)."""


def ms(seconds: float) -> float:
    return seconds * 1000.0


@dataclass(frozen=True)
class Stats:
    """Summary of one sample of durations, in milliseconds."""

    n: int
    median: float
    p90: float
    min: float
    max: float

    @classmethod
    def of(cls, values_ms: Sequence[float]) -> Stats:
        if not values_ms:
            raise ValueError("no samples")
        xs = sorted(values_ms)
        # nearest-rank p90: an observed value, never an interpolation past the largest sample
        rank = max(0, min(len(xs) - 1, -(-9 * len(xs) // 10) - 1))
        return cls(len(xs), statistics.median(xs), xs[rank], xs[0], xs[-1])

    def to_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "median": self.median, "p90": self.p90, "min": self.min, "max": self.max}


@dataclass(frozen=True)
class Pod:
    """One benchmark pod: its infra id is also the name of its network namespace."""

    namespace: str
    name: str
    infra_id: str
    index: int

    @property
    def netns(self) -> str:
        return f"{NETNS_DIR}/{self.infra_id}"


def rotate(items: Sequence[T], by: int) -> list[T]:
    """``items`` rotated left by ``by``: the order contenders run in changes every round."""
    if not items:
        return []
    k = by % len(items)
    return [*items[k:], *items[:k]]


def ip(*args: str, check: bool = True, timeout: float = 60) -> str:
    """Run ``ip ARGS``; returns stdout. BenchError when it fails and ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise BenchError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def links_with_prefix(prefix: str) -> list[str]:
    """Names of root-netns links starting with ``prefix`` (from sysfs: no exec)."""
    try:
        return sorted(n for n in os.listdir("/sys/class/net") if n.startswith(prefix))
    except OSError:
        return []


def netns_with_prefix(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except OSError:
        return []


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


class SubnetPool:
    """Distinct random subnets inside 10.202.0.0/16, so two runs rarely pick the same ones.

    /21s come from 10.202.0.0/18 (8 of them), /24s from 10.202.64.0/18 .. 10.202.255.0 (192).
    """

    def __init__(self, seed: int | None = None) -> None:
        rnd = random.Random(seed)
        self._big = list(ipaddress.IPv4Network("10.202.0.0/18").subnets(new_prefix=21))
        self._small = list(ipaddress.IPv4Network("10.202.64.0/18").subnets(new_prefix=24))
        self._small += list(ipaddress.IPv4Network("10.202.128.0/17").subnets(new_prefix=24))
        rnd.shuffle(self._big)
        rnd.shuffle(self._small)

    def take(self, prefixlen: int) -> ipaddress.IPv4Network:
        pool = self._big if prefixlen == 21 else self._small if prefixlen == 24 else None
        if pool is None:
            raise ValueError("only /21 and /24 subnets are handed out")
        if not pool:
            raise BenchError(f"out of /{prefixlen} subnets in {BENCH_BLOCK}")
        net = pool.pop()
        assert net.subnet_of(BENCH_BLOCK)
        return net


class Cleanup:
    """A LIFO stack of undo actions. ``run()`` runs them all, even when some fail, and reports failures."""

    def __init__(self) -> None:
        self._stack: list[tuple[str, Callable[[], object]]] = []
        self._lock = threading.Lock()

    def push(self, what: str, fn: Callable[[], object]) -> None:
        with self._lock:
            self._stack.append((what, fn))

    def run(self) -> list[str]:
        problems = []
        while True:
            with self._lock:
                if not self._stack:
                    break
                what, fn = self._stack.pop()
            try:
                fn()
            except BaseException as e:  # Ctrl-C during cleanup must not skip the rest
                problems.append(f"{what}: {type(e).__name__}: {e}")
        return problems


class NetnsFactory:
    """Creates and removes named network namespaces in /var/run/netns, in process.

    ``ip netns add`` costs an exec plus ~3 ms; this does what it does (unshare, bind mount of the
    new namespace onto ``/var/run/netns/NAME``) in a dedicated thread that switches back to the
    root netns after each one. Netns creation is never timed; it is only made cheap, because
    the "pods present" figure needs thousands.
    """

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="netns")
        self._primed = False
        self._broken = False

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def _prime(self, name: str) -> None:
        # The first one through `ip` makes /var/run/netns a shared mount exactly as iproute2 wants it.
        ip("netns", "add", name)
        self._primed = True

    def _create(self, name: str) -> None:
        if self._broken:
            raise BenchError("netns helper thread could not return to the root netns")
        path = f"{NETNS_DIR}/{name}"
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0)
        os.close(fd)
        saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                self._check(self._libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
                self._check(
                    self._libc.mount(b"/proc/thread-self/ns/net", path.encode(), b"none", _MS_BIND, None),
                    f"bind mount {path}",
                )
            finally:
                try:
                    setns(saved)
                except OSError:
                    self._broken = True
        except BaseException:
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        finally:
            os.close(saved)

    def create(self, name: str) -> None:
        if not self._primed:
            self._prime(name)
            return
        self._pool.submit(self._create, name).result()

    def create_many(self, names: Iterable[str]) -> None:
        for n in names:
            self.create(n)

    def remove(self, name: str) -> None:
        path = f"{NETNS_DIR}/{name}"
        if self._libc.umount2(path.encode(), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):
                raise OSError(err, f"umount {path}: {os.strerror(err)}")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@contextmanager
def node_namespaces(names: list[str]) -> Iterator[None]:
    """A node netns per name (lo up), each removed with all left in it at the end, also on errors."""
    made: list[str] = []
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True)
            made.append(name)
            with entered(f"{NETNS_DIR}/{name}"):
                subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        yield
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], check=False)
