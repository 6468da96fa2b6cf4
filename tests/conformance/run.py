"""Kubernetes' own e2e suite against netplugin: the engine of ``scripts/conformance.sh``.

It builds the test images (:mod:`tests.conformance.images`), brings up the cluster
(:mod:`tests.conformance.cluster`: a control plane and two nodes, netplugin deployed from the shipped
manifests), runs ``e2e.test`` with the focus and skip given, writes ``junit_01.xml`` (``e2e.test``'s
own) and ``e2e.log`` to the report dir, tears everything down, and prints one line
``N passed, N failed, N skipped``. A failed spec listed in :data:`EXPECTED_FAILURES` with its reason
does not count as failed (and one that passes is an error: the list must be kept true).

Exit status: 0 nothing failed but the expected; 1 a spec failed (or an expected failure passed);
2 bad usage or a missing prerequisite; 3 the cluster did not come up (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conformance.cluster import NETPLUGIN_IMAGE, PAUSE_IMAGE, PEERS, Cluster
from tests.conformance.disruption import DisruptionReport, run_disruptions
from tests.conformance.images import BUILDERS, REGRESSION_74839, ImageBuilder, list_images, retag_archive

__all__ = [
    "DEFAULT_FOCUS", "DEFAULT_SKIP", "SMALL_FOCUS", "Results", "build_images", "main", "read_junit", "selected_specs",
]  # fmt: skip

HERE = Path(__file__).resolve().parent
EXPECTED_FAILURES = HERE / "expected-failures.yaml"
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns:v1.15.0"
CACHE = Path(os.environ.get("NETPLUGIN_CONFORMANCE_CACHE", "/var/cache/netplugin-conformance"))

#: the pod network itself: the four Pods granular checks and HostPort (no Service, no DNS)
SMALL_FOCUS = [
    r"\[sig-network\] Networking Granular Checks: Pods should function for (intra-pod|node-pod) communication: "
    r"(http|udp)",
    r"\[sig-network\] HostPort validates that there is no conflict between pods with same hostPort but different "
    r"hostIP and protocol",
]
#: the default set: every sig-network conformance spec; the Services granular checks; NoSNAT,
#: Conntrack; the scheduler's hostPort conflicts; the lifecycle hooks and PreStop; the dual-stack
#: pod specs
DEFAULT_FOCUS = [
    r"\[sig-network\] .*\[Conformance\]",
    r"\[sig-network\] Networking Granular Checks: (Pods|Services) ",
    r"\[sig-network\] NoSNAT ",
    r"\[sig-network\] Conntrack ",
    r"\[sig-scheduling\] SchedulerPredicates .*same hostPort",
    r"\[sig-node\] Container Lifecycle Hook ",
    r"\[sig-node\] PreStop ",
    r"\[sig-network\] \[Feature:IPv6DualStack\] (should have at least one dual-stack node|"
    r"should create pod, add ipv6 and ipv4 ip to pod ips|should be able to reach pod on ipv4 and ipv6 ip)",
]
#: never: SCTP (not in this kernel's lab), what disrupts or needs more than one machine gives
DEFAULT_SKIP = [r"SCTP|sctp", r"\[Disruptive\]", r"\[Flaky\]", r"\[Slow\]"]


def joined(patterns: list[str]) -> str:
    return "|".join(f"(?:{p})" for p in patterns)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- selection -----------------------------------------------------------------------------------------


def selected_specs(e2e_test: Path, focus: str, skip: str, work: Path) -> list[str]:
    """The full names of the specs ``focus``/``skip`` select, from ``e2e.test --ginkgo.dry-run``."""
    report = work / "dry-run.json"
    kubeconfig = work / "dry-run.kubeconfig"
    kubeconfig.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [],
                                      "contexts": [], "current-context": ""}))  # fmt: skip
    argv = [str(e2e_test), f"--kubeconfig={kubeconfig}", "--provider=skeleton", "--ginkgo.dry-run",
            f"--ginkgo.focus={focus}", f"--ginkgo.skip={skip}", f"--ginkgo.json-report={report}",
            f"--report-dir={work}"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=work)
    if not report.exists():
        raise RuntimeError(f"e2e.test --ginkgo.dry-run wrote no report ({done.returncode}): {done.stdout[-2000:]}")
    names = []
    for suite in json.loads(report.read_text()):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It" or spec.get("State") != "passed":
                continue
            names.append(" ".join([*(spec.get("ContainerHierarchyTexts") or []), spec["LeafNodeText"]]))
    return sorted(names)


# --- results -------------------------------------------------------------------------------------------


@dataclass
class Results:
    passed: list[tuple[str, float]]
    failed: list[tuple[str, float, str]]
    skipped: list[tuple[str, str]]


def read_junit(path: Path) -> Results:
    """The specs that ran, from e2e.test's JUnit report (specs the focus left out are not counted)."""
    res = Results([], [], [])
    for case in ET.parse(path).getroot().iter("testcase"):
        name = re.sub(r"^\[It\] ", "", case.get("name", ""))
        seconds = float(case.get("time") or 0)
        skipped = case.find("skipped")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            res.failed.append((name, seconds, (failure.get("message") or failure.text or "")[:2000]))
        elif skipped is not None:
            message = skipped.get("message") or ""
            if message.startswith("skipped - "):  # Skip(reason) at run time; plain "skipped": not selected
                res.skipped.append((name, message.removeprefix("skipped - ")))
        elif not name.startswith("[") or name.startswith("[sig-"):
            res.passed.append((name, seconds))
    return res


def expected_failures(path: Path = EXPECTED_FAILURES) -> dict[str, str]:
    """spec name -> why it cannot pass on one machine (a reason outside netplugin)."""
    doc = yaml.safe_load(path.read_text()) or []
    return {str(e["spec"]): str(e["reason"]) for e in doc}


# --- the images ------------------------------------------------------------------------------------------


def build_images(
    peers: Path, netplugin_image: str, work: Path, refs: list[str] | None = None
) -> tuple[list[Path], Path]:
    """The test images under the references e2e.test names, CoreDNS's, and netplugin's (as a registry
    would serve the DaemonSet's image); (test archives, netplugin's archive). ``refs``: only these
    (of the images :data:`BUILDERS` makes) instead of e2e.test's."""
    by_builder: dict[str, list[str]] = defaultdict(list)
    wanted = refs if refs is not None else [*list_images(peers / "e2e.test"), COREDNS_IMAGE, PAUSE_IMAGE]
    for ref in wanted:
        path = ref.split("/", 1)[1].rsplit(":", 1)[0] if "/" in ref else ref
        if path in BUILDERS and ref not in by_builder[path]:
            by_builder[path].append(ref)
    builder = ImageBuilder(work / "images", CACHE, peers, log)
    archives: dict[object, Path] = {}
    out = []
    for path, refs in by_builder.items():
        make = BUILDERS[path]
        if make in archives:  # one image standing in for several (agnhost): one archive, every name
            continue
        refs = [r for p, rs in by_builder.items() if BUILDERS[p] is make for r in rs]
        archives[make] = make(builder, refs)
        log(f"images: {', '.join(refs)}")
        out.append(archives[make])
    saved = work / "netplugin-saved.tar"
    done = subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(saved), netplugin_image],
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"podman save {netplugin_image}: {done.stderr}")
    tag = netplugin_image.rsplit(":", 1)[1]
    netplugin = work / "netplugin.tar"
    retag_archive(saved, netplugin, [f"{NETPLUGIN_IMAGE}:{tag}"])
    saved.unlink()
    log(f"images: {netplugin_image} as {NETPLUGIN_IMAGE}:{tag}")
    return out, netplugin


# --- the run ---------------------------------------------------------------------------------------------


def run_e2e(cluster: Cluster, peers: Path, report_dir: Path, focus: str, skip: str, timeout: str) -> int:
    argv = [
        str(peers / "e2e.test"), f"--kubeconfig={cluster.admin_kubeconfig}", "--provider=skeleton",
        f"--num-nodes={len(cluster.nodes)}", f"--kubectl-path={peers / 'kubectl'}", f"--report-dir={report_dir}",
        "--disable-log-dump", f"--ginkgo.focus={focus}", f"--ginkgo.skip={skip}", "--ginkgo.v",
        "--ginkgo.no-color", f"--ginkgo.timeout={timeout}",
    ]  # fmt: skip
    log(f"e2e: {' '.join(argv)}")
    show = re.compile(r"^(• |\[FAILED\]|\[PANICKED\]|Ran \d+ of|FAIL!|SUCCESS!|  \[FAILED\])")
    with open(report_dir / "e2e.log", "w") as out:
        env = {**os.environ, "KUBECONFIG": str(cluster.admin_kubeconfig)}
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=report_dir, env=env
        )
        assert proc.stdout is not None
        previous = ""
        for line in proc.stdout:
            out.write(line)
            if show.match(line):
                log(f"e2e: {line.rstrip()}")
            elif previous.startswith("• ") and line.startswith("["):
                log(f"e2e:   {line.rstrip()}")
            previous = line
        return proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="conformance.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=Path, required=True, help="scripts/build-peers.sh's directory")
    ap.add_argument("--netplugin-image", required=True, help="the image scripts/build-image.sh built (podman)")
    ap.add_argument("--report-dir", type=Path, required=True, help="where junit_01.xml, e2e.log and logs go")
    ap.add_argument("--focus", action="append", help="ginkgo regex (repeatable; default: the default set)")
    ap.add_argument("--skip", action="append", help="ginkgo regex (repeatable; default: SCTP, disruptive, flaky)")
    ap.add_argument("--small", action="store_true", help="focus on the Pods granular checks and HostPort")
    ap.add_argument("--list", action="store_true", help="print the specs the focus selects, run nothing")
    ap.add_argument("--timeout", default="3h", help="e2e.test's overall limit (ginkgo duration)")
    ap.add_argument("--disruption", action="store_true",
                    help="then a rolling update of the DaemonSet and a node reboot under traffic")  # fmt: skip
    args = ap.parse_args(argv)
    missing = [
        p
        for p in (*PEERS, "e2e.test", "agnhost", REGRESSION_74839, "coredns")
        if not os.access(args.peers / p, os.X_OK)
    ]
    if missing:
        log(f"conformance: peers missing in {args.peers}: {', '.join(missing)} (scripts/build-peers.sh builds them)")
        return 2
    focus = joined(args.focus or (SMALL_FOCUS if args.small else DEFAULT_FOCUS))
    skip = joined(args.skip or DEFAULT_SKIP)
    report_dir = args.report_dir.resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    xfail = expected_failures()
    with tempfile.TemporaryDirectory(prefix="netplugin-conformance-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)
        specs = selected_specs(args.peers / "e2e.test", focus, skip, work)
        (report_dir / "selected-specs.txt").write_text("".join(f"{s}\n" for s in specs))
        log(f"conformance: the focus selects {len(specs)} specs (listed in {report_dir / 'selected-specs.txt'})")
        if args.list:
            print("\n".join(specs))
            return 0
        log(f"conformance: expected failures ({EXPECTED_FAILURES.relative_to(HERE.parents[1])}):")
        for name, reason in xfail.items():
            log(f"  - {name}\n      why: {reason}")
        timings: dict[str, float] = {}
        disrupted: DisruptionReport | None = None
        t = time.monotonic()
        archives, netplugin = build_images(args.peers, args.netplugin_image, work)
        timings["test images"] = round(time.monotonic() - t, 1)
        try:
            (work / "cluster").mkdir()
            cluster = Cluster(args.peers, archives, netplugin, root=work / "cluster", log=log)
            with cluster:
                timings.update(cluster.timings)
                log(cluster.describe())
                t = time.monotonic()
                try:
                    rc = run_e2e(cluster, args.peers, report_dir, focus, skip, args.timeout)
                    timings["suite"] = round(time.monotonic() - t, 1)
                    if args.disruption:
                        t = time.monotonic()
                        disrupted = run_disruptions(cluster, log, report_dir / "disruption.txt")
                        timings["disruption"] = round(time.monotonic() - t, 1)
                finally:
                    cluster.collect_logs(report_dir / "logs")
        except RuntimeError as e:
            log(f"conformance: the cluster did not come up: {e}")
            return 3
    junit = report_dir / "junit_01.xml"
    if not junit.exists():
        log(f"conformance: e2e.test (exit {rc}) wrote no {junit}; see {report_dir / 'e2e.log'}")
        return 1
    res = read_junit(junit)
    # A spec selected that neither passed, failed nor skipped itself did not run (a suite setup that
    # failed, a timeout): that is a failure too, and so is e2e.test's failing with nothing failed.
    seen = {name for name, _ in res.passed} | {f[0] for f in res.failed} | {name for name, _ in res.skipped}
    res.failed += [(name, 0.0, "did not run (see e2e.log)") for name in specs if name not in seen]
    if rc != 0 and not res.failed:
        res.failed.append(("e2e.test", 0.0, f"exit {rc} (see e2e.log)"))
    unexpected = [f for f in res.failed if f[0] not in xfail]
    as_expected = [f for f in res.failed if f[0] in xfail]
    wrongly_listed = [name for name, _ in res.passed if name in xfail]
    for name, seconds in res.passed:
        log(f"PASSED  {seconds:7.1f} s  {name}")
    for name, seconds, message in res.failed:
        mark = "XFAIL " if name in xfail else "FAILED"
        log(f"{mark}  {seconds:7.1f} s  {name}\n        {message.splitlines()[0] if message else ''}")
    for name, reason in res.skipped:
        log(f"SKIPPED            {name}: {reason}")
    for name in wrongly_listed:
        log(f"conformance: {name} passed but is listed as an expected failure: take it off the list")
    log(f"conformance: times (s): {json.dumps(timings)}")
    if as_expected:
        log(f"conformance: {len(as_expected)} failed as expected (listed with their reasons above)")
    disruption_failed = disrupted is not None and not disrupted.ok()
    if disrupted is not None:
        log(f"conformance: upgrade and reboot under traffic {'FAILED' if disruption_failed else 'passed'}")
    print(f"{len(res.passed)} passed, {len(unexpected)} failed, {len(res.skipped)} skipped")
    return 1 if unexpected or wrongly_listed or disruption_failed else 0


if __name__ == "__main__":
    sys.exit(main())
