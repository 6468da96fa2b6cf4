"""The Kubernetes exec plugin tests (exec_test.go, plugins_test.go), through the library and the CLI.

Namespaces and pod names are DNS-1123 names in real Kubernetes, so the original
``podNamespace``/``podName`` become ``pod-namespace``/``pod-name`` here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from netplugin.core.errors import PluginInvalid, PluginNotFound
from netplugin.core.names import PodRef
from netplugin.core.plugin import NOOP_NAME

POD = ("pod-namespace", "pod-name", "dockerid2345")


class LibDriver:
    """Drives the library API; errors surface as exception class names."""

    def __init__(self, make_manager: Any) -> None:
        self.make = make_manager

    def select(self, name: str | None) -> tuple[str | None, str | None]:
        try:
            return self.make(plugin=name).plugin.name, None
        except (PluginNotFound, PluginInvalid) as e:
            return None, type(e).__name__

    def action(self, name: str, action: str, pod: tuple[str, str, str]) -> tuple[Any, str | None]:
        m = self.make(plugin=name)
        return getattr(m, action)(PodRef(*pod)), None


class CliDriver:
    """Drives the real ``netplugin`` CLI; errors surface as the documented exit codes."""

    def __init__(self, run_cli: Any) -> None:
        self.run = run_cli

    def _args(self, name: str | None) -> list[str]:
        return ["--plugin", name] if name else []

    def select(self, name: str | None) -> tuple[str | None, str | None]:
        r = self.run(*self._args(name), "-o", "json", "init")
        if r.returncode == 0:
            return json.loads(r.stdout)["plugin"], None
        assert r.returncode == 3, r.stderr
        assert "network plugin" in r.stderr
        return None, "PluginNotFound" if "not found" in r.stderr else "PluginInvalid"

    def action(self, name: str, action: str, pod: tuple[str, str, str]) -> tuple[Any, str | None]:
        r = self.run(*self._args(name), "-o", "json", action, *pod)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), None


@pytest.fixture(params=["lib", "cli"])
def driver(request: pytest.FixtureRequest, make_manager: Any, run_cli: Any) -> Any:
    return LibDriver(make_manager) if request.param == "lib" else CliDriver(run_cli)


@pytest.mark.parametrize(
    ("installed", "selected", "expect_name", "expect_error"),
    [
        pytest.param("test1", "test1", "test1", None, id="select-plugin"),
        pytest.param("mycompany/test2", "mycompany/test2", "mycompany/test2", None, id="select-vendored"),
        pytest.param("test3", "abcd", None, "PluginNotFound", id="select-wrong-plugin"),
        pytest.param(None, None, NOOP_NAME, None, id="select-default-no-op"),
    ],
)
def test_select(driver: Any, plugin_dir: Any, installed: str | None, selected: str | None,
                expect_name: str | None, expect_error: str | None) -> None:
    if installed:
        plugin_dir.install(installed)
    name, err = driver.select(selected)
    assert name == expect_name
    assert err == expect_error


def test_non_executable_plugin_is_refused(driver: Any, plugin_dir: Any) -> None:
    p = plugin_dir.install("test4", mode=0o444)
    name, err = driver.select("test4")
    assert (name, err) == (None, "PluginInvalid")
    assert p.calls() == []  # nothing ran


@pytest.mark.parametrize("action", ["setup", "teardown", "status"])
def test_hooks_receive_exact_argv(driver: Any, plugin_dir: Any, action: str) -> None:
    p = plugin_dir.install("test5")
    driver.action("test5", action, POD)
    # init runs first, exactly once, then the hook with the exact kubelet argv
    assert p.calls() == ["init", f"{action} pod-namespace pod-name dockerid2345"]


@pytest.mark.parametrize("ip", ["10.20.30.40", "fe80::e2cb:4eff:fef9:6710"])
def test_status_reports_ip(driver: Any, plugin_dir: Any, ip: str) -> None:
    p = plugin_dir.install("test6")
    p.set("status", stdout=json.dumps({"ip": ip}))
    result, _ = driver.action("test6", "status", ("namespace", "name", "dockerid2345"))
    got = result.ip if hasattr(result, "ip") else result["ip"]
    assert got == ip
    assert p.calls()[-1] == "status namespace name dockerid2345"


def test_no_op_plugin_does_nothing_and_has_no_status(driver: Any) -> None:
    result, _ = driver.action(NOOP_NAME, "status", POD)
    assert result is None
