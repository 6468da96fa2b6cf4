"""Results, targets and findings: what a run measured and what it means (written out by ``bench/writer``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contenders import reference_version

__all__ = [
    "Figure", "Meta", "Row", "Target", "cell", "column_header", "evaluate_targets", "findings", "meets", "part_of",
    "ratio_cell",
]


@dataclass
class Row:
    """One line of a figure: a contender (``key`` A..E) or a variant of one (``A-par``, ``E-group``)."""

    key: str
    label: str
    values: dict[str, float | None]
    note: str = ""


@dataclass
class Figure:
    id: str
    title: str
    unit: str
    columns: list[str]
    rows: list[Row] = field(default_factory=list)
    #: the value compared with row A's (None: no ratio column)
    ratio_column: str | None = None
    notes: list[str] = field(default_factory=list)
    #: raw samples per row key (for the JSON file)
    samples: dict[str, list[float]] = field(default_factory=dict)
    #: columns that are plain numbers (ratios), not in ``unit``
    unitless: list[str] = field(default_factory=list)
    #: columns in a unit other than ``unit`` ("" for a count, printed whole)
    column_units: dict[str, str] = field(default_factory=dict)
    #: sizes the figure ran with (pods, rounds)
    params: dict[str, int] = field(default_factory=dict)

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def value(self, key: str, column: str) -> float | None:
        r = self.row(key)
        return None if r is None else r.values.get(column)

    def unit_of(self, column: str) -> str:
        """The column's unit: its own, else the figure's; "x" for a ratio."""
        if column in self.unitless:
            return "x"
        return self.column_units.get(column, self.unit)

    def ratio(self, key: str) -> float | None:
        if self.ratio_column is None:
            return None
        a = self.value("A", self.ratio_column)
        v = self.value(key, self.ratio_column)
        if a is None or v is None or a <= 0:
            return None
        return v / a


@dataclass
class Target:
    id: str
    text: str
    measured: str
    limit: str
    #: True met, False missed, None not measured (a contender was unavailable)
    met: bool | None
    detail: str = ""


@dataclass
class Meta:
    mode: str
    started: str
    duration_s: float
    machine: dict[str, str]
    available: dict[str, str]
    unavailable: dict[str, str]
    settings: dict[str, Any]
    problems: list[str] = field(default_factory=list)


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "MiB":
        return f"{v:.1f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def cell(fig: Figure, key: str, column: str) -> str:
    """A value of the figure's table as BENCHMARKS.md prints it (the plots' JSON holds the same rounding)."""
    v = fig.value(key, column)
    if column in fig.unitless:
        return _ratio(v)
    unit = fig.unit_of(column)
    if unit == "" and v is not None and float(v).is_integer():
        return f"{v:.0f}"  # a count
    return _fmt(v, unit)


def ratio_cell(fig: Figure, key: str) -> str:
    """The row's ratio to A as BENCHMARKS.md prints it ("-" without a ratio column or an A)."""
    return _ratio(fig.ratio(key))


def column_header(fig: Figure, column: str) -> str:
    unit = fig.unit_of(column)
    return f"{column} ({unit})" if unit and unit != "x" else column


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def meets(measured: str, limit: str) -> bool:
    """Whether a measurement meets an upper limit, both compared as printed ("0.80x", "≤ 0.8x"): a ratio
    of 0.8012 prints as 0.80x and meets ≤ 0.8x, since a verdict the printed numbers contradict is an error."""
    m, lim = _NUMBER.search(measured), _NUMBER.search(limit)
    if m is None or lim is None:
        raise ValueError(f"not a measurement and a limit: {measured!r}, {limit!r}")
    return float(m.group()) <= float(lim.group())


def _upper(tid: str, text: str, measured: str, limit: str, detail: str = "") -> Target:
    """A target with an upper limit, judged on the printed numbers (:func:`meets`)."""
    return Target(tid, text, measured, limit, meets(measured, limit), detail)


def _get(figs: dict[str, Figure], fid: str) -> Figure | None:
    return figs.get(fid)


def evaluate_targets(figures: Sequence[Figure]) -> list[Target]:
    """The issue's targets, each met, missed, or not measured."""
    figs = {f.id: f for f in figures}
    out: list[Target] = []

    setup = _get(figs, "setup")
    for key, limit in (("D", 0.5), ("C", 1.0)):
        text = f"{key} per-pod setup median ≤ {limit}x {_ref()}'s ADD median"
        r = setup.ratio(key) if setup else None
        if r is None:
            out.append(Target(f"setup-{key}", text, "not measured", f"{limit}x", None,
                              f"{key} or A unavailable" if setup else "figure not run"))
            continue
        assert setup is not None
        detail = f"{key} {_fmt(setup.value(key, 'median'))} ms vs A {_fmt(setup.value('A', 'median'))} ms"
        out.append(_upper(f"setup-{key}", text, f"{r:.2f}x", f"≤ {limit}x", detail))

    drain = _get(figs, "drain")
    n = drain.params.get("pods", 100) if drain else 100
    text = f"{n}-pod drain with D ≤ 0.3x {_ref()}'s {n} sequential DELs"
    r = drain.ratio("D") if drain else None
    if drain is not None and r is not None:
        detail = f"D {_fmt(drain.value('D', 'median'))} ms vs A {_fmt(drain.value('A', 'median'))} ms"
        out.append(_upper("drain-D", text, f"{r:.2f}x", "≤ 0.3x", detail))
    else:
        out.append(Target("drain-D", text, "not measured", "≤ 0.3x", None, "D or A unavailable"))

    out += _scale_targets(_get(figs, "scale"))

    cold = _get(figs, "coldstart")
    v = cold.value("B-i", "median") if cold else None
    text = "CLI cold start of a no-op setup, no daemon, as installed (B-i) ≤ 120 ms (median)"
    out.append(Target("coldstart", text, "not measured", "≤ 120 ms", None) if v is None
               else _upper("coldstart", text, f"{_fmt(v)} ms", "≤ 120 ms"))

    api = _get(figs, "cluster-api")
    v = api.value("D-warm", "per pod") if api else None
    out.append(Target("cluster-api", "API requests per pod setup on a warm daemon = 0",
                      "not measured" if v is None else f"{v:g}", "0", None if v is None else v == 0))
    routes = _get(figs, "cluster-routes")
    worst = max((routes.value(k, "max") or 0.0 for k in ("join-1", "change-1", "leave-1")), default=None) \
        if routes else None
    text = "a node joining, changing or leaving reaches every node's routes within 2 s (50 nodes)"
    out.append(Target("cluster-routes", text, "not measured", "≤ 2000 ms", None) if worst is None
               else _upper("cluster-routes", text, f"{_fmt(worst)} ms (max)", "≤ 2000 ms"))
    out += _runtime_targets(figs)

    ov = _get(figs, "overhead")
    v = ov.value("C", "overhead") if ov else None
    text = "daemon overhead of a setup request over a direct plugin exec ≤ 2 ms (median difference)"
    out.append(Target("overhead", text, "not measured", "≤ 2 ms", None) if v is None
               else _upper("overhead", text, f"{_fmt(v)} ms", "≤ 2 ms"))
    return out


def _scale_targets(scale: Figure | None) -> list[Target]:
    """B, C and D grow at most 1.1x from the fewest pods present to the most; D no more than the floor E + 0.1."""
    out: list[Target] = []
    for key in ("B", "C", "D"):
        text = f"{key}: per-pod setup with the most pods present ≤ 1.1x that with the fewest"
        if scale is None or scale.row(key) is None:
            out.append(Target(f"scale-{key}", text, "not measured", "≤ 1.1x", None, f"{key} unavailable"))
            continue
        cols = [c for c in scale.columns if c.startswith("N=")]
        lo, hi = scale.value(key, cols[0]), scale.value(key, cols[-1])
        if lo is None or hi is None or lo <= 0:
            out.append(Target(f"scale-{key}", text, "not measured", "≤ 1.1x", None, "no samples"))
            continue
        r = hi / lo
        detail = f"{cols[-1]}: {_fmt(hi)} ms, {cols[0]}: {_fmt(lo)} ms"
        e_growth = scale.value("E", "growth")
        if e_growth is not None:
            beyond = scale.value(key, "growth beyond E")
            detail += f"; the floor E grows {e_growth:.2f}x" + (
                "" if beyond is None else f"; this row's growth beyond E's: {beyond:+.2f} ms")
        out.append(_upper(f"scale-{key}", f"{key}: per-pod setup with {cols[-1][2:]} pods present ≤ 1.1x "
                          f"that with {cols[0][2:]}", f"{r:.2f}x", "≤ 1.1x", detail))
        if key == "D" and e_growth is not None:
            out.append(_upper("scale-D-vs-E", f"D: growth from {cols[0][2:]} to {cols[-1][2:]} pods ≤ E's + 0.1",
                              f"{r:.2f}x", f"≤ {e_growth + 0.1:.2f}x", detail))
    return out


def _ratio_target(fig: Figure | None, tid: str, key: str, limit: float, text: str) -> Target:
    r = fig.ratio(key) if fig else None
    if fig is None or r is None:
        return Target(tid, text, "not measured", f"≤ {limit}x", None, f"{key} or A unavailable")
    detail = f"{key} {_fmt(fig.value(key, 'median'))} ms vs A {_fmt(fig.value('A', 'median'))} ms"
    return _upper(tid, text, f"{r:.2f}x", f"≤ {limit}x", detail)


def _runtime_targets(figs: dict[str, Figure]) -> list[Target]:
    """The CNI shim (F, G: compiled) and the CLI as processes, with the daemon up; a node's pods at once."""
    out: list[Target] = []
    add, dl = _get(figs, "runtime-add"), _get(figs, "runtime-del")
    for key, limit, what in (("G", 0.5, "native plugin"), ("F", 1.5, "bash plugin")):
        text = f"compiled shim ADD process with the daemon up ({what}, {key}) ≤ {limit}x {_ref()}'s ADD (medians)"
        out.append(_ratio_target(add, f"shim-add-{key}", key, limit, text))
    text = f"compiled shim DEL process (G) ≤ 0.5x {_ref()}'s DEL (medians)"
    out.append(_ratio_target(dl, "shim-del-G", "G", 0.5, text))
    h = add.value("H", "median") if add else None
    p = add.value("P", "median") if add else None
    text = "CLI setup through the daemon (H, no-op exec plugin) within 10 ms of `python -I -S -c pass` (P), medians"
    if h is None or p is None:
        out.append(Target("cli-thin", text, "not measured", "≤ +10 ms", None, "H or P unavailable"))
    else:
        out.append(_upper("cli-thin", text, f"{h - p:+.2f} ms", "≤ +10 ms", f"H {_fmt(h)} ms, P {_fmt(p)} ms"))
    sandboxes = _get(figs, "containerd2-burst")
    n = sandboxes.params.get("burst", 110) if sandboxes else 110
    text = f"{n} RunPodSandbox at once through containerd 2 (N): makespan ≤ 0.9x the same with {_ref()} (medians)"
    out.append(_ratio_target(sandboxes, "containerd2-burst", "N", 0.9, text))
    return [*out, *_node_burst_targets(figs), _containerd_target(figs), *_hostport_targets(figs)]


def _pair_target(fig: Figure | None, tid: str, key: str, ref: str, column: str, limit: float, text: str) -> Target:
    """``key``'s median over ``ref``'s in the same figure (``column``, when the figure has it, is that ratio)."""
    v = fig.value(key, "median") if fig else None
    r = fig.value(ref, "median") if fig else None
    if fig is None or v is None or r is None or r <= 0:
        return Target(tid, text, "not measured", f"≤ {limit}x", None, f"{key} or {ref} unavailable")
    ratio = fig.value(key, column) if column in fig.columns else None
    ratio = v / r if ratio is None else ratio
    return _upper(tid, text, f"{ratio:.2f}x", f"≤ {limit}x", f"{key} {_fmt(v)} ms vs {ref} {_fmt(r)} ms")


def _lower(tid: str, text: str, measured: float, limit: float, detail: str) -> Target:
    """A target with a lower limit (a speedup), judged on the printed numbers like :func:`meets`."""
    m, lim = f"{measured:.2f}x", f"≥ {limit:.2f}x"
    return Target(tid, text, m, lim, float(m[:-1]) >= float(lim[2:-1]), detail)


def _node_burst_targets(figs: dict[str, Figure]) -> list[Target]:
    """A node's pods at once: bursts of 110 and 20 ADD processes, the kernel floor, 1 CPU against 2."""
    b110, b20 = _get(figs, "node-burst-110"), _get(figs, "node-burst-20")
    what = "concurrent compiled shim ADD processes"
    out = [
        _ratio_target(b110, "node-burst-110-G", "G", 0.5, f"110 {what} (G): makespan ≤ 0.5x {_ref()}'s (medians)"),
        _pair_target(b110, "node-burst-110-G-floor", "G", "K", "/ K", 1.5,
                     f"110 {what} (G): makespan ≤ 1.5x the kernel floor's burst (K, medians)"),
        _ratio_target(b20, "node-burst-20-G", "G", 0.6, f"20 {what} (G): makespan ≤ 0.6x {_ref()}'s (medians)"),
        _pair_target(b20, "node-burst-20-F", "F", "X", "", 1.1,
                     f"20 {what} (F): makespan ≤ 1.1x the bash plugin run directly (X) in the same burst (medians)"),
    ]
    cores = _get(figs, "node-burst-cores")
    lo, hi = (cores.params.get("low", 1), cores.params.get("high", 2)) if cores else (1, 2)
    for key in ("G", "F"):
        text = (f"from {lo} CPU to {hi}, netplugin's 110-pod burst ({key}) speeds up at least as much as "
                f"{_ref()}'s (makespan medians)")
        mine = cores.value(f"{key}-110", "speedup") if cores else None
        ref = cores.value("A-110", "speedup") if cores else None
        if mine is None or ref is None:
            out.append(Target(f"node-burst-cores-{key}", text, "not measured", "≥ A's", None,
                              f"{key}, A or the {lo}-CPU run unavailable"))
        else:
            out.append(_lower(f"node-burst-cores-{key}", text, mine, ref, f"{key} {mine:.2f}x, A {ref:.2f}x"))
    return out


def _hostport_targets(figs: dict[str, Figure]) -> list[Target]:
    """Issue 29: bridge + hostPort through the daemon against CNI's bridge + host-local + portmap."""
    setup, down = _get(figs, "hostport-setup"), _get(figs, "hostport-teardown")
    chain = f"{_ref()}'s bridge + portmap chain"
    what = "bridge + hostPort through the daemon"
    return [
        _ratio_target(setup, "hostport-setup-N", "N", 0.8, f"{what}, built in (N): setup ≤ 0.8x {chain}"),
        _ratio_target(setup, "hostport-setup-B", "B", 1.5, f"{what}, bash (B): setup ≤ 1.5x {chain}"),
        _ratio_target(down, "hostport-teardown-N", "N", 1.0, f"{what}, built in (N): teardown ≤ 1.0x {chain}'s"),
        _ratio_target(down, "hostport-teardown-B", "B", 1.0, f"{what}, bash (B): teardown ≤ 1.0x {chain}'s"),
    ]


def _ref() -> str:
    """Contender A as the targets name it: its CNI plugins' version."""
    return f"A (CNI {reference_version('A')})"


def _containerd_target(figs: dict[str, Figure]) -> Target:
    """Issue 18: RunPodSandbox's time above the host-network floor, netplugin (N) against the stock bridge (A)."""
    run = _get(figs, "containerd-run")
    text = f"containerd RunPodSandbox with netplugin (N): time above the host-network floor ≤ 1.0x {_ref()}'s"
    n_above = run.value("N", "above floor") if run else None
    a_above = run.value("A", "above floor") if run else None
    if n_above is None or a_above is None:
        return Target("containerd-run", text, "not measured", "≤ 1.0x", None, "N, A or HOST unavailable")
    if a_above <= 0:
        return Target("containerd-run", text, "not measured", "≤ 1.0x", None,
                      f"A's median is not above HOST's ({_fmt(a_above)} ms): no network cost to compare with")
    r = n_above / a_above
    return _upper("containerd-run", text, f"{r:.2f}x", "≤ 1.0x", f"N {_fmt(n_above)} ms vs A {_fmt(a_above)} ms "
                  "above the floor")


def part_of(part_name: str, part: float, whole_name: str, whole: float, rest: str) -> str:
    """"P takes p ms of W's w ms; the other w - p ms are <rest>": a sentence about a part of a whole.

    Two medians taken from different samples need not add up: when the part's median is above the
    whole's, no negative remainder is printed, only both figures and why they cannot be split."""
    if part <= whole:
        return (f"{part_name} takes {_fmt(part)} ms of {whole_name}'s {_fmt(whole)} ms; the other "
                f"{_fmt(whole - part)} ms are {rest}.")
    return (f"{part_name}, {_fmt(part)} ms, is above {whole_name}, {_fmt(whole)} ms: the two medians come from "
            "different samples, so no share is printed.")


def _runtime_finding(v: Callable[[str, str], float | None]) -> str | None:
    ra, rf, rg, rh, rp, gpy = (v("runtime-add", k) for k in ("A", "F", "G", "H", "P", "Gpy"))
    if rg is None or ra is None:
        return None
    text = (f"Runtime's view: the compiled shim's ADD with the native plugin (G) takes {_fmt(rg)} ms, "
            f"{rg / ra:.2f}x A's whole ADD. It starts no interpreter, so the bare interpreter (P) is no part of it: "
            "all of G is the shim's exec, the request and the daemon's work (plugin, durable pod and attachment "
            "records).")
    if rp is not None and gpy is not None:
        text += " Through the Python entry script (Gpy), " + part_of(
            "the bare interpreter (P)", rp, "Gpy", gpy, "the script's imports, the request and the daemon's work")
    if rf is not None:
        text += (f" With the bash plugin (F) the daemon execs it once (setup; its setup document spares the "
                 f"status exec): {rf - rg:+.2f} ms from G.")
    if rh is not None and rp is not None:
        text += " For the CLI's thin path with a no-op plugin (H), " + part_of(
            "the bare interpreter (P)", rp, "H", rh, "the CLI's imports, the request and the daemon's work")
    return text


def _coldstart_finding(v: Callable[[str, str], float | None]) -> str | None:
    bi, b, py, pys, bs = (v("coldstart", k) for k in ("B-i", "B", "py", "py-S", "B-S"))
    if bi is None or pys is None:
        return None
    text = "Cold start: as installed (B-i), " + part_of(
        "the bare interpreter (`python -S -c pass`)", pys, "the CLI", bi,
        "netplugin's own imports and work (and the venv's site)")
    if b is not None and py is not None:
        text += (f" Started as the checkout's console script (B) it takes {_fmt(b)} ms; there, "
                 + part_of("`python -S -c pass`", pys, "`python -c pass`", py,
                           "this interpreter's .pth hooks (an editable install's finder, the machine's own), which "
                           "an installed node does not run"))
    if bs is not None:
        text += f" The CLI on an interpreter started with -S: {_fmt(bs)} ms."
    return text


def _node_burst_findings(figs: dict[str, Figure]) -> list[str]:
    """Per burst size: ms per pod of each contender and of the kernel floor; the 1 -> N CPU speedups."""
    out = []
    for fig in sorted((f for f in figs.values() if f.id.startswith("node-burst-") and "burst" in f.params),
                      key=lambda f: f.params["burst"]):  # fmt: skip
        per = [f"{r.key} {_fmt(r.values.get('per pod'))}" for r in fig.rows if r.values.get("per pod") is not None]
        if per:
            out.append(f"Node burst of {fig.params['burst']}, ms per pod (makespan / pods): " + ", ".join(per) + ".")
    cores = figs.get("node-burst-cores")
    if cores is not None:
        ups = [f"{r.key} {_ratio(r.values.get('speedup'))}" for r in cores.rows if r.values.get("speedup")]
        if ups:
            lo, hi = cores.params.get("low", 1), cores.params.get("high", 2)
            out.append(f"Node burst from {lo} CPU to {hi}, speedup of the makespan: " + ", ".join(ups) + ".")
    return out


def findings(figures: Sequence[Figure]) -> list[str]:
    """Differences between rows that explain the figures, computed from them (no interpretation added)."""
    figs = {f.id: f for f in figures}
    out: list[str | None] = []

    def v(fid: str, key: str, col: str = "median") -> float | None:
        f = figs.get(fid)
        return None if f is None else f.value(key, col)

    a, c, d, e, x = (v("setup", k) for k in "ACDEX")
    if c is not None and x is not None:
        out.append("Setup: " + part_of("the bash plugin alone (X)", x, "the daemon's setup (C)", c,
                                       "the daemon around it") + (f" A's ADD takes {_fmt(a)} ms." if a else ""))
    if d is not None and e is not None:
        out.append(f"Setup: the native plugin in the daemon (D) takes {_fmt(d)} ms, {d - e:+.2f} ms from the pyroute2 "
                   f"floor (E, {_fmt(e)} ms). D does more (IPAM, locks, state records, the request) but sends its "
                   "pod-side netlink requests without pyroute2's generic machinery, so it can come close to E or "
                   "under it: E is the floor of the same operations through pyroute2, not of the kernel.")
    cs, cst, direct = v("overhead", "C"), v("overhead", "C-status"), v("overhead", "direct")
    if cs is not None and cst is not None and direct is not None:
        out.append(f"Overhead: a daemon status request (plugin exec'd, no state written) costs {cst - direct:+.2f} "
                   f"ms over the direct exec; a setup request {cs - direct:+.2f} ms. The {cs - cst:+.2f} ms "
                   "between them is the setup path's own work (its durable state records and init check).")
    out += [_coldstart_finding(v), _runtime_finding(v), *_node_burst_findings(figs)]
    scale = figs.get("scale")
    if scale is not None:
        growth = [f"{r.key} {_ratio(r.values.get('growth'))}" for r in scale.rows if r.values.get("growth")]
        if growth:
            out.append("Scale: setup time at the largest N relative to the smallest: " + ", ".join(growth) + ".")
    drain = figs.get("drain")
    if drain is not None:
        per = [f"{r.key} {_fmt(r.values.get('per pod'))}" for r in drain.rows if r.values.get("per pod") is not None]
        if per:
            out.append("Drain, ms per pod: " + ", ".join(per) + ".")
    return [f for f in out if f]
