"""``netplugin demo --chain`` (the library half, until the CLI option lands): two pods through the chain
[bridge, bandwidth], one shaped and one not, real transfers measured, nothing left behind."""

from __future__ import annotations

import pytest

from netplugin.frontends.demo_chain import INGRESS, LIMITS, run_chain_demo

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
