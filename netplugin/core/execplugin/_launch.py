"""Getting an exec plugin's executable ready to run: checked again, opened, named in errors.

Private to :class:`netplugin.core.execplugin.exec_plugin.ExecPlugin`. Before every call the executable's path
is walked and checked again (:func:`netplugin.core.discovery.open_executable`), so a
long-lived caller (the daemon) never runs a file that was swapped since it selected the
plugin. A binary is then run through the very descriptor that passed the check; a script,
whose interpreter reads it by path (``$0`` stays the plugin's path, as under the kubelet),
only when the path still names the checked inode, in directories nobody but root can change.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from netplugin.core.dirs import ensure_dir
from netplugin.core.discovery import Executable, open_executable
from netplugin.core.errors import PluginFailed, PluginInvalid
from netplugin.core.execplugin import calls

if TYPE_CHECKING:
    from netplugin.core.execplugin.invoke import SpawnError

__all__ = ["Launch", "call_token"]


def call_token(state_dir: str, env: Mapping[str, str]) -> str:
    """A ``NETPLUGIN_CALL_ID`` for a call with these variables (the key lives in the state dir)."""
    ensure_dir(state_dir)
    key = calls.call_key(state_dir)
    assert key is not None
    return calls.make_token(key, env)


class Launch:
    """``with Launch(...) as launch: runner(argv, ..., **launch.kwargs)``; raises before the exec
    with :class:`PluginInvalid` (the file may not be trusted) or :class:`PluginFailed` (it cannot run).

    ``validate=False`` (an injected runner, the tests' seam, executes nothing) opens nothing.
    """

    def __init__(
        self, name: str, path: str, action: str, *, check_permissions: bool, exec_dir: str | None, validate: bool
    ) -> None:
        self.name, self.path, self.action = name, path, action
        self._check, self._exec_dir, self._validate = check_permissions, exec_dir, validate
        self.exe: Executable | None = None
        self.kwargs: dict[str, Any] = {}

    def _failed(self, reason: str) -> PluginFailed:
        return PluginFailed(
            f"network plugin {self.name!r} {self.action} failed: cannot execute {self.path}: {reason}",
            plugin=self.name,
            action=self.action,
            path=self.path,
        )

    def __enter__(self) -> Launch:
        if not self._validate:
            return self
        found = open_executable(self.path, check_permissions=self._check, exec_dir=self._exec_dir)
        if isinstance(found, str):
            if found.startswith("no executable:"):
                # Removed since it was selected (an upgrade in progress?): the action fails, as a
                # failed exec would; the plugin is not judged invalid for it.
                raise self._failed(os.strerror(errno.ENOENT))
            raise PluginInvalid(self.name, found, path=self.path)
        self.exe = found
        try:
            if found.interpreter_error:
                raise self._failed(found.interpreter_error)
            if found.interpreter is None:
                self.kwargs["exe_fd"] = found.fd
            else:
                self._check_same(found)
        except BaseException:
            found.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.exe is not None:
            self.exe.close()

    def _check_same(self, exe: Executable) -> None:
        """A script is exec'd by path: the path must still name the inode that was checked."""
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise self._failed(e.strerror or str(e)) from None
        if (st.st_dev, st.st_ino) != exe.identity[:2]:
            raise PluginInvalid(self.name, f"{self.path} was replaced while being checked", path=self.path)

    def failed(self, e: SpawnError) -> PluginFailed:
        """The error for an exec that failed, naming the interpreter when it is the one missing."""
        reason = e.reason
        exe = self.exe
        if exe is not None and exe.interpreter is not None and e.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC):
            # The script itself was just checked: the kernel means its interpreter.
            reason = f"its interpreter {exe.interpreter} (from its #! line) cannot be executed: {e.reason}"
        elif exe is not None and e.errno == errno.ENOENT:
            reason = f"its ELF interpreter (dynamic loader) is missing: {e.reason}"
        return self._failed(reason)
