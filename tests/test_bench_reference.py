"""The bench's reference contender A: CNI v1.10 from the peer build, else Debian's 1.1.1 said as a fallback,
and the version the report names read from the plugin binary itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gopeers import require

REPO = Path(__file__).resolve().parent.parent
_PROBE = """
import json
from bench import contenders as c
from bench.report import evaluate_targets
print(json.dumps({"dir": c.cni_dir("A"), "fallback": c.a_is_fallback(), "version": c.reference_version("A"),
                  "label": c.CONTENDERS["A"], "target": evaluate_targets([])[0].text}))
"""


def _probe(peers: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env["PYTHONPATH"] = str(REPO)
    if peers is not None:
        env["NETPLUGIN_PEERS"] = peers
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout)
    return out


@pytest.mark.parametrize("peers", [None, "/nonexistent-peers"])
def test_without_the_peer_build_a_is_debians_plugins_and_says_so(peers: str | None) -> None:
    got = _probe(peers)
    assert got["dir"] == "/usr/lib/cni" and got["fallback"] is True
    assert str(got["label"]).startswith("CNI bridge + host-local 1.1.1") and "fallback" in str(got["label"])
    assert "A (CNI " in str(got["target"])


def test_with_the_peer_build_a_is_v1_10_and_the_targets_name_it() -> None:
    got = _probe(str(require("cni/bridge", "cni/host-local")))
    assert got["fallback"] is False and str(got["dir"]).endswith("/cni")
    assert str(got["version"]).startswith("v1.10.")
    assert "v1.10" in str(got["label"])
    assert f"A (CNI {got['version']})'s ADD median" in str(got["target"])
