"""An exec plugin: an executable in the exec dir, run once per action through :mod:`.invoke`."""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import json
import os
import signal as _signal
from typing import TYPE_CHECKING, Any

from netplugin.core.chaining import parse_actions, repair_lines
from netplugin.core.errors import TAIL, PluginFailed, PluginOutputError, PluginTimeout
from netplugin.core.execplugin import calls
from netplugin.core.execplugin.environ import call_env
from netplugin.core.execplugin.status import parse_setup_document, parse_status
from netplugin.core.names import PodRef
from netplugin.core.plugin import Action, CallContext, PodNetworkStatus

if TYPE_CHECKING:
    from netplugin.core.execplugin.invoke import Completed, Runner

__all__ = ["ExecPlugin"]


def _tail(data: bytes) -> str:
    return data[-TAIL:].decode("utf-8", "replace").strip()


def _describe_exit(done: Completed) -> str:
    if done.signal is not None:
        try:
            name = _signal.Signals(done.signal).name
        except ValueError:
            name = str(done.signal)
        return f"killed by signal {name}"
    return f"exit status {done.returncode}"


class ExecPlugin:
    """A plugin that is an executable, run once per action.

    Before every call the executable's path is walked and checked again (ownership and mode of
    every directory on it, see :mod:`netplugin.core.discovery`), so a daemon that selected it long ago never
    runs a file that was swapped since: a binary is executed through the very descriptor that
    passed the check; a script (whose interpreter reads it by path, so that ``$0`` stays its
    path) only when the path still names that inode, in directories nobody but root can change.
    """

    def __init__(
        self,
        name: str,
        path: str,
        runner: Runner | None = None,
        *,
        check_permissions: bool = True,
        exec_dir: str | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.check_permissions = check_permissions
        self.exec_dir = exec_dir
        # An injected runner (the tests' seam) executes nothing, so there is no file to open.
        self._validate = runner is None
        if runner is None:
            from netplugin.core.execplugin.invoke import run

            runner = run
        self._runner: Runner = runner
        self._version: tuple[tuple[int, ...], str] | None = None

    def __repr__(self) -> str:
        return f"ExecPlugin({self.name!r}, {self.path!r})"

    def version_key(self) -> tuple[int, ...]:
        """A cheap identity of the executable's current content (any write changes ctime)."""
        st = os.stat(self.path)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def version(self) -> str:
        """sha256 of the executable's content."""
        import hashlib  # lazily: the init marker usually matches on version_key() alone

        key = self.version_key()
        if self._version is None or self._version[0] != key:
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            self._version = (key, "sha256:" + h.hexdigest())
        return self._version[1]

    def _run(self, action: Action, pod: PodRef | None, ctx: CallContext) -> Completed:
        from netplugin.core.execplugin._launch import Launch, call_token
        from netplugin.core.execplugin.invoke import SpawnError

        argv = [self.path, action.value]
        if pod is not None:
            argv += [pod.namespace, pod.name, pod.infra_id]
        stdin = json.dumps(ctx.pod, separators=(",", ":")).encode() if ctx.pod is not None else None
        env = call_env(ctx, self.name, action, pod)
        if ctx.state_dir:
            env[calls.ENV] = call_token(ctx.state_dir, env)
        launch = Launch(
            self.name,
            self.path,
            action.value,
            check_permissions=self.check_permissions,
            exec_dir=self.exec_dir,
            validate=self._validate,
        )
        with launch:
            try:
                done = self._runner(
                    argv,
                    env=env,
                    stdin=stdin,
                    timeout=ctx.timeout,
                    max_output=ctx.max_output,
                    kill_grace=ctx.kill_grace,
                    **launch.kwargs,
                )
            except SpawnError as e:
                raise launch.failed(e) from e
        context: dict[str, Any] = {
            "plugin": self.name,
            "action": action.value,
            "stderr_tail": _tail(done.stderr),
            "stdout_tail": _tail(done.stdout),
        }
        if pod is not None:
            context["pod"] = str(pod)
        if done.timed_out:
            raise PluginTimeout(timeout=ctx.timeout, **context)
        if done.returncode != 0:
            raise PluginFailed(
                f"network plugin {self.name!r} {action.value} failed: {_describe_exit(done)}",
                exit_status=done.returncode if done.signal is None else None,
                signal=done.signal,
                **context,
            )
        if done.leftover:
            raise PluginFailed(
                f"network plugin {self.name!r} {action.value} left {done.leftover} process(es) running "
                "after it exited (they were killed)",
                exit_status=0,
                **context,
            )
        return done

    def init(self, ctx: CallContext) -> frozenset[str] | None:
        return parse_actions(self._run(Action.INIT, None, ctx).stdout, plugin=self.name)

    def setup(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        done = self._run(Action.SETUP, pod, ctx)
        if done.stdout_truncated:
            return None  # never half a document: status is asked instead
        return parse_setup_document(done.stdout, plugin=self.name, pod=str(pod))

    def teardown(self, pod: PodRef, ctx: CallContext) -> None:
        self._run(Action.TEARDOWN, pod, ctx)

    def repair(self, pod: PodRef, ctx: CallContext) -> tuple[str, ...]:
        return repair_lines(self._run(Action.REPAIR, pod, ctx).stdout)

    def node(self, ctx: CallContext) -> tuple[str, ...]:
        return repair_lines(self._run(Action.NODE, None, ctx).stdout)

    def status(self, pod: PodRef, ctx: CallContext) -> PodNetworkStatus | None:
        done = self._run(Action.STATUS, pod, ctx)
        if done.stdout_truncated:
            raise PluginOutputError(
                f"network plugin {self.name!r} status for pod {pod}: output larger than {ctx.max_output} bytes",
                plugin=self.name,
                action="status",
            )
        return parse_status(done.stdout, plugin=self.name, pod=str(pod))
