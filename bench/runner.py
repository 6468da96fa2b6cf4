"""The run: arguments, preflight (root, which contenders exist), the figures in order, the outputs."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .bigcluster import fig_bigcluster
from .chain import fig_chain
from .cluster import fig_cluster
from .coldstart import fig_coldstart
from .containerd import fig_containerd
from .contenders import CONTENDERS, PEERS_ENV, a_is_fallback, cni_dir, reference_version
from .context import RunContext, clean_environ, cli_command, leftovers, with_checkout
from .daemon import Daemon
from .harness import Plan
from .hostport import HOSTPORT_KEYS, fig_hostport
from .kubeletcluster import fig_kubelet_cluster
from .nodeburst import fig_node_burst
from .overhead import fig_overhead
from .plaininstall import compile_checkout
from .plots import HINT, available, plot_all
from .plotspec import prune
from .pods import fig_burst, fig_drain, fig_pods
from .repair import fig_repair
from .report import Figure, Meta, evaluate_targets
from .runtime import fig_runtime
from .scale import fig_scale
from .util import REPO, BenchError, Cleanup, NetnsFactory, SubnetPool
from .writer import render, write_json

__all__ = ["FIGURES", "run"]

FIGURES = (
    "pods",
    "burst",
    "drain",
    "overhead",
    "coldstart",
    "scale",
    "runtime",
    "nodeburst",
    "containerd",
    "containerd2",
    "kubelet",
    "cluster",
    "bigcluster",
    "chain",
    "hostport",
    "repair",
)
#: figures a --quick run leaves out unless --only names them: each brings up a kubelet cluster (minutes)
FULL_RUN_ONLY = ("kubelet",)
CNI_HINTS = {
    "A": f"build them: export {PEERS_ENV}=$(bash scripts/build-peers.sh) (CNI plugins v1.10 in its cni/)",
    "O": "install Debian's reference plugins: apt-get install -y containernetworking-plugins (into /usr/lib/cni)",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description="netplugin's benchmarks (run as root).")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke-test sizes (a few pods; no {', '.join(FULL_RUN_ONLY)} unless --only names it)")
    p.add_argument("--out", metavar="DIR", help="write BENCHMARKS.md, results.json and plots/ here "
                   "(default: the checkout: BENCHMARKS.md, bench/plots/, bench/out/)")
    p.add_argument("--pods", type=int, metavar="N", help="pods in the per-pod figure (default 60; quick 3)")
    p.add_argument("--only", metavar="FIGS", help=f"comma-separated subset of: {', '.join(FIGURES)}")
    p.add_argument("--contenders", metavar="KEYS", default="ABCDEO", help="subset of ABCDEO (default: all available)")
    p.add_argument("--no-plots", action="store_true",
                   help="draw no plots (and remove older ones from the plots dir); without it, a run "
                        "without matplotlib is refused")
    return p


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _cmd(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else "unknown"


def _machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    distro = "unknown"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                distro = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    try:
        from importlib.metadata import version

        pyroute2 = version("pyroute2")
    except Exception:
        pyroute2 = "not installed"
    return {
        "CPUs": f"{os.cpu_count()} x {cpu}",
        "memory": mem,
        "OS": f"{distro}, kernel {platform.release()}",
        "Python": platform.python_version(),
        "pyroute2": pyroute2,
        "iproute2": _cmd(["ip", "-V"]),
        "containernetworking-plugins": _cmd(["dpkg-query", "-W", "-f", "${Version}", "containernetworking-plugins"]),
        "CNI plugins of A": f"{reference_version('A')} in {cni_dir('A')}"
        + (" (the fallback: the v1.10 peers are not built)" if a_is_fallback() else " (scripts/build-peers.sh)"),
        "bash": _cmd(["bash", "-c", "echo $BASH_VERSION"]),
    }


def _probe_daemon(ctx: RunContext) -> str | None:
    """None when ``netplugin serve`` starts and answers; else why not."""
    if importlib.util.find_spec("netplugin.frontends.daemon") is None:
        return "netplugin/frontends/daemon does not exist yet"
    d = ctx.workdir / "probe"
    d.mkdir(mode=0o755)
    (d / "exec").mkdir(mode=0o755)
    env = clean_environ()
    env.update(NETPLUGIN_PLUGIN_DIR=str(d / "exec"), NETPLUGIN_STATE_DIR=str(d / "state"),
               NETPLUGIN_RUN_DIR=str(d / "run"), NETPLUGIN_HOST="none")
    with_checkout(env, ctx.cli)
    daemon = Daemon(env, str(d / "probe.sock"), ctx.cli, d / "daemon.log")
    try:
        daemon.start(timeout=20)
    except BenchError as e:
        return f"`netplugin serve` did not start: {e}"
    finally:
        daemon.stop()
        shutil.rmtree(d, ignore_errors=True)
    return None


def _containerd2() -> Path:
    """The peer dir holding containerd 2 (scripts/build-peers.sh); BenchError when it was not built."""
    peers = os.environ.get(PEERS_ENV, "")
    if not peers or not os.access(os.path.join(peers, "containerd"), os.X_OK):
        raise BenchError(f"containerd 2 is not built: export {PEERS_ENV}=$(bash scripts/build-peers.sh)")
    return Path(peers)


def _availability(ctx: RunContext, wanted: str) -> tuple[dict[str, str], dict[str, str]]:
    ok: dict[str, str] = {}
    missing: dict[str, str] = {}
    for key, hint in CNI_HINTS.items():
        d = cni_dir(key)
        if not (d and os.access(f"{d}/bridge", os.X_OK) and os.access(f"{d}/host-local", os.X_OK)):
            missing[key] = f"{d or '(no dir)'}/bridge or host-local not found: {hint}"
        elif key == "O" and a_is_fallback():
            missing[key] = f"A is {d}'s plugins itself: the v1.10 peers are not built ({CNI_HINTS['A']})"
        elif key == "O" or a_is_fallback():
            ok[key] = f"{d}/bridge ({reference_version(key)})"
            if key == "A":
                ok[key] += f"; the fallback: v1.10 is not built ({CNI_HINTS['A']})"
        else:
            ok[key] = f"{d}/bridge ({reference_version(key)}, scripts/build-peers.sh)"
    done = subprocess.run([*ctx.cli, "--version"], capture_output=True, text=True, env=clean_environ(),
                          stdin=subprocess.DEVNULL, timeout=60)
    if done.returncode != 0:
        missing["B"] = f"`netplugin --version` failed: {done.stderr.strip()[-300:]}"
    else:
        ok["B"] = f"{done.stdout.strip()}, started as `{' '.join(ctx.cli)}`"
    daemon_problem = _probe_daemon(ctx) if "B" in ok else missing["B"]
    if daemon_problem:
        missing["C"] = daemon_problem
    else:
        ok["C"] = "`netplugin serve`, requests over its unix socket"
    pyroute2 = importlib.util.find_spec("pyroute2") is not None
    if daemon_problem:
        missing["D"] = daemon_problem
    elif importlib.util.find_spec("netplugin.plugins.bridge") is None:
        missing["D"] = "netplugin/plugins/bridge does not exist"
    elif not pyroute2:
        missing["D"] = "pyroute2 is not installed (pip install .[daemon])"
    else:
        ok["D"] = "`netplugin serve` with plugin netplugin.io/bridge"
    if pyroute2:
        ok["E"] = "pyroute2 in the benchmark's own process"
    else:
        missing["E"] = "pyroute2 is not installed (pip install .[daemon])"
    for k in list(ok):
        if k not in wanted:
            missing[k] = "left out (--contenders)"
            del ok[k]
    return ok, missing


def _kill_children() -> None:
    """Kill what an interrupted figure left running (a CLI and its plugin), daemons apart.

    Daemons lead their own process group and are stopped by their cleanup, gracefully, after
    the operations they are running; everything else of ours is killed before the netns go.
    """
    import psutil

    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    doomed: list[psutil.Process] = []
    for c in children:
        try:
            if os.getpgid(c.pid) == c.pid:
                continue
            doomed += [c, *c.children(recursive=True)]
        except (psutil.Error, ProcessLookupError):
            continue
    for p in doomed:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(doomed, timeout=5)


def _refusal(args: argparse.Namespace) -> str | None:
    """Why the run cannot start (not root, a tool missing, bad arguments), or None."""
    if os.geteuid() != 0:
        return "must run as root (it creates network namespaces, veths and bridges)"
    for tool in ("ip", "flock", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/install-deps.sh installs it)"
    unknown = [f for f in _only(args) if f not in FIGURES]
    if unknown:
        return f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}"
    if args.pods is not None and not 1 <= args.pods <= 250:
        return "--pods must be 1-250 (the per-pod figure uses one /24)"
    # refused before the run, not after it: a full run takes many minutes
    if not args.no_plots and not available():
        return f"matplotlib is not installed, and the run draws every figure's plot: {HINT}"
    return None


def _only(args: argparse.Namespace) -> list[str]:
    if args.only:
        return [f.strip() for f in args.only.split(",")]
    return [f for f in FIGURES if not (args.quick and f in FULL_RUN_ONLY)]


def _outputs(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """Where the report, the plots and the JSON go: --out, or the checkout."""
    if args.out:
        out = Path(args.out).resolve()
        return out / "BENCHMARKS.md", out / "plots", out / "results.json"
    return REPO / "BENCHMARKS.md", REPO / "bench" / "plots", REPO / "bench" / "out" / "results.json"


@dataclass
class _Outcome:
    """What the figures produced, and what went wrong on the way."""

    figures: list[Figure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    durations: dict[str, str] = field(default_factory=dict)
    ok: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def _run_figures(ctx: RunContext, plan: Plan, args: argparse.Namespace, out: _Outcome) -> None:
    """The available contenders, then each figure asked for, in order; a failed figure is a problem, not the end."""
    out.ok, out.missing = _availability(ctx, args.contenders.upper())
    for k, why in out.missing.items():
        _say(f"contender {k} unavailable: {why}")
    keys = [k for k in CONTENDERS if k in out.ok]
    pool = SubnetPool()
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("pods", lambda: fig_pods(ctx, plan, keys, pool)),
        ("burst", lambda: [fig_burst(ctx, plan, keys, pool)]),
        ("drain", lambda: [fig_drain(ctx, plan, keys, pool)]),
        ("overhead", lambda: [fig_overhead(ctx, plan, keys, pool)]),
        ("coldstart", lambda: [fig_coldstart(ctx, plan, keys, pool)]),
        ("scale", lambda: [f for f in fig_scale(ctx, plan, keys, pool) if f is not None]),
        ("runtime", lambda: fig_runtime(ctx, plan, keys, pool)),
        ("nodeburst", lambda: fig_node_burst(ctx, plan, keys, pool)),
        ("containerd", lambda: fig_containerd(ctx, plan, pool)),
        ("containerd2", lambda: fig_containerd(ctx, plan, pool, peers=_containerd2())),
        ("kubelet", lambda: fig_kubelet_cluster(ctx, plan)),
        ("cluster", lambda: fig_cluster(plan.quick, _say)),
        ("bigcluster", lambda: fig_bigcluster(plan.quick, _say)),
        ("chain", lambda: fig_chain(ctx, plan, keys, pool)),
        ("hostport", lambda: fig_hostport(ctx, plan, list(HOSTPORT_KEYS), pool)),
        ("repair", lambda: fig_repair(ctx, plan)),
    ]
    only = _only(args)
    for name, step in steps:
        if name not in only:
            continue
        _say(f"figure {name}")
        t0 = time.monotonic()
        try:
            out.figures += step()
        except BenchError as e:
            out.problems.append(f"figure {name} failed: {e}")
            _say(f"figure {name} FAILED: {e}")
        out.durations[name] = f"{time.monotonic() - t0:.1f} s"
        _say(f"figure {name} done in {out.durations[name]}")


def _meta(plan: Plan, started: str, duration: float, tag: str, cli_desc: str, out: _Outcome) -> Meta:
    return Meta(
        mode="quick" if plan.quick else "full",
        started=started,
        duration_s=duration,
        machine=_machine(),
        available=out.ok,
        unavailable=out.missing,
        settings={
            "run tag": tag,
            "netplugin CLI": cli_desc,
            "sizes": f"per-pod {plan.pods} pods; burst {plan.burst} x {plan.burst_rounds} rounds; "
                     f"node bursts {', '.join(map(str, plan.node_bursts))} x {plan.node_burst_rounds} rounds "
                     "on 1 CPU and on all; "
                     f"drain {plan.drain} x {plan.drain_rounds} rounds; levels {', '.join(map(str, plan.levels))} "
                     f"with {plan.level_samples} setups each; cold start {plan.cold_runs} runs; "
                     f"overhead {plan.overhead_runs} runs",
            "subnets": "random /24s (figures 1-3, 5, 6) and /21s (scale) inside 10.202.0.0/16",
            "netplugin settings": "environment variables (no config file), host none (no pod lookup), "
                                  "use_daemon never for the CLI",
            "A config": "cniVersion 1.0.0, bridge with isGateway, isDefaultGateway, hairpinMode, ipMasq off, "
                        "mtu 1500; host-local with the same subnet size as the other contenders",
            "figure durations": ", ".join(f"{k} {v}" for k, v in out.durations.items()),
        },
        problems=out.problems,
    )


def _write(args: argparse.Namespace, meta: Meta, figures: list[Figure]) -> None:
    """BENCHMARKS.md, results.json and (with matplotlib) the plots; the targets' verdicts on stderr."""
    report_path, plots_dir, json_path = _outputs(args)
    targets = evaluate_targets(figures)
    images: dict[str, str] = {}
    if args.no_plots:
        gone = prune(plots_dir, [])  # the report embeds none: older plots would contradict it
        if gone:
            _say(f"--no-plots: removed {len(gone)} older plot file(s) from {plots_dir}")
    else:
        rel = os.path.relpath(plots_dir, report_path.parent)
        written = plot_all(figures, plots_dir, meta.settings["run tag"], meta.started)
        images = {fid: f"{rel}/{png}" for fid, png in written.items()}
        _say(f"drew {len(images)} plot(s) into {plots_dir}")
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(render(meta, figures, targets, images))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(json_path, meta, figures, targets)
    _say(f"wrote {report_path} and {json_path} in {meta.duration_s:.0f} s")
    for t in targets:
        state = "not measured" if t.met is None else "met" if t.met else "MISSED"
        _say(f"  target {t.id}: {t.measured} (limit {t.limit}): {state}")
    for p in meta.problems:
        _say(f"  problem: {p}")


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    refusal = _refusal(args)
    if refusal:
        print(f"bench: {refusal}", file=sys.stderr)
        return 2
    plan = Plan.make(args.quick, args.pods)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    tag = "np" + secrets.token_hex(3)
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    t_start = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"netplugin-bench-{tag}-"))
    os.chmod(workdir, 0o755)
    cleanup = Cleanup()
    netns = NetnsFactory()
    # Every process the figures start imports the checkout: with its .pyc files, as an installed node has them.
    compile_checkout()
    cli, cli_desc = cli_command()
    ctx = RunContext(tag, workdir, netns, cleanup, cli=cli, progress=_say)
    forward = Path("/proc/sys/net/ipv4/ip_forward")
    saved_forward = forward.read_text().strip() if forward.exists() else None
    out = _Outcome()
    try:
        _say(f"bench {tag}: {'quick' if plan.quick else 'full'} run, scratch dir {workdir}")
        _run_figures(ctx, plan, args, out)
    except KeyboardInterrupt:
        out.interrupted = True
        out.problems.append("interrupted: the report holds the figures completed before")
        _say("interrupted; cleaning up")
    finally:
        _kill_children()
        out.problems = ctx.problems + out.problems + cleanup.run()
        netns.close()
        if saved_forward is not None and forward.read_text().strip() != saved_forward:
            forward.write_text(saved_forward + "\n")
        left = leftovers(tag)
        if left:
            out.problems.append("left behind: " + ", ".join(left[:20]))
        shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
    _write(args, _meta(plan, started, time.monotonic() - t_start, tag, cli_desc, out), out.figures)
    if out.interrupted:
        return 130
    return 1 if out.problems else 0
