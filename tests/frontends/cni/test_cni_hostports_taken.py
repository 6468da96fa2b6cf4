"""A pod's port mappings must be taken by a member of the chain, or its ADD fails.

The runtime passes ``runtimeConfig.portMappings`` for a conflist declaring the capability (the
shipped one does). A chain with no member that declares ``hostports`` in its init mask (a hostport
member) would start the pod without its ports, and a second pod on the same port would not be
refused: the ADD fails instead, with CNI error 7 naming the missing member, before any member runs.
Real shim processes, the scriptable test plugin as the members (no kernel needed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

MAPS = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}, {"hostPort": 53, "containerPort": 53,
        "protocol": "udp"}]  # fmt: skip


def _conf(shim: Any, plugins: list[str], maps: list[dict[str, Any]] | None) -> dict[str, Any]:
    # the chain is the node's config file's (the conflist names its dirs only)
    Path(shim.base_env["NETPLUGIN_CONFIG"]).write_text(f"plugins: [{', '.join(plugins)}]\n")
    conf = shim.with_conf(plugin=None)
    if maps is not None:
        conf["runtimeConfig"] = {"portMappings": maps}
    return conf


@pytest.mark.parametrize(
    ("chain", "missing"),
    [
        pytest.param(["fake"], "netplugin.io/hostport", id="one-member"),
        pytest.param(["fake", "other"], "hostport", id="chain-without-hostport"),
    ],
)
def test_mappings_no_member_takes_fail_the_add_naming_the_missing_member(
    shim: Any, fake: Any, plugin_dir: Any, np_dirs: dict[str, str], chain: list[str], missing: str
) -> None:
    other = plugin_dir.install("other")
    err = shim.run("ADD", conf=_conf(shim, chain, MAPS)).error()
    assert err["code"] == 7, err
    assert "the hostport member is missing" in err["msg"] and missing in err["msg"], err
    assert "8080/tcp" in err["msg"] and "53/udp" in err["msg"], err
    assert not any(c.startswith("setup") for c in fake.calls() + other.calls()), "no member ran"
    assert not list(Path(np_dirs["state_dir"], "pods").glob("*.json")), "no pod record"


def test_a_member_declaring_hostports_takes_them(shim: Any, fake: Any, plugin_dir: Any) -> None:
    taker = plugin_dir.install("taker")
    taker.set("init", stdout=json.dumps({"actions": ["setup", "teardown", "hostports"]}))
    done = shim.run("ADD", conf=_conf(shim, ["fake", "taker"], MAPS))
    assert done.returncode == 0, done
    assert taker.env_of("setup")["NETPLUGIN_HOST_PORTS"] == "tcp/8080/80 udp/53/53"


def test_a_pod_without_mappings_needs_no_hostport_member(shim: Any, fake: Any) -> None:
    for maps in (None, []):
        done = shim.run("ADD", conf=_conf(shim, ["fake"], maps), container_id=f"c0ffee{len(maps or 'x')}")
        assert done.returncode == 0, done
