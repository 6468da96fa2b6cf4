"""Property tests with hostile shapes (issue 13): every parser of outside input stays bounded.

The generators build documents that are small as text but costly when parsed naively: deep
nesting (flow, block, compact), alias bombs, wide collections, duplicate keys, NUL bytes,
format widths; wrapped in a pod manifest, a netplugin config or a CNI network config. Each is
parsed in a long-lived worker process that runs with an address-space limit and measures the
tracemalloc peak of every parse; the test asserts, per example:

* the outcome is a value or the documented error class (never another exception, a signal,
  or the worker running out of memory);
* the peak memory is at most ``PEAK_BASE + PEAK_PER_BYTE`` x the input size;
* the message quoted to the user is short (no alias expansion into error messages);
* the worker answers within ``HANG`` seconds: a bound for a hang, not a speed claim.
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
WORKER_AS = 768 << 20  # the worker's address space: netplugin needs far less, a bomb far more
PEAK_BASE = 24 << 20
PEAK_PER_BYTE = 64
MAX_MESSAGE = 1000
HANG = 60.0
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORKER = textwrap.dedent(
    """
    import base64, json, os, resource, sys, tracemalloc
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from netplugin.core.config import load_config
    from netplugin.core.errors import NetpluginError
    from netplugin.hosts.static import load_manifest
    from netplugin.frontends.cni.spec import CniError, parse_request
    from netplugin.frontends.cni.netconf import build_config
    scratch = sys.argv[1]

    def manifest(data, suffix):
        path = os.path.join(scratch, "pod" + suffix)
        with open(path, "wb") as f:
            f.write(data)
        return load_manifest(path)

    def config(data, _):
        path = os.path.join(scratch, "netplugin.yaml")
        with open(path, "wb") as f:
            f.write(data)
        return load_config(path, environ={{}})

    def cni(data, _):
        env = {{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": scratch,
               "NETPLUGIN_CONFIG": "/dev/null"}}
        return build_config(parse_request(env, data), env)

    def cni_env(data, _):
        env = {{"CNI_NETNS": scratch, "NETPLUGIN_CONFIG": "/dev/null", **json.loads(data)}}
        return build_config(parse_request(env, b'{{"cniVersion": "1.0.0", "name": "n", "plugin": "p"}}'), env)

    TARGETS = {{"manifest": manifest, "config": config, "cni": cni, "cni_env": cni_env}}
    ALLOWED = (NetpluginError, CniError)
    tracemalloc.start()
    for line in sys.stdin:
        job = json.loads(line)
        data = base64.b64decode(job["data"])
        tracemalloc.reset_peak()
        try:
            TARGETS[job["target"]](data, job["suffix"])
            outcome, message = "ok", ""
        except ALLOWED as e:
            outcome, message = type(e).__name__, str(e)
        except BaseException as e:
            outcome, message = "UNEXPECTED " + type(e).__name__, repr(e)[:2000]
        peak = tracemalloc.get_traced_memory()[1]
        print(json.dumps({{"outcome": outcome, "message": message[:100000], "peak": peak}}), flush=True)
    """
).format(limit=WORKER_AS)


class Worker:
    """One parser process for many examples; restarted (and the example failed) if it dies."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", WORKER, str(self.scratch)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
        return self.proc

    def parse(self, target: str, data: bytes, suffix: str = "") -> dict[str, Any]:
        proc = self.start()
        assert proc.stdin is not None and proc.stdout is not None
        job = {"target": target, "data": base64.b64encode(data).decode(), "suffix": suffix}
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        if not select.select([proc.stdout], [], [], HANG)[0]:
            proc.kill()
            raise AssertionError(f"{target}: no answer within {HANG}s for {len(data)} bytes")
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"{target}: the parser process died ({proc.returncode}): {err[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = Worker(tmp_path_factory.mktemp("limits"))
    yield w
    w.close()


def check(answer: dict[str, Any], data: bytes, allowed: tuple[str, ...]) -> None:
    assert answer["outcome"] in ("ok", *allowed), answer
    assert answer["peak"] <= PEAK_BASE + PEAK_PER_BYTE * len(data), (answer["peak"], len(data))
    assert len(answer["message"]) <= MAX_MESSAGE, answer["message"][:300]


# --- shapes ---------------------------------------------------------------------------------------


@st.composite
def yaml_payloads(draw: st.DrawFn) -> str:
    """A YAML value, one line or an indented block (written for a mapping value at indent 2)."""
    kind = draw(st.sampled_from(["flow", "block", "compact", "bomb", "wide", "dups", "scalar", "merge"]))
    n = draw(st.integers(0, 3000))
    if kind == "flow":
        opener = draw(st.sampled_from(["[", "{a: ", "[{b: "]))
        closer = {"[": "]", "{a: ": "}", "[{b: ": "}]"}[opener]
        closed = draw(st.booleans())
        return opener * n + "x" + (closer * n if closed else "")
    if kind == "block":
        return "\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(min(n, 400))) + "  " * (min(n, 400) + 1) + "v"
    if kind == "compact":
        return "\n  " + "- " * n + "x"
    if kind == "bomb":
        levels, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        items = "[" + ", ".join(["&a0 lol"] + ["lol"] * (width - 1)) + "]"
        parts = [items]
        for i in range(1, levels):
            parts.append(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
        return "[" + ", ".join(parts) + "]"
    if kind == "wide":
        return "[" + "0, " * min(n * 20, 60_000) + "0]"
    if kind == "dups":
        keys = draw(st.lists(st.sampled_from(["a", "b", "'a'", '"b"', "1", "0x1", "<<"]), max_size=8))
        return "{" + ", ".join(f"{k}: {i}" for i, k in enumerate(keys)) + "}"
    if kind == "merge":
        return "{<<: [" + ", ".join(["{x: 1}"] * min(n, 500)) + "]}"
    text = draw(st.text(max_size=200))
    return json.dumps(text)  # a double-quoted YAML scalar: any character, NUL included, escaped


config_keys = st.sampled_from(
    ["timeout", "timeouts", "env", "netns_template", "plugin", "state_dir", "max_output", "metrics_address"]
)


@SETTINGS
@given(payload=yaml_payloads(), suffix=st.sampled_from([".yaml", ".yml"]))
def test_manifests_of_any_shape_are_bounded(worker: Worker, payload: str, suffix: str) -> None:
    data = f"kind: Pod\nmetadata: {{name: p}}\nspec: {payload}\n".encode()
    check(worker.parse("manifest", data, suffix), data, ("HostError",))


@SETTINGS
@given(key=config_keys, payload=yaml_payloads(), raw=st.booleans())
def test_configs_of_any_shape_are_bounded(worker: Worker, key: str, payload: str, raw: bool) -> None:
    data = (payload if raw else f"{key}: {payload}\n").encode()
    check(worker.parse("config", data), data, ("ConfigError",))


@SETTINGS
@given(
    width=st.integers(0, 2_000_000_000),
    field=st.sampled_from(["infra_id", "infra_id!r", "infra_id.__class__", "0", "", "infra_id[0]"]),
    as_env=st.booleans(),
)
def test_netns_templates_are_checked_without_formatting(worker: Worker, width: int, field: str, as_env: bool) -> None:
    template = f"/run/netns/{{{field}:>{width}}}" if width else f"/run/netns/{{{field}}}"
    data = f"netns_template: {json.dumps(template)}\n".encode()
    answer = worker.parse("config", data)
    check(answer, data, ("ConfigError",))
    assert (answer["outcome"] == "ok") == (template == "/run/netns/{infra_id}"), answer


@st.composite
def json_payloads(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["deep", "wide", "dups", "string", "number"]))
    n = draw(st.integers(0, 5000))
    if kind == "deep":
        opener = draw(st.sampled_from(["[", '{"a":']))
        return opener * n + "1" + ("]" if opener == "[" else "}") * n
    if kind == "wide":
        return "[" + "0," * (n * 20) + "0]"
    if kind == "dups":
        return "{" + ",".join(f'"{k}":{i}' for i, k in enumerate(draw(st.lists(st.sampled_from("ab"))))) + "}"
    if kind == "number":
        return draw(st.sampled_from(["1" * 5000, "1e999", "-0", "1" * 100]))
    return json.dumps(draw(st.text(max_size=100)))  # NUL and every other character, escaped


@SETTINGS
@given(
    key=st.sampled_from(["plugin", "logFile", "configFile", "stateDir", "env", "netplugin", "defaultNamespace", "x"]),
    payload=json_payloads(),
    whole=st.booleans(),
)
def test_cni_configs_of_any_shape_are_bounded(worker: Worker, key: str, payload: str, whole: bool) -> None:
    head = '{"cniVersion": "1.0.0", "name": "n", "plugin": "p", '
    data = (payload if whole else head + json.dumps(key) + ": " + payload + "}").encode()
    check(worker.parse("cni", data), data, ("CniError", "ConfigError", "InvalidArgument"))


env_text = st.one_of(
    st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=50),
    st.integers(0, 100_000).map(lambda n: "a" * n),
    st.integers(0, 20_000).map(lambda n: "K=V;" * n),
    st.integers(0, 20_000).map(lambda n: ";=" * n),
)


@SETTINGS
@given(
    env=st.fixed_dictionaries(
        {"CNI_COMMAND": st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "add"])},
        optional={k: env_text for k in ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_ARGS", "CNI_NETNS", "CNI_PATH")},
    )
)
def test_cni_environments_of_any_shape_are_bounded(worker: Worker, env: dict[str, str]) -> None:
    data = json.dumps(env).encode()
    check(worker.parse("cni_env", data), data, ("CniError", "ConfigError", "InvalidArgument"))
