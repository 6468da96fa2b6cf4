"""Hypothesis: the CNI environment and prevResult parsers (issue 21, class 8).

Whatever a runtime (or anyone who can reach the daemon's socket) sends, :func:`parse_request`
either returns a request every later step can use, or raises CniError with a documented code;
never anything else. What it accepts, the rest of the call can handle: an accepted interface name
is one the kernel takes (printable ASCII, at most 15 bytes), an accepted ``prevResult`` is one
:func:`make_result` extends without error. A DEL whose interface name ADD would refuse is marked
refused (it succeeds without running anything).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netplugin.frontends.cni.result import make_result
from netplugin.frontends.cni.spec import CniError, parse_request
from netplugin.frontends.daemon.cnicalls import environ_problem

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CODES = {1, 4, 6, 7}

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
ifnames = st.one_of(text, st.text(string.printable, max_size=20), st.sampled_from(["eth0", "net1", "é", "e" * 16]))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
ip_entries = st.fixed_dictionaries(
    {"address": st.one_of(st.sampled_from(["10.1.2.3/24", "fd00::1/64", "10.1.2.3/33", "x"]), json_values)},
    optional={"interface": st.one_of(st.integers(-2, 3), json_values), "gateway": json_values},
)
prev_results = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"ips": st.one_of(st.lists(ip_entries, max_size=3), json_values),
                                        "interfaces": st.one_of(st.lists(json_values, max_size=3), json_values),
                                        "routes": json_values, "dns": json_values}),
)


@SETTINGS
@given(command=st.sampled_from(["ADD", "DEL", "CHECK"]), ifname=ifnames, container=text, args=text)
def test_parse_request_accepts_only_what_the_kernel_takes(tmp_path: Path, command: str, ifname: str, container: str,
                                                         args: str) -> None:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container or "c0ffee", "CNI_IFNAME": ifname,
           "CNI_NETNS": str(tmp_path), "CNI_ARGS": args}
    stdin = json.dumps({"cniVersion": "1.0.0", "name": "net"}).encode()
    try:
        req = parse_request(env, stdin)
    except CniError as e:
        assert e.code in CODES
        return
    raw = ifname.encode()
    valid = 0 < len(raw) <= 15 and all(0x21 <= b <= 0x7E for b in raw) and "/" not in ifname \
        and ":" not in ifname and ifname not in (".", "..")
    assert valid or (command == "DEL" and req.refused), (ifname, req)
    if valid:
        assert not req.refused


@SETTINGS
@given(prev=prev_results)
def test_an_accepted_prev_result_is_one_make_result_extends(tmp_path: Path, prev: Any) -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c0ffee", "CNI_IFNAME": "eth0", "CNI_NETNS": str(tmp_path)}
    stdin = json.dumps({"cniVersion": "1.0.0", "name": "net", "prevResult": prev}).encode()
    try:
        req = parse_request(env, stdin)
    except CniError as e:
        assert e.code == 7 and "prevResult" in e.msg
        return
    out = make_result("1.0.0", "eth0", str(tmp_path), "10.201.5.7", {}, req.conf["prevResult"])
    assert out["ips"][-1]["address"] == "10.201.5.7/32"
    json.dumps(out)


@SETTINGS
@given(environ=st.dictionaries(text, text, max_size=5))
def test_environ_problem_refuses_every_key_a_process_cannot_carry(environ: dict[str, str]) -> None:
    problem = environ_problem(environ)
    bad = [k for k, v in environ.items()
           if not k or "=" in k or not (k[0].isascii() and (k[0].isalpha() or k[0] == "_"))
           or not all(c.isascii() and (c.isalnum() or c == "_") for c in k) or "\0" in v]
    assert (problem is None) == (not bad), (environ, problem)
