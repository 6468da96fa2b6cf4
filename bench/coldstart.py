"""Figure 5, CLI cold start: ``netplugin setup`` as a new process, against the bare interpreter and a Go binary."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from netplugin.core.config import ENV_VARS

from .contenders import cni_dir
from .context import Network, RunContext, clean_environ, netplugin_env, with_checkout
from .daemon import Daemon
from .harness import Plan, interleaved
from .plaininstall import plain_venv
from .report import Figure, Row
from .util import REPO, BenchError, Stats, SubnetPool, ms

__all__ = ["fig_coldstart"]

LABELS = {
    "B-i": "netplugin setup (kubernetes.io/no-op), a new process, installed plainly (a venv, no .pth hooks)",
    "B-ic": "the same as installed, its settings in a config file (parsed by the first run, cached after)",
    "B": "the same, started as this checkout's console script (its interpreter's .pth hooks)",
    "B-d": "the same through a running daemon (use_daemon always: thin client + round trip)",
    "B-S": "the same, interpreter started with -S (no site .pth hooks)",
    "py-S": "reference: `python -S -c pass`",
    "py": "reference: `python -c pass`",
    "A": "reference: CNI bridge VERSION (a new Go process)",
}
#: a variant's argv for its run number
Argv = Callable[[int], list[str]]


def _importtime(argv: list[str], env: dict[str, str]) -> tuple[float, list[tuple[str, float]]]:
    """(total ms of top-level imports, [(module, cumulative ms)] largest first) from ``-X importtime``."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    top: list[tuple[str, float]] = []
    for line in done.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", line)
        if m and not m.group(3):
            top.append((m.group(4), int(m.group(2)) / 1000))
    return sum(v for _, v in top), sorted(top, key=lambda x: -x[1])


def _variants(
    ctx: RunContext, keys: Sequence[str], env: dict[str, str]
) -> tuple[dict[str, Argv], dict[str, dict[str, str]]]:
    """The processes to start (argv per run number) and their environments; B-d is added by the caller."""
    cni_env = clean_environ()
    cni_env.update(CNI_COMMAND="VERSION", CNI_PATH=cni_dir("A"))
    # The same CLI on an interpreter started with -S: no .pth start-up hooks (an editable install's
    # finder, a machine's own hooks), only the paths; what a plain install costs without them.
    bare = (f"import sys; sys.path[:0] = {[str(REPO), sysconfig.get_paths()['purelib']]!r}; "
            "from netplugin.frontends.cli.entry import main; main()")
    plain = plain_venv(ctx.workdir / "plain-venv")
    variants: dict[str, Argv] = {
        "B-i": lambda i: [*plain, "setup", "bench", f"p-cold-i-{i}", f"{ctx.tag}-cold-i-{i}"],
        "B-ic": lambda i: [*plain, "setup", "bench", f"p-cold-c-{i}", f"{ctx.tag}-cold-c-{i}"],
        "B": lambda i: [*ctx.cli, "setup", "bench", f"p-cold-{i}", f"{ctx.tag}-cold-{i}"],
        "B-S": lambda i: [sys.executable, "-S", "-c", bare, "setup", "bench", f"p-cold-s-{i}",
                          f"{ctx.tag}-cold-s-{i}"],
        "py": lambda i: [sys.executable, "-c", "pass"],
        "py-S": lambda i: [sys.executable, "-S", "-c", "pass"],
    }
    if "A" in keys:
        variants["A"] = lambda i: [f"{cni_dir('A')}/bridge"]
    # B-ic: the same settings from a config file, as install.sh writes one. The environment's NETPLUGIN_*
    # variables (each would override the file) move into it, but the run dir: the parse cache is there.
    config = ctx.workdir / "cold-config.yaml"
    moved = {k: v for k, v in env.items() if k in ENV_VARS and ENV_VARS[k] != "run_dir"}
    config.write_text("# netplugin's settings\n" + "".join(f"{ENV_VARS[k]}: {v}\n" for k, v in moved.items()))
    file_env = {**{k: v for k, v in env.items() if k not in moved}, "NETPLUGIN_CONFIG": str(config)}
    envs = {"B-i": env, "B-ic": file_env, "B": env, "B-S": env, "py": clean_environ(), "py-S": clean_environ(),
            "A": cni_env}
    return variants, envs


def _once(argv: list[str], env: dict[str, str], stdin: bytes | None, what: str) -> float:
    """Milliseconds from start to exit of one process; BenchError when it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, input=stdin, capture_output=True,
                          stdin=None if stdin is not None else subprocess.DEVNULL, timeout=60)
    t = ms(time.perf_counter() - t0)
    if done.returncode != 0:
        raise BenchError(f"cold start {what} failed: {done.stderr.decode(errors='replace')[-400:]}")
    return t


def _imports(ctx: RunContext, plan: Plan, env: dict[str, str], script: str) -> tuple[float, list[tuple[str, float]]]:
    """The installed CLI's ``-X importtime`` profile, the run with the median total."""
    it_argv = [str(Path(script).parent / "python"), "-X", "importtime", script]
    totals = [_importtime([*it_argv, "setup", "bench", f"p-it-{i}", f"{ctx.tag}-it-{i}"], env)
              for i in range(5 if not plan.quick else 1)]
    totals.sort(key=lambda x: x[0])
    return totals[len(totals) // 2]


def fig_coldstart(ctx: RunContext, plan: Plan, keys: Sequence[str], pool: SubnetPool) -> Figure:
    runs = plan.cold_runs
    net = Network(ctx, "5c", pool.take(24))
    daemon: Daemon | None = None
    try:
        env = with_checkout(netplugin_env(net, "", plugin_dir=net.dir / "exec"), ctx.cli)
        env.pop("NETPLUGIN_PLUGIN")  # no plugin named: kubernetes.io/no-op
        (net.dir / "exec").mkdir(mode=0o755)
        variants, envs = _variants(ctx, keys, env)
        if "C" in keys:
            # the same command through a running daemon: the thin client's cold start plus one round trip
            sock = str(net.dir / "daemon.sock")
            daemon = Daemon(env, sock, ctx.cli, net.dir / "daemon.log")
            ctx.cleanup.push("cold-start daemon", daemon.stop)
            daemon.start()
            envs["B-d"] = {**env, "NETPLUGIN_USE_DAEMON": "always", "NETPLUGIN_SOCKET": sock}
            variants["B-d"] = lambda i: [*ctx.cli, "setup", "bench", f"p-cold-d-{i}", f"{ctx.tag}-cold-d-{i}"]

        def once(v: str, i: int) -> float:
            return _once(variants[v](i), envs[v], b'{"cniVersion":"1.0.0"}' if v == "A" else None, v)

        for v in variants:  # warm the page cache and .pyc files: "cold" means a new process, not a cold disk
            for i in range(plan.cold_warmups):
                once(v, -1 - i)
        samples = interleaved(runs, {v: partial(once, v) for v in variants})
        total, top = _imports(ctx, plan, env, variants["B-i"](0)[0])
    finally:
        if daemon is not None:
            daemon.stop()
        net.close()
    fig = Figure("coldstart", f"CLI cold start: `netplugin setup` with the no-op plugin ({runs} runs)", "ms",
                 ["median", "p90"], ratio_column="median", samples=samples)
    for v in variants:
        s = Stats.of(samples[v])
        fig.rows.append(Row(v, LABELS[v], {"median": s.median, "p90": s.p90}))
    fig.notes = [
        "B-i is the CLI as a plain install starts it: a venv holding the same packages (symlinks) and no .pth "
        f"hook, a console script as pip writes it; B is {' '.join(ctx.cli)}. The checkout is byte-compiled, as pip "
        f"does at install (pyc and page cache warm: {plan.cold_warmups} unmeasured run(s) of each first).",
        f"`-X importtime` of B-i (median of runs): top-level imports {total:.1f} ms in all; largest: "
        + ", ".join(f"{m} {v:.1f}" for m, v in top[:8]) + ".",
    ]
    return fig
