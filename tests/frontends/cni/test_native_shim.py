"""The compiled netplugin-cni against a real daemon: same answers as the Python shim, and its fallbacks.

The shim is built as installed (warnings as errors, hardening flags) with the Python shim's entry
script as its fallback, and a second time for cluster mode (no fallback: CNI error 11).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netplugin.frontends.cni.native import build_native, install_built, slots
from tests.frontends.cni.daemonworld import REPO, World

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def _call(
    world: World, shim: Path, command: str, conf: dict[str, Any], **env: str
) -> subprocess.CompletedProcess[bytes]:
    # NETPLUGIN_SOCKET: the compiled shim reads no conflist (the Python shim finds it from runDir).
    done: subprocess.CompletedProcess[bytes] = world.shim(
        command, conf, argv=[str(shim)], NETPLUGIN_SOCKET=world.socket, **env
    )
    return done


def _same(a: subprocess.CompletedProcess[bytes], b: subprocess.CompletedProcess[bytes]) -> None:
    assert (a.returncode, a.stdout) == (b.returncode, b.stdout), (a, b)


def test_add_check_del_version_through_the_daemon_match_the_python_shim(
    world: World, fake: Any, shims: dict[str, Path]
) -> None:
    world.start_daemon()
    add = _call(world, shims["native"], "ADD", world.conf())
    assert add.returncode == 0, add
    assert json.loads(add.stdout)["ips"] == [{"address": "10.201.5.7/24", "gateway": "10.201.5.1", "interface": 0}]
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "daemon"
    check_conf = world.conf(prevResult=json.loads(add.stdout))
    check = _call(world, shims["native"], "CHECK", check_conf)
    _same(check, _call(world, shims["python"], "CHECK", check_conf))
    assert check.returncode == 0 and check.stdout == b""
    version = _call(world, shims["native"], "VERSION", {"cniVersion": "1.0.0"})
    _same(version, _call(world, shims["python"], "VERSION", {"cniVersion": "1.0.0"}))
    assert json.loads(version.stdout)["cniVersion"] == "1.0.0"
    delete = _call(world, shims["native"], "DEL", world.conf())
    assert (delete.returncode, delete.stdout) == (0, b""), delete
    assert fake.env_of("teardown")["NP_TEST_ORIGIN"] == "daemon"
    assert list((Path(world.state_dir) / "pods").glob("*.json")) == []
    # The daemon writes the logFile line for the compiled shim, which parses no JSON.
    vias = [(e["command"], e["via"]) for e in world.log_entries()]
    assert vias == [("ADD", "daemon"), ("CHECK", "daemon"), ("CHECK", "daemon"), ("DEL", "daemon")], vias


def test_errors_keep_the_python_shims_codes_and_messages(world: World, fake: Any, shims: dict[str, Path]) -> None:
    fake.set("setup", exit=1, stderr="np: the moon is full")
    bad_key = world.conf(netplugin={"timeouts": {"setup": "soon"}})
    cases: list[tuple[str, Any, dict[str, str]]] = [
        ("ADD", world.conf(), {}),
        ("ADD", bad_key, {}),
        ("STATUS", bad_key, {}),
        ("ADD", world.conf(), {"CNI_ARGS": "K8S_POD_NAMESPACE=Bad_NS"}),
        ("CHECK", world.conf(), {}),  # no prevResult
        ("ADD", world.conf(cniVersion="9.9.9"), {}),
    ]
    world.start_daemon()
    for command, conf, env in cases:
        native = _call(world, shims["native"], command, conf, **env)
        python = _call(world, shims["python"], command, conf, **env)
        _same(native, python)
        assert native.returncode == 1 and json.loads(native.stdout)["code"] in (1, 4, 7, 999), native
    not_object = _call(world, shims["native"], "ADD", "a string")  # type: ignore[arg-type]
    _same(not_object, _call(world, shims["python"], "ADD", "a string"))  # type: ignore[arg-type]
    assert not_object.returncode == 1 and json.loads(not_object.stdout)["code"] == 6, not_object
    assert {e["via"] for e in world.log_entries()} == {"daemon"}


def test_without_a_daemon_it_execs_the_python_shim_or_says_try_again(
    world: World, fake: Any, shims: dict[str, Path]
) -> None:
    add = _call(world, shims["native"], "ADD", world.conf())
    assert add.returncode == 0, add
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "shim"  # the Python shim ran it, with the same env
    assert [e["via"] for e in world.log_entries()] == ["local"]
    cluster = _call(world, shims["cluster"], "DEL", world.conf())
    err = json.loads(cluster.stdout)
    assert cluster.returncode == 1 and err["code"] == 11, cluster
    assert "required (cluster mode) but unavailable" in err["msg"] and world.socket in err["msg"]
    version = _call(world, shims["cluster"], "VERSION", {"cniVersion": "1.0.0"})
    assert version.returncode == 0 and json.loads(version.stdout)["supportedVersions"][-1] == "1.1.0"


def test_a_call_the_daemon_refuses_falls_back_with_the_same_stdin(
    world: World, fake: Any, shims: dict[str, Path]
) -> None:
    world.start_daemon()
    other = world.conf(env={"NETPLUGIN_BRIDGE_SUBNET": "10.201.6.0/24"})
    add = _call(world, shims["native"], "ADD", other)
    assert add.returncode == 0, add
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "shim"
    assert fake.env_of("setup")["NETPLUGIN_BRIDGE_SUBNET"] == "10.201.6.0/24"  # stdin replayed whole
    refused = _call(world, shims["cluster"], "DEL", other)
    err = json.loads(refused.stdout)
    assert refused.returncode == 1 and err["code"] == 11 and "differ" in err["msg"], err
    never = _call(world, shims["native"], "DEL", world.conf(), NETPLUGIN_USE_DAEMON="never")
    assert never.returncode == 0 and fake.env_of("teardown")["NP_TEST_ORIGIN"] == "shim"


def test_a_build_installed_elsewhere_finds_the_daemon_by_its_slot(
    world: World, fake: Any, shims: dict[str, Path], tmp_path: Path
) -> None:
    # One build (the image's: default socket, no fallback), installed with this node's socket.
    installed = Path(install_built(str(shims["cluster"]), str(tmp_path / "netplugin-cni"), socket=world.socket))
    assert slots(str(installed)) == {"socket": world.socket, "fallback": ""}
    world.start_daemon()
    add = world.shim("ADD", world.conf(), argv=[str(installed)])  # no NETPLUGIN_SOCKET: the slot's
    assert add.returncode == 0, add
    assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "daemon"


@pytest.mark.parametrize(
    ("built", "value", "message"),
    [
        pytest.param("/bin/sh", {}, "not a compiled netplugin-cni", id="not-ours"),
        pytest.param(None, {"socket": "/run/" + "x" * 300}, "longer than its slot", id="socket-too-long"),
        pytest.param(None, {"fallback": 'a"b'}, "must not contain quotes", id="fallback-quote"),
    ],
)
def test_install_built_refuses_what_does_not_fit(
    shims: dict[str, Path], tmp_path: Path, built: str | None, value: dict[str, str], message: str
) -> None:
    dest = tmp_path / "netplugin-cni"
    with pytest.raises(ValueError, match=message):
        install_built(built or str(shims["cluster"]), str(dest), **value)
    assert not dest.exists()


def _interpreter(path: Path) -> bytes | None:
    """The ELF's PT_INTERP (its dynamic loader), or None for a static binary."""
    import struct

    data = path.read_bytes()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, size = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if kind == 3:  # PT_INTERP
            return data[offset : offset + size].rstrip(b"\0")
    return None


@pytest.mark.parametrize(
    ("libc_a", "interpreter"),
    [pytest.param(True, False, id="static-pie"), pytest.param(False, True, id="no-libc.a-dynamic")],
)
def test_the_shim_is_a_static_pie_unless_the_toolchain_cannot_link_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, libc_a: bool, interpreter: bool
) -> None:
    if not libc_a:  # a compiler whose static libc is missing: the static link fails as it would
        cc = tmp_path / "cc"
        cc.write_text('#!/bin/sh\ncase " $* " in *" -static-pie "*) echo "cannot find -lc" >&2; exit 1;; esac\n'
                      'exec cc "$@"\n')
        cc.chmod(0o755)
        monkeypatch.setenv("CC", str(cc))
    shim = Path(build_native(str(tmp_path / "netplugin-cni"), fallback=""))
    assert (_interpreter(shim) is not None) is interpreter
    done = subprocess.run([str(shim)], env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=20)
    assert done.returncode == 0 and "supportedVersions" in json.loads(done.stdout)


@pytest.mark.parametrize(
    ("env", "extra", "native", "fallback"),
    [
        ({}, [], True, "python"),
        ({"CC": "/nonexistent/cc"}, [], False, ""),
        ({"CC": "/nonexistent/cc"}, ["--native-shim", "BUILT", "--shim-fallback", "none"], True, ""),
    ],
    ids=["compiler", "no-compiler", "prebuilt-cluster"],
)
def test_install_sh_installs_the_compiled_shim_or_says_why_not(
    tmp_path: Path, shims: dict[str, Path], env: dict[str, str], extra: list[str], native: bool, fallback: str
) -> None:
    cni_bin = tmp_path / "cni-bin"
    full = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    full.update(env)
    args = [
        "--no-venv",
        "--python",
        os.path.realpath(sys.executable),
        "--exec-dir",
        str(tmp_path / "exec"),
        "--cni-bin-dir",
        str(cni_bin),
        "--cni-conf-dir",
        str(tmp_path / "conf"),
        "--run-dir",
        "/run/np-test",
        "--lib-dir",
        str(tmp_path / "lib"),
        # never the machine's /etc/netplugin or /var/lib/netplugin
        "--config",
        str(tmp_path / "etc" / "netplugin.yaml"),
        "--state-dir",
        str(tmp_path / "state"),
        *(str(shims["cluster"]) if a == "BUILT" else a for a in extra),
    ]
    done = subprocess.run(["/bin/bash", str(REPO / "scripts" / "install.sh"), *args], capture_output=True, text=True,
                          env=full, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert done.returncode == 0, done.stderr
    shim = (cni_bin / "netplugin-cni").read_bytes()
    assert shim.startswith(b"\x7fELF") is native
    assert (cni_bin / "netplugin-cni-python").exists() is native
    assert ("no compiled shim" in done.stderr) is not native
    if native:  # the socket and fallback in its slots, as install.sh was told
        python_shim = str(cni_bin / "netplugin-cni-python") if fallback == "python" else ""
        installed = slots(str(cni_bin / "netplugin-cni"))
        assert installed == {"socket": "/run/np-test/netplugin.sock", "fallback": python_shim}
        again = subprocess.run(["/bin/bash", str(REPO / "scripts" / "install.sh"), *args], capture_output=True,
                               text=True, env=full, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
        assert "install.sh: nothing to do" in again.stdout, again.stdout  # the build is reproducible


@pytest.mark.parametrize(
    ("bad", "code", "says"),
    [
        pytest.param(["--native-shim", "/bin/sh"], 1, "cannot install the compiled shim --native-shim", id="not-ours"),
        pytest.param(["--native-shim", "MISSING"], 2, "no such file", id="missing"),
        pytest.param(["--shim-fallback", "bash"], 2, "--shim-fallback must be python or none", id="bad-fallback"),
    ],
)
def test_install_sh_refuses_a_native_shim_that_is_not_one(tmp_path: Path, bad: list[str], code: int, says: str) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    argv = ["/bin/bash", str(REPO / "scripts" / "install.sh"), "--no-venv"]
    argv += ["--python", os.path.realpath(sys.executable)]
    for flag in ("--exec-dir", "--cni-bin-dir", "--cni-conf-dir", "--lib-dir", "--state-dir", "--run-dir"):
        argv += [flag, str(tmp_path / flag.strip("-"))]
    argv += [str(tmp_path / "missing") if a == "MISSING" else a for a in bad]
    done = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == code and says in done.stderr, done.stderr
    assert not (tmp_path / "cni-bin-dir" / "netplugin-cni").exists()  # no shim installed at all


def test_version_is_answered_while_the_plugin_is_missing(world: World, shims: dict[str, Path]) -> None:
    world.start_daemon()  # its plugin, fake, is not installed
    assert world.health()["plugin_problem"]
    conf = {"cniVersion": "1.0.0", "name": "nptest", "type": "netplugin-cni", "runDir": world.run_dir}
    for shim in ("native", "cluster"):
        version = _call(world, shims[shim], "VERSION", conf)
        assert version.returncode == 0, version
        assert json.loads(version.stdout)["cniVersion"] == "1.0.0" and "1.1.0" in version.stdout.decode()
    assert world.health()["requests"] >= 3  # answered by the daemon, not by a fallback


def test_a_framed_call_runs_with_the_daemons_settings_not_the_file_on_disk(
    world: World, fake: Any, shims: dict[str, Path]
) -> None:
    world.start_daemon()
    world.config.write_text(world.config.read_text() + "plugn: x\n")  # edited, not reloaded
    for shim in ("native", "cluster"):
        add = _call(world, shims[shim], "ADD", world.conf())
        assert add.returncode == 0, add
        assert fake.env_of("setup")["NP_TEST_ORIGIN"] == "daemon"


@pytest.mark.parametrize("kind", ["native", "cluster"])
def test_the_shim_knows_the_version_it_was_built_from(shims: dict[str, Path], tmp_path: Path, kind: str) -> None:
    from netplugin import __version__
    from netplugin.frontends.cni.native import version_of

    shim = shims[kind]
    done = subprocess.run([str(shim), "--version"], env={}, capture_output=True, timeout=20)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"netplugin-cni {__version__}\n".encode(), b"")
    assert version_of(str(shim)) == __version__
    # An installed copy (its slots rewritten) keeps it, and `netplugin version` reads it without running it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install_built(str(shim), str(bin_dir / "netplugin-cni"), socket="/run/np-elsewhere/netplugin.sock")
    env = {**os.environ, "PYTHONPATH": str(REPO), "NETPLUGIN_USE_DAEMON": "never"}
    r = subprocess.run([sys.executable, "-m", "netplugin", "version", "--cni-bin-dir", str(bin_dir), "-o", "json"],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["shim"] == {
        "path": str(bin_dir / "netplugin-cni"), "kind": "compiled", "version": __version__, "problem": None,
    }  # fmt: skip
    # The argument is no CNI call: without it the binary still answers CNI VERSION.
    cni = subprocess.run([str(shim)], env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=20)
    assert cni.returncode == 0 and "supportedVersions" in json.loads(cni.stdout)
