"""netplugin's built-in defaults, and the two rules every caller of the daemon shares.

It imports nothing (not even ``os``): the per-call fast paths (``netplugin`` and
``netplugin-cni`` through the daemon) import it on every call, and :mod:`netplugin.core.config`
builds its defaults from it, so a default is written here and nowhere else.
"""

# No `from __future__ import annotations`: it loads the __future__ module on every call (a fast path);
# annotations of names imported only for type checking are strings instead.

__all__ = [
    "ACTIONS",
    "DEFAULT_CONFIG",
    "DEFAULT_GC_INTERVAL",
    "DEFAULT_KILL_GRACE",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_NETNS_TEMPLATE",
    "DEFAULT_NODES_DIR",
    "DEFAULT_PLUGIN_DIR",
    "DEFAULT_PODS_DIR",
    "DEFAULT_RUN_DIR",
    "DEFAULT_SOCKET",
    "DEFAULT_STATE_DIR",
    "DEFAULT_TIMEOUTS",
    "FIGHT_ROUNDS",
    "LIMIT_OF",
    "SOCKET_NAME",
    "answer_timeout",
    "socket_path",
]

TYPE_CHECKING = False  # not typing's: importing typing costs a fast path more than all the rest
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_PLUGIN_DIR = "/usr/libexec/kubernetes/kubelet-plugins/net/exec"
DEFAULT_STATE_DIR = "/var/lib/netplugin"
DEFAULT_RUN_DIR = "/run/netplugin"
DEFAULT_CONFIG = "/etc/netplugin/netplugin.yaml"
DEFAULT_PODS_DIR = "/etc/netplugin/pods"
DEFAULT_NODES_DIR = "/etc/netplugin/nodes"
DEFAULT_NETNS_TEMPLATE = "/var/run/netns/{infra_id}"
#: the daemon's socket, inside the run dir
SOCKET_NAME = "netplugin.sock"
DEFAULT_SOCKET = DEFAULT_RUN_DIR + "/" + SOCKET_NAME
ACTIONS = ("init", "setup", "teardown", "status")
#: rounds of self-repair in one incident (repairs less than 2 s apart) from which doctor calls it a fight
FIGHT_ROUNDS = 10
#: the time limit of each plugin action, in seconds
DEFAULT_TIMEOUTS = {"init": 10.0, "setup": 30.0, "teardown": 30.0, "status": 10.0}
#: actions without a limit of their own run under another's (each member under its own: see core.plugin)
LIMIT_OF = {"repair": "setup", "node": "init"}
#: connecting to a live unix socket is immediate; this bounds a daemon whose backlog is full
CONNECT_TIMEOUT = 2.0
#: seconds between SIGTERM and SIGKILL for a plugin past its limit
DEFAULT_KILL_GRACE = 2.0
#: seconds between the daemon's own gc runs (``gc_interval``)
DEFAULT_GC_INTERVAL = 300.0
#: the most bytes of a plugin's stdout (and of its stderr) kept; past it the call fails
DEFAULT_MAX_OUTPUT = 1 << 20
#: how long to wait for an answer to an op that runs no plugin action (health, plugins)
_QUICK_ANSWER = 30.0


def socket_path(socket: str | None = None, run_dir: str | None = None) -> str:
    """The daemon's socket: ``socket`` when set, else ``<run_dir>/netplugin.sock`` (default run dir).

    Callers pass the first of their own sources that is set (flag, config, environment); the
    rule itself (and ``os.path.join``'s way of joining, without importing ``os``) is this one.
    """
    if socket:
        return socket
    base = run_dir or DEFAULT_RUN_DIR
    return base + SOCKET_NAME if base.endswith("/") else base + "/" + SOCKET_NAME


def answer_timeout(
    op: str,
    timeouts: "Mapping[str, float] | None" = None,
    timeout: float | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE,
) -> float | None:
    """How long a caller waits for the daemon's answer to ``op``: past every time limit it may hit.

    ``op`` is a daemon op or a plugin action (init, setup, teardown, status); ``timeouts`` the
    per-action limits (missing ones default), ``timeout`` the one limit that overrides them all.
    A pod action may wait for the pod's lock (held by an action bounded by the same limits) and
    for init, and a setup is followed by a status (a CNI ADD, the CLI's setup): each of those may
    run to its limit and then its kill grace, twice (the lock holder's turn, then its own). gc and
    pods have no fixed bound (one teardown per stale pod), so they wait as long as it takes (None).
    """
    if op in ("gc", "pods"):
        return None
    if op not in ACTIONS:
        return _QUICK_ANSWER
    limits = dict(DEFAULT_TIMEOUTS)
    if timeouts:
        limits.update((a, float(s)) for a, s in timeouts.items() if a in limits)
    if timeout is not None:
        limits = dict.fromkeys(limits, float(timeout))
    grace = 2 * kill_grace + 5.0
    return limits["init"] + 2 * (limits[op] + limits["status"] + grace) + 5.0
