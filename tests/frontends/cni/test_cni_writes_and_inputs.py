"""Issue 21, classes 8 and 9: CNI inputs refused before anything runs; temp files of dead writes removed.

* A malformed ``prevResult`` is code 7 before the plugin runs (it used to be a TypeError, 999,
  after the pod was set up and recorded), and the DEL that follows succeeds.
* A writer killed between creating its temp file and renaming it leaves ``<id>:eth0.json.tmp.P.T``
  (CNI attachment records) or ``.NAME.P.T.tmp`` / ``.NAME.P.tmp`` (the IPAMs): CNI GC and
  ``netplugin gc`` remove those whose writer is dead, and nothing else.
* ENOSPC: a tiny tmpfs mounted in the test's temp dir (unmounted by the fixture) fills up; a failed
  write leaves no temp or torn file and its message carries the errno's text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostworld import world  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "prev",
    [{"ips": 5}, {"ips": [5]}, {"ips": [{"address": 7}]}, {"ips": [{"address": "10.1.2.3/33"}]},
     {"interfaces": "eth0"}, {"ips": [{"address": "10.1.2.3/24", "interface": "0"}]}, [], {"dns": []}],
    ids=lambda p: json.dumps(p),
)
def test_a_malformed_prev_result_is_code_7_before_the_plugin_runs(shim: Any, fake: Any, np_dirs: dict[str, str],
                                                                   prev: Any) -> None:
    conf = shim.with_conf(prevResult=prev)
    err = shim.run("ADD", conf=conf).error()
    assert err["code"] == 7 and "prevResult" in err["msg"], err
    assert [c for c in fake.calls() if c != "init"] == []
    assert not list(Path(np_dirs["state_dir"]).glob("pods/*.json"))
    done = shim.run("DEL", conf=conf)
    assert done.returncode == 0, done


def test_a_well_formed_prev_result_still_chains(shim: Any, fake: Any) -> None:
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "lo"}], "ips": [{"address": "10.9.0.1/24", "interface": 0}]}
    done = shim.run("ADD", conf=shim.with_conf(prevResult=prev))
    assert done.returncode == 0, done
    assert [i["address"] for i in done.doc["ips"]] == ["10.9.0.1/24", "10.201.5.7/24"]


# --- temp files of writers that died ---------------------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _killed_writer_leaves(path: str) -> str:
    """A real writer SIGKILLed between creating its temp file and renaming it: the temp it leaves."""
    code = (
        "import os, signal, threading\n"
        "from netplugin.core import fileio\n"
        f"tmp = f'{path}.tmp.{{os.getpid()}}.{{threading.get_ident()}}'\n"
        "fd = fileio._create(tmp, 0o644); os.write(fd, b'{'); print(tmp, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -9, done
    return done.stdout.strip()


@pytest.mark.parametrize("by", ["cni GC", "netplugin gc"])
def test_temp_files_of_killed_writers_are_collected(shim: Any, fake: Any, np_dirs: dict[str, str], run_cli: Any,
                                                    by: str) -> None:
    assert shim.run("ADD").returncode == 0
    network = Path(np_dirs["state_dir"]) / "cni" / "nptest"
    record = network / "c0ffee0123456789abcdef:eth0.json"
    assert record.exists()
    torn = _killed_writer_leaves(str(network / "deadbeef:eth0.json"))
    dead = _dead_pid()
    ipam = Path(np_dirs["state_dir"]) / "bridge" / "npbr0" / "pods"
    ipam.mkdir(parents=True)
    stale = [ipam / f".infra1.{dead}.tmp", ipam / f".infra2.{dead}.140234567.tmp"]
    # Not temp files, or a live writer's: kept. An infra id may end like a temp name, without ':'.
    keep = [ipam / "x.json.tmp.1.2", ipam / f"infra9.json.tmp.{dead}.1", ipam / f".infra3.{os.getpid()}.tmp",
            network / f"live:eth0.json.tmp.{os.getpid()}.5"]
    for p in stale + keep:
        p.write_text("")
    if by == "cni GC":
        gc_conf = {**shim.conf, "cniVersion": "1.1.0",
                   "cni.dev/valid-attachments": [{"containerID": "c0ffee0123456789abcdef", "ifname": "eth0"}]}
        done = shim.run("GC", conf=gc_conf)
        assert done.returncode == 0, done
        gone = [Path(torn)]  # its own network's dir only
    else:
        r = run_cli("--plugin", "fake", "gc")
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("temporary file of an interrupted write") == 3, r.stdout
        gone = [Path(torn), *stale]
    assert [p for p in gone if p.exists()] == []
    assert all(p.exists() for p in keep) and record.exists()


# --- ENOSPC ------------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Any]:
    """tiny_fs(size) -> a tmpfs of that size mounted under tmp_path; unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        d = tmp_path / f"tiny{len(mounted)}"
        d.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)])


def _leave_pages(d: Path, pages: int) -> None:
    """Fill the tmpfs at ``d`` but ``pages`` pages."""
    st = os.statvfs(d)
    with open(d / "filler", "wb", buffering=0) as f:
        f.write(b"\0" * (st.f_bavail - pages) * st.f_frsize)
    assert os.statvfs(d).f_bavail == pages


def _temps(d: Path) -> list[str]:
    return sorted(str(p) for p in d.rglob("*") if ".tmp" in p.name)


def test_native_ipam_enospc_leaves_no_torn_address_file(tiny_fs: Any) -> None:
    import ipaddress

    from netplugin.plugins.bridge.ipam_files import IPAMError
    from netplugin.plugins.bridge.podipam import PodIPAM

    d = tiny_fs("size=64k")
    ipam = PodIPAM(str(d / "br"), [ipaddress.ip_network("10.201.9.0/24")], ["10.201.9.1"], lock_timeout=5)
    ipam.check()
    ipam.claim("first", "default", "a")
    # Exactly one page left: the pod record takes it, the address file's write meets ENOSPC.
    _leave_pages(d, 1)
    with pytest.raises(IPAMError) as exc:
        ipam.claim("second", "default", "b")
    assert "No space left on device" in str(exc.value)
    assert _temps(d) == []
    ips = sorted(os.listdir(d / "br" / "ips"))
    assert len(ips) == 1 and (d / "br" / "ips" / ips[0]).read_text() == "first\n"
    assert sorted(os.listdir(d / "br" / "pods")) == ["first"]


@pytest.mark.kernel
@pytest.mark.parametrize("exhausted", ["space", "inodes"])
def test_bash_ipam_enospc_names_the_errno_and_leaves_no_temp_file(world: Any, tiny_fs: Any,  # noqa: F811
                                                                   exhausted: str) -> None:
    from .test_podman import BRIDGE

    d = tiny_fs("size=64k,nr_inodes=64")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(NETPLUGIN_BRIDGE_NAME=f"npbr{world.tag}", NETPLUGIN_BRIDGE_SUBNET=world.bridge_subnet,
               NETPLUGIN_BRIDGE_STATE_DIR=str(d), NETPLUGIN_BRIDGE_IP_FORWARD="false",
               NETPLUGIN_BRIDGE_BR_NETFILTER="false")

    def plugin(*argv: str, netns: str = "") -> subprocess.CompletedProcess[bytes]:
        return world.run([str(BRIDGE), *argv], env=dict(env, NETPLUGIN_NETNS=netns), timeout=60)

    assert plugin("init").returncode == 0
    pods = [world.add_netns(f"np{world.tag}{i}") for i in (1, 2)]
    assert plugin("setup", "default", "a", "infra1", netns=pods[0]).returncode == 0
    if exhausted == "space":
        _leave_pages(d, 0)
    else:  # room for the pod record, none for the address file
        st = os.statvfs(d)
        used = st.f_files - st.f_ffree
        assert subprocess.run(["mount", "-o", f"remount,nr_inodes={used + 1}", str(d)]).returncode == 0
    done = plugin("setup", "default", "b", "infra2", netns=pods[1])
    err = done.stderr.decode()
    assert done.returncode == 1 and "No space left on device" in err, err
    assert "appeared while the lock was held" not in err
    assert _temps(d) == []
    ipam = d / f"npbr{world.tag}"
    assert sorted(os.listdir(ipam / "pods")) == ["infra1"] and len(os.listdir(ipam / "ips")) == 1
