"""What an operator used to kubectl expects: global options anywhere, -o yaml/wide, tables with
headers, "No pods", `netplugin version`, help with examples and whole-sentence summaries."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

import netplugin
from netplugin.frontends.cli.app import COMMANDS

POD = ("default", "web-0", "infra0")


@pytest.mark.parametrize(
    ("args", "expect_in_stdout"),
    [
        pytest.param(["plugins", "--plugin-dir", "{tmp}/nowhere"], "kubernetes.io/no-op", id="plugins --plugin-dir"),
        pytest.param(["pods", "--state-dir", "{tmp}/empty"], "No pods", id="pods --state-dir"),
        pytest.param(["init", "-v"], "", id="init -v"),
        pytest.param(["version", "--log-level", "error"], "netplugin ", id="version --log-level"),
    ],
)
def test_global_options_after_the_command(run_cli: Any, tmp_path: Any, args: list[str], expect_in_stdout: str) -> None:
    r = run_cli(*[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 0, r.stderr
    assert expect_in_stdout in r.stdout


def test_doctor_takes_the_global_config_after_the_command(run_cli: Any, tmp_path: Any) -> None:
    missing = tmp_path / "no-such.yaml"
    # It is the global --config, in either place: the doctor reads it, and reports it missing.
    after = run_cli("doctor", "--config", str(missing))
    before = run_cli("--config", str(missing), "doctor")
    assert after.returncode == before.returncode == 7, after.stderr
    assert str(missing) in after.stdout and after.stdout == before.stdout


def test_global_option_after_setup_reaches_the_config(run_cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    r = run_cli("setup", *POD, "--plugin", "scripted", "-o", "json")
    assert r.returncode == 0, r.stderr
    listing = json.loads(run_cli("pods", "-o", "json").stdout)
    assert [p["plugin"] for p in listing["pods"]] == ["scripted"]


@pytest.mark.parametrize("command", [["pods"], ["plugins"], ["version"]])
def test_yaml_is_the_json_document(run_cli: Any, command: list[str]) -> None:
    as_json = run_cli(*command, "-o", "json")
    as_yaml = run_cli(*command, "-o", "yaml")
    assert as_json.returncode == as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_plugins_is_a_table_with_a_header_and_wide_shows_whole_problems(run_cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    plugin_dir.install("broken", mode=0o644)  # not executable
    text = run_cli("plugins").stdout.splitlines()
    assert text[0].split() == ["NAME", "STATUS", "PATH", "PROBLEM"]
    rows = {line.split()[0]: line.split()[1] for line in text[1:]}
    assert rows["scripted"] == "ok" and rows["broken"] == "INVALID" and rows["kubernetes.io/no-op"] == "ok"
    wide = run_cli("plugins", "-o", "wide").stdout
    [problem] = [c["problem"] for c in json.loads(run_cli("plugins", "-o", "json").stdout) if c["name"] == "broken"]
    assert problem in wide


def test_an_empty_pods_list_says_so(run_cli: Any) -> None:
    r = run_cli("pods")
    assert (r.returncode, r.stdout) == (0, "No pods\n")
    assert json.loads(run_cli("pods", "-o", "json").stdout)["pods"] == []


def test_version_names_cli_daemon_shim_and_chain(run_cli: Any, plugin_dir: Any, tmp_path: Any) -> None:
    plugin_dir.install("scripted")
    bin_dir = tmp_path / "cni-bin"
    bin_dir.mkdir()
    assert run_cli("install-shim", str(bin_dir)).returncode == 0
    r = run_cli("--plugin", "scripted", "version", "--cni-bin-dir", str(bin_dir), "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cli"]["version"] == netplugin.__version__
    assert doc["daemon"] is None  # use_daemon never: none asked
    assert doc["shim"] == {
        "path": str(bin_dir / "netplugin-cni"),
        "kind": "python",
        "version": netplugin.__version__,
        "problem": None,
    }
    assert [p["name"] for p in doc["chain"]] == ["scripted"] and doc["chain"][0]["version"]
    text = run_cli("--plugin", "scripted", "version", "--cni-bin-dir", str(bin_dir)).stdout
    assert text.startswith(f"netplugin {netplugin.__version__} ") and "daemon:  not running" in text


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_examples_and_a_whole_sentence_summary(run_cli: Any, command: str) -> None:
    r = run_cli(command, "--help")
    assert r.returncode == 0, r.stderr
    assert "\nExamples:\n" in r.stdout.replace("  Examples:", "Examples:")
    assert "before or after the command" in " ".join(r.stdout.split())  # the global options too
    top = run_cli("--help").stdout
    listed = re.search(rf"^  {re.escape(command)} +(.*?)(?=^  \S|\Z)", top, re.M | re.S)
    assert listed is not None, top
    summary = " ".join(listed.group(1).split())
    assert summary.endswith(".") and not summary.endswith("..."), summary
    assert summary[0].isupper(), summary


def _complete(run_cli: Any, words: str) -> list[str]:
    """What bash completion offers for the last word of ``words`` (click's bash_complete protocol)."""
    parts = words.split(" ")
    env = {"_NETPLUGIN_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}
    r = run_cli(env=env)
    assert r.returncode == 0, r.stderr
    return [line.split(",", 1)[1] for line in r.stdout.splitlines()]


def test_completion_of_pods_from_the_state_dir(run_cli: Any) -> None:
    for pod in (("default", "web-0", "aa11"), ("kube-system", "dns-1", "bb22"), ("kube-system", "dns-2", "cc33")):
        assert run_cli("setup", *pod).returncode == 0
    assert _complete(run_cli, "netplugin teardown k") == ["kube-system"]
    assert _complete(run_cli, "netplugin teardown kube-system ") == ["dns-1", "dns-2"]
    assert _complete(run_cli, "netplugin status kube-system dns-2 ") == ["cc33"]
    assert _complete(run_cli, "netplugin teardown default ") == ["web-0"]


def test_completion_of_plugin_names_before_and_after_the_command(run_cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    plugin_dir.install("broken", mode=0o644)  # invalid: not offered
    assert _complete(run_cli, "netplugin --plugin ") == [
        "kubernetes.io/no-op",
        "netplugin.io/bridge",
        "netplugin.io/hostport",
        "scripted",
    ]
    assert _complete(run_cli, "netplugin setup --plugin sc") == ["scripted"]


def test_pods_wide_adds_chain_members_host_veth_netns_and_age(run_cli: Any, plugin_dir: Any) -> None:
    plugin_dir.install("scripted")
    assert run_cli("setup", *POD, "--plugin", "scripted").returncode == 0
    plain = run_cli("pods").stdout.splitlines()
    wide = run_cli("pods", "-o", "wide").stdout.splitlines()
    assert plain[0].split() == ["NAMESPACE", "NAME", "INFRA-ID", "STATE", "IP", "PLUGIN", "UPDATED"]
    assert wide[0].split() == ["NAMESPACE", "NAME", "INFRA-ID", "STATE", "IP", "CHAIN", "HOST-VETH", "NETNS", "AGE"]
    [row] = [line.split() for line in wide[1:]]
    [record] = json.loads(run_cli("pods", "-o", "json").stdout)["pods"]
    assert row[:6] == [*POD, "ready", "-", "scripted:ready"]
    assert row[6:8] == ["-", record["netns"]]  # the scripted plugin reports no host interface
    assert re.fullmatch(r"[0-9]+s", row[8]), row


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (119, "119s"), (120, "2m"), (7199, "119m"), (7200, "2h"), (2 * 86400 + 5, "2d")],
)
def test_pod_age_is_printed_as_kubectl_prints_it(seconds: int, shown: str) -> None:
    from netplugin.store.listing import age

    created = "2026-11-28T01:00:00.000+00:00"
    start = 1_795_827_600.0  # that time, in seconds since the epoch
    assert age(created, start + seconds) == shown
