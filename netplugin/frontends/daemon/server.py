"""``netplugin serve``: the long-running node daemon.

One process keeps the manager (selected plugin, init marker, host, state store, and for native
plugins their warm libraries) and answers the thin client of :mod:`netplugin.frontends.wire.client`
on a unix socket; see that module for the protocol.

How it works, in detail: ``docs/daemon.md``, "Inside the daemon".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from netplugin import __version__
from netplugin.agent.gckeeper import GcKeeper
from netplugin.agent.nodekeeper import NodeKeeper
from netplugin.core.errors import InvalidArgument, NetpluginError
from netplugin.core.execplugin.invoke import adopt_orphans, reap_adopted
from netplugin.frontends.cni import operations as _cni_calls  # noqa: F401 -- loaded before gc.freeze()
from netplugin.frontends.daemon.actionlog import log_action
from netplugin.frontends.daemon.callpool import CallPool, pool_size
from netplugin.frontends.daemon.cnicalls import check_settings, run_cni
from netplugin.frontends.daemon.connections import Connections
from netplugin.frontends.daemon.envelope import pod_of
from netplugin.frontends.daemon.keepermetrics import register_keepers
from netplugin.frontends.daemon.listener import BACKLOG, bind_socket, lock_daemon, unlink_if, unlock_daemon
from netplugin.frontends.daemon.metrics import Metrics
from netplugin.frontends.daemon.reconfig import Reread, ServedSettings, refused_text, reload_settings
from netplugin.frontends.daemon.recordops import gc_answer, pods_answer, still_needed_answer
from netplugin.frontends.daemon.systemd import Watchdog, configure_logging, keep_watchdog, reloading_message, sd_notify
from netplugin.frontends.wire.protocol import MAX_MESSAGE, OPS, POD_OPS, init_result, run_pod_op
from netplugin.manager.manager import Manager
from netplugin.manager.repair import keep_node
from netplugin.manager.reporting import Hooks
from netplugin.plugins.bounded import stuck_calls

if TYPE_CHECKING:
    from netplugin.core.config import Config, FileSnapshot

__all__ = ["MAX_WORKERS", "Daemon", "serve"]

log = logging.getLogger("netplugin.daemon")

# Plugins are mostly waited on (subprocesses), so threads are cheap; this bounds a burst.
MAX_WORKERS = 64


class Daemon:
    """The request handler and the server around it. ``run()`` serves until SIGTERM."""

    def __init__(
        self,
        config: Config,
        manager: Manager,
        metrics: Metrics,
        *,
        notify_socket: str | None = None,
        watchdog: Watchdog | None = None,
        reread: Reread | None = None,
        snapshot: FileSnapshot | None = None,
    ) -> None:
        self._live = ServedSettings.of(config, manager, snapshot)
        self.reread = reread  #: the config as the daemon was started (SIGHUP); None: rescan only
        self.settings_status = "as started"
        #: "config on disk refused at <time>: <key>: <reason>" since a reload was refused, till one is taken
        self.refused: str | None = None
        self.socket_path = config.socket_path
        self.notify_socket = notify_socket
        self.watchdog = watchdog
        #: told by the manager of each chain member's call (built with them as its hooks: :func:`serve`)
        self.metrics = metrics
        self.metrics_address: str | None = None
        self.gc = GcKeeper(lambda: self._live.manager)
        self.nodes = NodeKeeper(
            config, manager.host, on_pod_deleted=self.gc.pod_deleted, manager=lambda: self._live.manager
        )
        register_keepers(self.metrics.registry, self.gc, self.nodes)
        size = pool_size()
        #: worker processes for forwarded CNI calls (None on one CPU: the daemon runs them all)
        self.pool = CallPool(size, self.socket_path, self.metrics) if size else None
        #: the socket's connections: each request read, given its turn, run here and answered
        self.connections = Connections(
            self.socket_path,
            self.metrics,
            lambda: self._live,
            dispatch=self.dispatch,
            health=self.health,
            plugin_ok=self._plugin_ok,
            pool=self.pool,
        )
        self.stats = self.connections.stats
        self._plugin: str | None = None
        self._plugin_problem: str | None = None
        self._chain_changed = False  #: by a reload (health then names dropped plugins pods still need)
        self._reload_lock = threading.RLock()
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: set when SIGTERM's drain gave up on operations still running in worker threads
        self.abandoned = False

    @property
    def config(self) -> Config:
        return self._live.config

    @property
    def manager(self) -> Manager:
        return self._live.manager

    # --- operations (worker threads) --------------------------------------------------------------

    def prepare(self) -> None:
        """Select the plugin and run its init if needed; failures are logged, not raised."""
        with self._reload_lock:
            try:
                chain = ",".join(self.manager.chain_names)
                self._plugin = chain
                ran = self.manager.init()
                kept = keep_node(self.manager)  # node-level state (a hostPort table): at every start
                for member, line in kept.changes:
                    log.info("node state of %s: %s", member, line)
                if kept.errors:
                    raise NetpluginError("; ".join(kept.errors))  # the init's own error was raised above
            except NetpluginError as e:
                self._plugin_problem = e.message
                log.error("plugin not ready (operations will retry): %s", e.message)
                return
            self._plugin_problem = None
            log.info("plugin %s ready (%s)", chain, "init ran" if ran else "init already done this boot")
            try:
                self.manager.stock()  # files the first pods would make, made now (core/spares)
            except (OSError, NetpluginError) as e:
                log.warning("cannot make spare inodes: %s", e)

    def reload(self) -> None:
        """SIGHUP: re-read the settings and select and initialise their chain; swap only if all worked."""
        with self._reload_lock:
            done = reload_settings(self._live, self.reread)
            self.settings_status = done.text
            if done.refused is None:
                self._chain_changed |= done.live.config.chain != self.config.chain
                configure_logging(os.environ, done.live.config, was=self.config)
                self._live, self.refused = done.live, None
                if self.pool is not None and self._loop is not None:
                    self._loop.call_soon_threadsafe(self.pool.renew, done.live)
                (log.info if done.ok else log.error)("reload: %s", done.text)
                if done.ok:
                    self.prepare()
            else:
                self.refused = refused_text(done.refused)
                log.error("reload refused: %s; serving the running settings", done.refused.text())
            self.stats.reloads += 1
            self.gc.kick()  # gc_interval may have changed

    def dispatch(self, req: dict[str, Any]) -> Any:
        """Run one request (in a worker thread); returns the result or raises NetpluginError."""
        op = req["op"]
        if op == "cni":
            live = self._live  # one snapshot: a reload meanwhile does not mix two settings
            result = run_cni(req, live, self.socket_path, self.metrics.timed)
            if result["code"] == 0:
                self._plugin_ok()
            return result
        if "settings" in req:
            check_settings(req["settings"], self._live, self.socket_path)
        if op in POD_OPS:
            pod = pod_of(req)
            answer = run_pod_op(self.manager, op, pod)  # timed in _answer, with the wait for the pod's turn
            self._plugin_ok()
            return answer
        if op == "init":
            members = self.manager.init_members(force=bool(req.get("force")))
            self._plugin_ok()
            return init_result(self.manager.chain_names, members)
        if op == "plugins":
            return [c.to_dict() for c in self.manager.candidates()]
        if op == "pods":
            return pods_answer(self.config, self.nodes.broken())
        if op == "gc":
            return gc_answer(self.manager, req)
        raise InvalidArgument("op", op, f"must be one of {', '.join(OPS)}")

    def _plugin_ok(self) -> None:
        """A call succeeded: if it ran the plugin, a problem logged at start or reload is over."""
        if self._plugin_problem is not None:
            try:
                chain = ",".join(self.manager.chain_names)
            except NetpluginError:
                return  # the call needed no plugin (a CNI VERSION): the problem stands
            self._plugin, self._plugin_problem = chain, None

    def health(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": __version__,
            "plugin": self._plugin,
            "plugin_problem": self._plugin_problem,
            "uptime_seconds": round(time.monotonic() - self.stats.started, 3),
            "requests": self.stats.requests,
            "in_flight": self.stats.busy - 1,  # not counting this request
            "waiting": self.connections.turns.waiting,  # for a busy pod's turn
            "reloads": self.stats.reloads,
            "socket": self.socket_path,
            "metrics_address": self.metrics_address,
            "config": self._live.fingerprint,
            "config_path": self.config.config_path,
            "settings": self.settings_status,
            "refused": self.refused,
            "node": self.nodes.status(),
            "gc": self.gc.last,
            # the node's control loops: each running, no pass past its interval (else a problem, exit 7)
            "keepers": {w.name: w.status() for w in [self.gc.worker, *self.nodes.workers()]},
            "keeper_problems": [p for p in [self.gc.worker.problem()] if p] + self.nodes.keeper_problems(),
            "stuck": [c.to_dict() for c in stuck_calls()],  # in-process actions past their limits
            "workers": self.pool.pids() if self.pool is not None else [],
            "plugins_still_needed": still_needed_answer(self.config) if self._chain_changed else {},
        }

    def drain_bound(self) -> float:
        """How long SIGTERM waits: past the time limits of an init and two queued actions on one pod."""
        c = self.config
        longest = max(c.timeout_for(a) for a in POD_OPS)
        return c.timeout_for("init") + 2 * (longest + 2 * c.kill_grace) + 5.0

    def _on_stop(self, signame: str) -> None:
        if self._stop.is_set():
            log.info("%s again: still draining %d request(s)", signame, self.stats.busy)
            return
        log.info("%s: draining %d request(s)", signame, self.stats.busy)
        self._stop.set()

    def _on_hup(self) -> None:
        def reload() -> None:
            # systemd (Type=notify, `systemctl reload`) waits for READY=1 after RELOADING=1.
            sd_notify(reloading_message(), self.notify_socket)
            try:
                self.reload()
            except Exception:
                log.exception("reload failed")
            finally:
                sd_notify(f"READY=1\nSTATUS=serving on {self.socket_path}", self.notify_socket)

        asyncio.get_running_loop().run_in_executor(None, reload)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; returns the exit status."""
        loop = self._loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="netplugin-op"))
        lock_fd = lock_daemon(self.socket_path + ".lock")
        inode: int | None = None
        server: asyncio.AbstractServer | None = None
        pinger: asyncio.Task[None] | None = None
        try:
            # Before the (possibly slow) init: SIGHUP's default would kill us; SIGTERM must end in order.
            for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
                loop.add_signal_handler(sig, self._on_stop, name)
            loop.add_signal_handler(signal.SIGHUP, self._on_hup)
            if adopt_orphans():  # a call's leftovers are found among our children, not in all of /proc
                loop.add_signal_handler(signal.SIGCHLD, lambda: reap_adopted(wait=False))
            # First the caches (a plugin's init may need this node's pod CIDRs), then the plugin.
            self.nodes.start()
            await asyncio.to_thread(self.prepare)
            await asyncio.to_thread(self.gc.start)  # its first run: before the first ADD is taken
            if self.config.metrics_address != "none":
                self.metrics_address = self.metrics.serve(self.config.metrics_address)
            # The start-up heap (modules, every call's code among them, metrics, plugin) frozen: it
            # lives as long as the daemon, and the cyclic GC need never scan it again per call.
            gc.collect()
            gc.freeze()
            sock = bind_socket(self.socket_path)
            inode = os.lstat(self.socket_path).st_ino  # the file's, not the socket's (fstat): we hold the lock
            server = await asyncio.start_unix_server(
                self.connections.connection, sock=sock, limit=MAX_MESSAGE, backlog=BACKLOG
            )
            log.info(
                "serving on %s (pid %d), metrics on %s",
                self.socket_path,
                os.getpid(),
                f"http://{self.metrics_address}/metrics" if self.metrics_address else "none",
            )
            if self.pool is not None:
                self.pool.renew(self._live)  # started now, serving once each is ready
            sd_notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving on {self.socket_path}", self.notify_socket)
            if self.watchdog is not None and self.watchdog.enabled:
                # From the event loop itself: a loop that stops turning stops the pings.
                pinger = asyncio.create_task(keep_watchdog(self.watchdog, self.notify_socket))

            await self._stop.wait()
            return await self._drain(server, inode)
        finally:
            if pinger is not None:
                pinger.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            if server is not None:
                server.close()
            if inode is not None:
                unlink_if(self.socket_path, inode)
            self.gc.stop()
            self.nodes.stop()
            self.metrics.close()
            unlock_daemon(lock_fd, self.socket_path + ".lock")

    async def _drain(self, server: asyncio.AbstractServer, inode: int) -> int:
        """Stop accepting, then wait for the requests in flight (bounded); the exit status."""
        self.connections.stopping = True
        sd_notify("STOPPING=1", self.notify_socket)
        server.close()
        unlink_if(self.socket_path, inode)  # from now on new callers work alone
        if not await self.connections.drain(self.drain_bound()):
            log.error("requests still running after %.0fs; exiting without them", self.drain_bound())
            self.abandoned = True
            return 1
        if self.pool is not None:
            await self.pool.close()  # each worker ends once its link deletions are done
        log.info("drained; exiting")
        return 0


def serve(
    config: Config,
    *,
    environ: dict[str, str] | None = None,
    reread: Reread | None = None,
    snapshot: FileSnapshot | None = None,
) -> int:
    """Run the daemon in this process until SIGTERM; returns the exit status.

    ``NOTIFY_SOCKET`` and the watchdog's variables are taken out of the environment first: plugins
    must not talk to systemd in the daemon's name.
    """
    env = os.environ if environ is None else environ
    notify = env.pop("NOTIFY_SOCKET", None)
    watchdog = Watchdog(env)
    env.pop("WATCHDOG_USEC", None)
    env.pop("WATCHDOG_PID", None)

    metrics = Metrics()
    # per chain member of every pod action, its metrics; per pod action, one log line
    manager = Manager(config, hooks=Hooks(observe=metrics.observe_member, on_action=log_action))
    configure_logging(env, config)
    daemon = Daemon(config, manager, metrics, notify_socket=notify, watchdog=watchdog, reread=reread, snapshot=snapshot)
    with asyncio.Runner() as runner:
        status = runner.run(daemon.run())
        if daemon.abandoned:
            # Closing the runner would wait for the stuck worker threads; their plugins live in
            # their own sessions and are systemd's to kill (KillMode=mixed).
            logging.shutdown()
            os._exit(status)
    return status
