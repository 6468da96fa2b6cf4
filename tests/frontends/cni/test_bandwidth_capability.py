"""The CNI ``bandwidth`` capability (``runtimeConfig.bandwidth``) as the variables netplugin's chain gets."""

from __future__ import annotations

from typing import Any

import pytest

from netplugin.frontends.cni.netconf import bandwidth_env
from netplugin.frontends.cni.spec import E_CONFIG, CniError

R = "NETPLUGIN_BANDWIDTH_"


@pytest.mark.parametrize(
    ("runtime", "env"),
    [
        pytest.param(None, {}, id="no-runtimeConfig"),
        pytest.param({"portMappings": []}, {}, id="other-capability"),
        pytest.param({"bandwidth": {"ingressRate": 1000000, "ingressBurst": 80000, "egressRate": 2000000,
                                    "egressBurst": 160000}},
                     {R + "INGRESS_RATE": "1000000", R + "INGRESS_BURST": "80000", R + "EGRESS_RATE": "2000000",
                      R + "EGRESS_BURST": "160000"}, id="spec-spelling"),
        pytest.param({"bandwidth": {"IngressRate": 20000000, "IngressBurst": 4294967295}},
                     {R + "INGRESS_RATE": "20000000", R + "INGRESS_BURST": "4294967295"}, id="containerd-1.6-spelling"),
        pytest.param({"bandwidth": {"egressRate": 0, "ingressRate": 5000}}, {R + "INGRESS_RATE": "5000"},
                     id="zero-is-unset"),
    ],
)
def test_the_capability_becomes_the_chains_variables(runtime: Any, env: dict[str, str]) -> None:
    conf: dict[str, Any] = {"type": "netplugin-cni"}
    if runtime is not None:
        conf["runtimeConfig"] = runtime
    assert bandwidth_env(conf) == env


@pytest.mark.parametrize(
    ("bw", "words"),
    [
        ("10M", "runtimeConfig.bandwidth must be an object"),
        ({"ingressRate": "10M"}, "runtimeConfig.bandwidth.ingressRate must be a whole number of bits"),
        ({"egressRate": -1}, "runtimeConfig.bandwidth.egressRate must be a whole number"),
        ({"egressBurst": True}, "egressBurst"),
        ({"ingressRate": 1.5}, "ingressRate"),
    ],
)
def test_a_bad_capability_is_error_7_naming_the_key(bw: Any, words: str) -> None:
    with pytest.raises(CniError) as info:
        bandwidth_env({"runtimeConfig": {"bandwidth": bw}})
    assert info.value.code == E_CONFIG and words in info.value.msg
