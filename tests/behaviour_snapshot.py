"""A behaviour snapshot of the tree it runs from: ``python tests/behaviour_snapshot.py OUTDIR``.

Writes what users and peers see, so that a move (code changing place, not behaviour) can be proved
byte-identical by comparing two snapshots (``diff -r``):

* ``help/``: every ``netplugin ... --help`` page, walking the click tree;
* ``matrix/``: ``netplugin`` and ``netplugin-cni`` calls with good and bad input (exit code, stdout,
  stderr), each against a temp state dir, run dir, plugin dir and config (no daemon, no kernel change);
* ``samples/``: wire samples (frames, request lines, codec output, CNI error documents, error
  documents, the CLI's renderings of daemon answers, netlink message parsing), each hashed into
  ``samples.sha256`` beside its text.

Only the temp dir's path is normalised (to ``<TMP>``); everything else is compared as written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

NETPLUGIN = [sys.executable, "-c", "from netplugin.frontends.cli.entry import main; main()"]
NETPLUGIN_CNI = [sys.executable, "-c", "from netplugin.frontends.cni import main; main()"]


class Snapshot:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.tmp = Path(tempfile.mkdtemp(prefix="np-snap-"))
        self.counts = {"help": 0, "matrix": 0, "samples": 0}
        self.hashes: list[str] = []
        for sub in ("state", "run", "plugins", "netns"):
            (self.tmp / sub).mkdir()
        self.config = self.tmp / "netplugin.yaml"
        self.config.write_text("log_level: warning\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("NETPLUGIN_", "CNI_")) and k != "COLUMNS"}
        self.env.update(
            COLUMNS="80",
            LC_ALL="C.UTF-8",
            PYTHONPATH=str(REPO),
            NETPLUGIN_STATE_DIR=str(self.tmp / "state"),
            NETPLUGIN_RUN_DIR=str(self.tmp / "run"),
            NETPLUGIN_PLUGIN_DIR=str(self.tmp / "plugins"),
            NETPLUGIN_CONFIG=str(self.config),
        )

    def norm(self, text: str) -> str:
        return text.replace(str(self.tmp), "<TMP>")

    def write(self, rel: str, text: str) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.norm(text))

    def run(self, argv: list[str], *, stdin: bytes = b"", env: dict[str, str] | None = None) -> str:
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, env={**self.env, **(env or {})}, timeout=120, check=False
        )
        return (
            f"exit: {proc.returncode}\n--- stdout\n{proc.stdout.decode('utf-8', 'replace')}"
            f"--- stderr\n{proc.stderr.decode('utf-8', 'replace')}"
        )

    # --- help pages ------------------------------------------------------------------------------------

    def help_pages(self) -> None:
        import click

        from netplugin.frontends.cli.app import cli

        def walk(cmd: click.Command, path: list[str]) -> None:
            name = "_".join(path) or "netplugin"
            self.write(f"help/{name}.txt", self.run([*NETPLUGIN, *path, "--help"]))
            self.counts["help"] += 1
            if isinstance(cmd, click.Group):
                ctx = click.Context(cmd)
                for sub in cmd.list_commands(ctx):
                    child = cmd.get_command(ctx, sub)
                    if child is not None:
                        walk(child, [*path, sub])

        walk(cli, [])

    # --- the CLI/CNI matrix ----------------------------------------------------------------------------

    def matrix(self) -> None:
        bad_config = self.tmp / "bad.yaml"
        bad_config.write_text("timeout: [1, 2\n")
        unknown_key = self.tmp / "unknown.yaml"
        unknown_key.write_text("timeoot: 3\n")
        cli_calls: list[tuple[str, list[str]]] = [
            ("version_flag", ["--version"]),
            ("version_flag_json", ["-o", "json", "--version"]),
            ("plugins", ["plugins"]),
            ("plugins_json", ["-o", "json", "plugins"]),
            ("pods_empty", ["pods"]),
            ("pods_empty_json", ["-o", "json", "pods"]),
            ("status_unknown", ["status", "default", "web-0", "abc123"]),
            ("setup_noop", ["setup", "default", "web-0", "abc123"]),
            ("status_noop", ["status", "default", "web-0", "abc123"]),
            ("teardown_noop", ["teardown", "default", "web-0", "abc123"]),
            ("teardown_twice", ["teardown", "default", "web-0", "abc123"]),
            ("setup_bad_namespace", ["setup", "Bad_ns", "web-0", "abc123"]),
            ("setup_missing_args", ["setup", "default"]),
            ("setup_bad_infra_id", ["setup", "default", "web-0", "../x"]),
            ("unknown_command", ["bogus"]),
            ("bad_timeout", ["--timeout", "x", "pods"]),
            ("bad_output", ["-o", "xml", "pods"]),
            ("plugin_not_found", ["--plugin", "nope", "setup", "default", "a", "b"]),
            ("health_no_daemon", ["health"]),
            ("health_no_daemon_json", ["-o", "json", "health"]),
            ("nodes_local", ["nodes"]),
            ("nodes_local_json", ["-o", "json", "nodes"]),
            ("gc_dry_run", ["gc", "--dry-run"]),
            ("config_check_ok", ["config", "check", str(self.config)]),
            ("config_check_bad_yaml", ["config", "check", str(bad_config)]),
            ("config_check_unknown_key", ["config", "check", str(unknown_key)]),
            ("config_missing", ["--config", str(self.tmp / "missing.yaml"), "plugins"]),
            ("completion_bash", ["completion", "bash"]),
            ("init_noop", ["init"]),
        ]
        for name, args in cli_calls:
            self.write(f"matrix/cli_{name}.txt", self.run([*NETPLUGIN, *args]))
            self.counts["matrix"] += 1
        conf = {
            "cniVersion": "1.0.0",
            "name": "snapnet",
            "type": "netplugin-cni",
            "netplugin": {"use_daemon": "never", "plugin": "kubernetes.io/no-op", "state_dir": str(self.tmp / "state")},
        }
        good = json.dumps(conf).encode()
        base = {"CNI_PATH": "/nonexistent", "CNI_IFNAME": "eth0"}
        add = {**base, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc123", "CNI_NETNS": str(self.tmp / "netns" / "x")}
        cni_calls: list[tuple[str, dict[str, str], bytes]] = [
            ("version_empty", {"CNI_COMMAND": "VERSION"}, b""),
            ("version_conf", {"CNI_COMMAND": "VERSION"}, good),
            ("version_old", {"CNI_COMMAND": "VERSION"}, json.dumps({**conf, "cniVersion": "0.3.1"}).encode()),
            ("add_bad_json", add, b"{not json"),
            ("add_no_container", {k: v for k, v in add.items() if k != "CNI_CONTAINERID"}, good),
            ("add_bad_netns", add, good),
            ("add_bad_ifname", {**add, "CNI_IFNAME": "a/b"}, good),
            ("add_bad_version", add, json.dumps({**conf, "cniVersion": "9.9.9"}).encode()),
            ("unknown_command", {**add, "CNI_COMMAND": "FROB"}, good),
            ("no_command", base, good),
            ("del_unknown", {**add, "CNI_COMMAND": "DEL"}, good),
            ("check_unknown", {**add, "CNI_COMMAND": "CHECK"}, good),
            ("status_cmd", {**base, "CNI_COMMAND": "STATUS"}, good),
        ]
        for name, environ, stdin in cni_calls:
            self.write(f"matrix/cni_{name}.txt", self.run([*NETPLUGIN_CNI], stdin=stdin, env=environ))
            self.counts["matrix"] += 1
        # the Python router in-process: what it answers and which way it went
        from netplugin.frontends.cni.router import run_call

        for name, environ, stdin in cni_calls[:5]:
            code, doc, via = run_call(environ, stdin)
            self.write(f"matrix/router_{name}.txt", f"{code}\n{json.dumps(doc, sort_keys=True)}\n{via}\n")
            self.counts["matrix"] += 1

    # --- wire samples ----------------------------------------------------------------------------------

    def sample(self, name: str, make: Callable[[], Any]) -> None:
        try:
            value = make()
        except Exception as e:  # what raises is behaviour too
            value = f"raised {type(e).__name__}: {e}"
        if isinstance(value, bytes):
            text = value.hex()
        elif isinstance(value, str):
            text = value
        else:
            text = json.dumps(value, sort_keys=True, default=repr)
        text = self.norm(text)
        self.write(f"samples/{name}.txt", text + "\n")
        self.hashes.append(f"{hashlib.sha256(text.encode()).hexdigest()}  {name}")
        self.counts["samples"] += 1

    def samples(self) -> None:
        from netplugin.core import errors
        from netplugin.frontends.cni.router import cni_error
        from netplugin.frontends.wire import codec, codes, protocol

        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc", "PATH": "/bin", "NETPLUGIN_X": "1"}
        s = self.sample
        s("frame_request", lambda: protocol.encode_request(env, b'{"cniVersion":"1.0.0"}'))
        s("frame_request_decoded", lambda: protocol.decode_request(protocol.encode_request(env, b"in")[8:]))
        s("frame_answer", lambda: protocol.encode_answer(0, b"out", b"err"))
        s("frame_answer_decoded", lambda: repr(vars(protocol.decode_answer(protocol.encode_answer(3, b"o", b"e")))))
        s("frame_unavailable", lambda: protocol.encode_unavailable("draining"))
        s("frame_bad_magic", lambda: protocol.read_frame_header(b"XXXX\0\0\0\1", 10))
        s("frame_bad_field", lambda: protocol.decode_request(b"Z\0\0\0\0"))
        s("frame_bad_env", lambda: protocol.decode_request(b"E\0\0\0\3A=B"))
        s("c_header", protocol.c_header)
        s("line_pod_request", lambda: protocol.encode_line(protocol.pod_request("setup", "default", "web-0", "abc")))
        s("line_cni_request", lambda: protocol.encode_line(protocol.cni_request(env, "{}")))
        s("line_gc", lambda: protocol.encode_line(protocol.request("gc", dry_run=True, progress=True)))
        s(
            "line_settings",
            lambda: protocol.settings("/etc/x.yaml", {"NETPLUGIN_TIMEOUT": "3", "HOME": "/"}, {"a": "b"}),
        )
        s("progress_line", lambda: protocol.encode_line(protocol.progress_line("waiting for pod x")))
        s("init_result", lambda: protocol.init_result(("a", "b"), {"a": True, "b": False}))
        s("version_answer", lambda: [protocol.version_answer(v) for v in ("0.3.1", "2.0", None)])
        s("pod_output", lambda: [protocol.pod_output(op, "ns", "p", "i", {"ip": "10.0.0.2"}) for op in protocol.OPS])
        s("codec_dumps", lambda: codec.dumps({"b": [1, 2.5, None, True], "a": "é\n\u2028", "c": {"x": -0.0}}))
        s("codec_dumps_sorted", lambda: codec.dumps({"b": 1, "a": {"d": 2, "c": 3}}, sort_keys=True))
        s("codec_loads", lambda: codec.loads('{"a": [1, 2.0, "x\\u00e9", null, true], "b": {}}'))
        s("codec_loads_bad", lambda: codec.loads('{"a": NaN}'))
        s("codes_exit", lambda: {k.__name__ if isinstance(k, type) else str(k): v for k, v in codes.EXIT_CODES.items()})
        s("codes_cni", lambda: {k.__name__ if isinstance(k, type) else str(k): v for k, v in codes.CNI_CODES.items()})
        s("codes_meanings", lambda: codes.EXIT_MEANINGS)
        s("cni_error", lambda: cni_error(7, "bad config", "field x", "1.0.0"))
        s(
            "error_docs",
            lambda: [
                errors.InvalidArgument("namespace", "Bad_ns", "must be a DNS-1123 label").to_dict(),
                errors.HostError("api away").to_dict(),
                errors.DaemonUnavailable("/run/x.sock", "draining").to_dict(),
                codes.error_classes(errors.PluginTimeout),
            ],
        )
        self.cli_renderings()
        self.keeper_samples()
        self.netlink_samples()

    def cli_renderings(self) -> None:
        """What ``nodes`` and ``doctor`` print for a daemon's health answer with problems of every kind."""
        from netplugin.frontends import checks
        from netplugin.frontends.cli.commands.nodes import _nodes_text

        problems = [
            {"kind": "no_address", "node": "n2", "cidr": "10.244.2.0/24", "reason": "node n2 has no InternalIP"},
            {"kind": "bad_node", "node": "n3", "cidr": "", "reason": "spec.podCIDRs: not a CIDR"},
            {"kind": "broken_pod", "node": "", "cidr": "", "reason": "pod default/web-0: veth gone"},
            {"kind": "watch", "node": "", "cidr": "", "reason": "watch of nodes: 403 Forbidden"},
        ]
        node = {
            "name": "n1",
            "pod_cidrs": ["10.244.1.0/24"],
            "internal_ips": ["192.0.2.1"],
            "nodes": 3,
            "routes_enabled": True,
            "routes": [{"dst": "10.244.4.0/24", "via": "192.0.2.4", "node": "n4"}],
            "problems": problems,
            "error": None,
        }
        self.sample("nodes_text_problems", lambda: _nodes_text(node))
        self.sample("nodes_text_error", lambda: _nodes_text({**node, "error": "x", "routes_enabled": False}))
        self.sample("nodes_text_none", lambda: _nodes_text({**node, "problems": []}))
        cfg = SimpleNamespace(host="kube", env={}, cluster_cidrs=["10.244.0.0/16"])
        doctor_node = SimpleNamespace(config=cfg, health={"node": node})
        self.sample("doctor_node", lambda: checks.check_node(doctor_node).to_dict())  # type: ignore[arg-type]
        fine = SimpleNamespace(config=cfg, health={"node": {**node, "problems": []}})
        self.sample("doctor_node_ok", lambda: checks.check_node(fine).to_dict())  # type: ignore[arg-type]

    def keeper_samples(self) -> None:
        """The node block of ``health`` as the node keeper builds it (problems of every kind, no kernel)."""
        from netplugin.core.config import Config
        from netplugin.core.node import NodeInfo
        from netplugin.nodenet.routes import Route, RouteProblem, RouteReport

        class WatchingHost:
            cache = None
            requests: dict[tuple[str, str], int] = {}  # noqa: RUF012
            node_name = "n1"

            def get_pod_by_name(self, namespace: str, name: str) -> None:
                return None

            def kube_client(self) -> None:
                return None

            def node_info(self) -> NodeInfo:
                return NodeInfo("n1")

            def list_nodes(self) -> list[NodeInfo]:
                return [NodeInfo("n1", ("10.244.1.0/24",), ("192.0.2.1",))]

            def start_watching(self, on_nodes_change: Any = None, *, on_pod_deleted: Any = None) -> None:
                return None

            def stop_watching(self) -> None:
                return None

            def node_problems(self) -> list[tuple[str, str]]:
                return [("n3", "spec.podCIDRs: not a CIDR")]

        keeper = _node_keeper()(Config(node_routes=False), WatchingHost())
        keeper.nodes = WatchingHost().list_nodes()
        keeper.report = RouteReport(
            added=["10.244.4.0/24"],
            routes=[Route("10.244.4.0/24", "192.0.2.4", 7, "n4")],
            problems=[RouteProblem("n2", "10.244.2.0/24", "node n2 has no InternalIP", "no_address")],
        )

        def status() -> Any:
            out = keeper.status()
            out.pop("last_sync", None)
            return json.dumps(out)  # in the answer's key order

        def problems() -> str:
            found = keeper.problems({"nodes": {"failing": True, "last_error": "x"}})
            return json.dumps([p if isinstance(p, dict) else p.to_dict() for p in found])  # dicts before NodeProblem

        self.sample("keeper_problems", problems)
        self.sample("keeper_status", status)
        self.sample("keeper_metrics", lambda: _node_metrics(keeper))

    def netlink_samples(self) -> None:
        """Kernel notifications as the watch parses them (the link view, deleted routes, a dump's end)."""
        from netplugin.core import nlwire as w

        def msg(kind: int, body: bytes, seq: int = 0) -> bytes:
            return w.NLHDR.pack(w.NLHDR.size + len(body), kind, 0, seq, 0) + body + b"\0" * (-len(body) & 3)

        def link(kind: int, index: int, name: str, master: int = 0, mtu: int = 1500, up: bool = True) -> bytes:
            body = w.IFINFO.pack(0, 0, index, 1 if up else 0, 0) + w.str_attr(w.IFLA_IFNAME, name)
            body += w.u32_attr(w.IFLA_MTU, mtu) + (w.u32_attr(w.IFLA_MASTER, master) if master else b"")
            body += w.attr(w.IFLA_LINKINFO, w.HAIRPIN) if master else b""
            return msg(kind, body)

        def nohairpin(index: int) -> bytes:
            prot = w.attr(w.IFLA_PROTINFO, w.attr(w.IFLA_BRPORT_MODE, b"\0"))
            return msg(w.RTM_NEWLINK, w.IFINFO.pack(socket.AF_BRIDGE, 0, index, 1, 0) + prot)

        def qdisc(index: int, handle: int) -> bytes:
            return msg(w.RTM_DELQDISC, w.TCMSG.pack(0, index, handle, 0, 0))

        def deladdr(index: int) -> bytes:
            return msg(w.RTM_DELADDR, w.IFADDR.pack(2, 24, 0, 0, index))

        def route(kind: int, proto: int) -> bytes:
            return msg(kind, w.RTMSG.pack(2, 24, 0, 0, 254, proto, 0, 1, 0))

        seed = link(16, 1, "cbr0") + link(16, 2, "veth-a", master=1) + link(16, 3, "veth-b", master=1)
        seed += link(16, 4, "eth9")
        batches = [
            ("seed", seed),
            ("hairpin_off", nohairpin(2)),
            ("qdisc_default", qdisc(3, 0)),
            ("qdisc_own", qdisc(3, 0x10000)),
            ("addr_of_bridge", deladdr(1)),
            ("mtu_change", link(16, 1, "cbr0", mtu=9000)),
            ("bridge_down", link(16, 1, "cbr0", mtu=9000, up=False)),
            ("port_detached", link(16, 3, "veth-b")),
            ("del_port", link(17, 2, "veth-a", master=1)),
            ("del_bridge", link(17, 1, "cbr0")),
            ("truncated", link(16, 4, "eth9")[:-8]),
            ("short_length", struct.pack("=IHHII", 8, 16, 0, 0, 0) + b"\0" * 16),
            ("garbage", b"\x01\x02\x03"),
        ]
        view_cls = _linkview()
        view = view_cls()

        def feed(data: bytes) -> Any:
            lost = view.feed(data)
            return {"gone": sorted(lost.gone), "damaged": sorted(lost.damaged), "bool": bool(lost)}

        for name, data in batches:
            self.sample(f"linkview_{name}", lambda data=data: feed(data))  # type: ignore[misc]
        self.sample("linkview_links", lambda: {i: repr(v) for i, v in sorted(view.links.items())})
        deleted, done = _watch_parsers()
        done_msg = msg(w.NLMSG_DONE, b"\0\0\0\0")
        routes = [
            ("del78", route(25, 78)),
            ("del3", route(25, 3)),
            ("new78", route(24, 78)),
            ("mixed", route(24, 78) + route(25, 4) + route(25, 78)),
            ("short", struct.pack("=IHHII", 4, 25, 0, 0, 0)),
            ("cut_body", msg(25, b"\0" * 4)),
        ]
        self.sample("deleted_routes", lambda: {n: deleted(d, 78) for n, d in routes})
        dones = [("done", done_msg), ("seed_done", seed + done_msg), ("seed", seed), ("empty", b""), ("x", b"\0" * 20)]
        self.sample("dump_done", lambda: {n: done(d) for n, d in dones})
        self.sample("nlwire_hairpin", lambda: w.HAIRPIN)
        self.sample("nlwire_no_link_local", lambda: w.NO_LINK_LOCAL)
        self.sample("nlwire_find_attr", lambda: [w.find_attr(seed[16:], w.IFINFO.size, k) for k in (3, 4, 10, 99)])

    def finish(self) -> None:
        (self.out / "samples.sha256").write_text("\n".join(self.hashes) + "\n")
        (self.out / "counts.json").write_text(json.dumps(self.counts, sort_keys=True) + "\n")
        shutil.rmtree(self.tmp, ignore_errors=True)


def _own(*modules: str) -> Any:
    """The first of ``modules`` that this tree has (by its file: an installed netplugin elsewhere may
    answer an import this tree cannot)."""
    for name in modules:
        if not (REPO / (name.replace(".", "/") + ".py")).is_file():
            continue
        return __import__(name, fromlist=["_"])
    raise ImportError(f"none of {modules} in {REPO}")


def _linkview() -> Any:
    return _own("netplugin.nodenet.linkview", "netplugin.frontends.daemon.linkview").LinkView


def _node_keeper() -> Any:
    return _own("netplugin.agent.nodekeeper", "netplugin.frontends.daemon.nodekeeper").NodeKeeper


def _node_metrics(keeper: Any) -> str:
    """The node keeper's families of ``/metrics``, with repairs of two kinds counted."""
    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    keeper.repairs["route"] += 2
    keeper.repairs["qdisc"] += 1
    registry = CollectorRegistry()
    if (REPO / "netplugin/frontends/daemon/keepermetrics.py").is_file():
        registry.register(_own("netplugin.frontends.daemon.keepermetrics").NodeCollector(keeper))
    else:  # before the agent layer: the keeper registered its own collector
        keeper.register(registry)
    return str(generate_latest(registry).decode())


def _watch_parsers() -> tuple[Callable[[bytes, int], bool], Callable[[bytes], bool]]:
    mod = _own("netplugin.nodenet.kernelwatch", "netplugin.frontends.daemon.kernelwatch")
    return mod._deleted_routes, mod._done


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/behaviour_snapshot.py OUTDIR")
    out = Path(sys.argv[1])
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    snap = Snapshot(out)
    try:
        snap.help_pages()
        snap.matrix()
        snap.samples()
    finally:
        snap.finish()
    print(json.dumps(snap.counts))


if __name__ == "__main__":
    main()
