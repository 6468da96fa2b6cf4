"""``netplugin demo --chain``: two pods through the chain
[bridge, bandwidth], one shaped and one not, real transfers measured, nothing left behind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from netplugin.frontends.lab.demo_chain import INGRESS, LIMITS, run_chain_demo

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("first", ["bridge", "netplugin.io/bridge"])
def test_the_chain_demo_shapes_one_pod_and_not_the_other(first: str) -> None:
    lines: list[str] = []
    report = run_chain_demo(first=first, progress=lines.append)
    assert report.ok, report.to_dict()
    assert [t.limit_bps for t in report.transfers] == [LIMITS[INGRESS][1], 10e6, None, None]
    shaped_in, unshaped_in = report.transfers[0].measured_bps, report.transfers[2].measured_bps
    assert unshaped_in > 5 * shaped_in
    assert any("Mbit/s" in line and "into shaped" in line for line in lines)
    assert lines[-1].startswith("nothing left behind")


def test_netplugin_demo_chain_prints_the_rates_and_reports_json(run_cli: Any) -> None:
    r = run_cli("demo", "--chain", "--native", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "into shaped (plain -> shaped)" in r.stdout and "Mbit/s" in r.stdout
    doc = json.loads(run_cli("-o", "json", "demo", "--chain", timeout=300).stdout)
    assert doc["ok"] is True and doc["chain"] == ["bridge", "bandwidth"]
    assert [t["limit_bps"] for t in doc["transfers"]] == [20e6, 10e6, None, None]
