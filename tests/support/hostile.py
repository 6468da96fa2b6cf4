"""An unprivileged local user for the hostile-node suites: made per test, removed afterwards.

The suites attack netplugin the way a user on the node would: ``useradd`` makes a user with a
unique name, ``runuser -u USER --`` runs its commands (plant symlinks, swap files, start
processes). Everything the user could reach lives under a root-owned 0755 directory outside
pytest's 0700 tmp dir (the user must be able to walk to it): :attr:`HostileUser.area`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

__all__ = ["HostileUser", "hostile_user", "need_user_tools"]

_TOOLS = ("useradd", "userdel", "runuser")


def _user_python() -> str:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def need_user_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (to make a test user)")
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools for the hostile-user suites: {', '.join(missing)} (install passwd, util-linux)")


class HostileUser:
    """A throwaway local user and a play area it can reach."""

    def __init__(self, name: str, area: Path) -> None:
        self.name = name
        self.area = area
        out = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True)
        self.uid = int(out.stdout)
        self.gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True, check=True).stdout)
        self._started: list[subprocess.Popen[bytes]] = []

    def home(self) -> Path:
        """A directory the user owns (mode 0755) inside the area."""
        d = self.area / f"{self.name}-home"
        if not d.exists():
            d.mkdir()
            os.chown(d, self.uid, self.gid)
            d.chmod(0o755)
        return d

    def run(self, argv: Sequence[str], *, check: bool = True, env: dict[str, str] | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the user (``runuser -u USER --``) and wait for it."""
        full = ["runuser", "-u", self.name, "--", *argv]
        r = subprocess.run(full, capture_output=True, text=True, env=env, timeout=timeout, cwd="/")
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} as {self.name}: exit {r.returncode}: {r.stderr}")
        return r

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run(["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]

    def start(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` as the user in the background (killed at teardown)."""
        p = subprocess.Popen(["runuser", "-u", self.name, "--", *argv], env=env, cwd="/",
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._started.append(p)
        return p

    def python(self, code: str, *args: str) -> subprocess.Popen[bytes]:
        """Run a Python snippet as the user in the background (the system python: the user may not
        be able to reach the interpreter running the tests, under /root)."""
        return self.start([_user_python(), "-I", "-c", code, *args])

    def pids(self) -> list[int]:
        """Every live process of the user's uid."""
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat(f"/proc/{name}").st_uid == self.uid:
                        out.append(int(name))
                except OSError:
                    continue
        return out

    def kill_all(self) -> None:
        for p in self._started:
            if p.poll() is None:
                p.kill()
        # The user's own processes (and only those: the uid is unique to this test).
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)
        for p in self._started:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def hostile_user() -> Iterator[HostileUser]:
    """Generator behind the ``hostile`` fixtures: the user and its area, removed afterwards."""
    need_user_tools()
    name = "nph" + secrets.token_hex(4)
    area = Path("/tmp") / f"{name}-area"
    area.mkdir(mode=0o755)
    area.chmod(0o755)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name],
                   check=True, capture_output=True)
    user = HostileUser(name, area)
    try:
        yield user
    finally:
        user.kill_all()
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(area, ignore_errors=True)
