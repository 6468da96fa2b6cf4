"""scripts/install.sh in its node-only mode (--no-venv: the DaemonSet's init container), run for real.

Every target directory is under tmp_path. The venv mode (the stock-Debian install) is tested in
test_stock_install.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install.sh"
CNI_CONFLIST = REPO / "etc" / "cni" / "10-netplugin.conflist"


# --- install.sh, for real ------------------------------------------------------------------------


def test_install_sh_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    out = subprocess.run(["shellcheck", str(INSTALL)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    assert os.access(INSTALL, os.X_OK)


def _install(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    full.update(env)
    return subprocess.run(
        ["bash", str(INSTALL), "--no-venv", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
        stdin=subprocess.DEVNULL,
    )


def _targets(tmp_path: Path) -> dict[str, Path]:
    return {
        "--exec-dir": tmp_path / "node" / "exec",
        "--cni-bin-dir": tmp_path / "node" / "cni-bin",
        "--cni-conf-dir": tmp_path / "node" / "cni-conf",
        # never the machine's /etc/netplugin
        "--config": tmp_path / "node" / "etc" / "netplugin.yaml",
    }


def _flags(targets: dict[str, Path]) -> list[str]:
    return [x for flag, path in targets.items() for x in (flag, str(path))]


def _tree_state(root: Path) -> dict[str, tuple[int, int, int]]:
    """relative path -> (mode, uid, mtime_ns) of everything under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_mtime_ns)
    return out


def _make_source(tmp_path: Path) -> Path:
    """A source tree with sloppy modes, the way a checkout under a lax umask looks."""
    src = tmp_path / "src"
    plugin = src / "exec_plugins" / "example.org~sloppy"
    (plugin / "lib").mkdir(parents=True)
    exe = plugin / "sloppy"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o775)
    (plugin / "README").write_text("docs\n")
    (plugin / "README").chmod(0o666)
    (plugin / "lib" / "helper.sh").write_text("true\n")
    plugin.chmod(0o777)
    (src / "exec_plugins" / "README.md").write_text("not a plugin\n")
    (src / "etc" / "cni").mkdir(parents=True)
    (src / "etc" / "cni" / "10-netplugin.conflist").write_text('{"cniVersion": "1.0.0", "name": "netplugin"}\n')
    pkg = src / "netplugin"
    (pkg / "frontends" / "cni").mkdir(parents=True)
    for init in (pkg, pkg / "frontends"):
        (init / "__init__.py").write_text("")
    # A stand-in shim: shows that the wrapper runs netplugin.frontends.cni:main with the runtime's env and argv.
    (pkg / "frontends" / "cni" / "__init__.py").write_text(
        "import json, os, sys\n"
        "def main():\n"
        "    print(json.dumps({'cmd': os.environ.get('CNI_COMMAND'), 'argv': sys.argv[1:],"
        " 'file': __file__, 'path0': sys.path[0]}))\n"
        "    return 0\n"
    )
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "cni.cpython-311.pyc").write_bytes(b"junk")
    return src


@pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership; run as root")
def test_install_sloppy_source_is_normalised_and_idempotent(tmp_path: Path) -> None:
    src = _make_source(tmp_path)
    targets = _targets(tmp_path)
    exec_dir, cni_bin, cni_conf, _ = targets.values()
    lib = tmp_path / "node" / "lib"
    # An earlier bad install left a world-writable exec dir behind: the installer must fix it.
    exec_dir.mkdir(parents=True)
    exec_dir.chmod(0o777)
    args = [*_flags(targets), "--source", str(src), "--python", sys.executable, "--lib-dir", str(lib)]
    first = _install(*args)
    assert first.returncode == 0, first.stderr

    plugin = exec_dir / "example.org~sloppy"
    expected_modes = {
        exec_dir: 0o755,
        plugin: 0o755,
        plugin / "sloppy": 0o755,
        plugin / "README": 0o644,
        plugin / "lib": 0o755,
        plugin / "lib" / "helper.sh": 0o644,
        cni_bin / "netplugin-cni": 0o755,
        cni_conf / "10-netplugin.conflist": 0o644,
        lib / "netplugin" / "frontends" / "cni" / "__init__.py": 0o644,
    }
    for path, mode in expected_modes.items():
        st = path.stat()
        assert stat.S_IMODE(st.st_mode) == mode, path
        assert (st.st_uid, st.st_gid) == (0, 0), path
    assert not (exec_dir / "README.md").exists()  # docs beside the plugins are not plugins
    assert not (lib / "netplugin" / "__pycache__").exists()
    # The source's conflist, as it was: it has no netplugin-cni entry to point at the config.
    assert json.loads((cni_conf / "10-netplugin.conflist").read_text()) == {"cniVersion": "1.0.0", "name": "netplugin"}
    assert not [p for p in (tmp_path / "node").rglob("*netplugin-tmp*")]

    # netplugin's own discovery accepts what was installed.
    from netplugin.core.discovery import scan

    [cand] = scan(str(exec_dir))
    assert (cand.name, cand.problem) == ("example.org/sloppy", None)

    # The wrapper runs the shim from --lib-dir with --python, passing argv and the CNI environment.
    out = subprocess.run(
        [str(cni_bin / "netplugin-cni"), "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "CNI_COMMAND": "VERSION"},
    )
    assert out.returncode == 0, out.stderr
    ran = json.loads(out.stdout)
    shim_file = str(lib / "netplugin" / "frontends" / "cni" / "__init__.py")
    assert ran == {"cmd": "VERSION", "argv": ["x"], "file": shim_file, "path0": str(lib)}
    # The modules the shim needs when it works alone come along, from the interpreter's site-packages.
    for module in ("click", "yaml", "psutil"):
        assert (lib / module / "__init__.py").is_file(), module

    # Second run: nothing to do, nothing touched.
    before = _tree_state(tmp_path / "node")
    second = _install(*args)
    assert second.returncode == 0, second.stderr
    assert "nothing to do" in second.stdout
    assert not [line for line in second.stdout.splitlines() if line.startswith(("install ", "create ", "fix "))]
    assert _tree_state(tmp_path / "node") == before

    # A file someone loosened is repaired on the next run.
    (plugin / "sloppy").chmod(0o777)
    third = _install(*args)
    assert f"install {plugin / 'sloppy'} (0755)" in third.stdout
    assert stat.S_IMODE((plugin / "sloppy").stat().st_mode) == 0o755


def test_install_dry_run_changes_nothing(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    out = _install(*_flags(targets), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "node").exists()
    assert f"would install {targets['--exec-dir']}/bridge/bridge (0755)" in out.stdout
    assert f"would install {targets['--cni-bin-dir']}/netplugin-cni (0755)" in out.stdout
    if CNI_CONFLIST.exists():
        assert f"would install {targets['--cni-conf-dir']}/10-netplugin.conflist (0644)" in out.stdout
    assert "dry run, nothing changed" in out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership; run as root")
def test_install_repo_plugins_pass_discovery(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    # Flags may also come from the environment (the DaemonSet could set them that way).
    out = _install(
        "--config",
        str(targets["--config"]),
        "--cni-bin-dir",
        str(targets["--cni-bin-dir"]),
        NETPLUGIN_PLUGIN_DIR=str(targets["--exec-dir"]),
        NETPLUGIN_CNI_CONF_DIR=str(targets["--cni-conf-dir"]),
    )
    assert out.returncode == 0, out.stderr
    from netplugin.core.discovery import scan

    shipped = sorted(p.name for p in (REPO / "exec_plugins").iterdir() if p.is_dir())
    cands = scan(str(targets["--exec-dir"]))
    assert sorted(os.path.basename(os.path.dirname(c.path)) for c in cands) == shipped
    assert [c.problem for c in cands] == [None] * len(shipped)
    # The compiled shim (gcc is a CI dependency), built from this tree; the Python shim beside it.
    assert (targets["--cni-bin-dir"] / "netplugin-cni").read_bytes().startswith(b"\x7fELF")
    wrapper = (targets["--cni-bin-dir"] / "netplugin-cni-python").read_text()
    assert "from netplugin.frontends.cni import main" in wrapper
    assert "PYTHONPATH" not in wrapper.replace("# ", "")  # no --lib-dir: the node's installed netplugin


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["--bogus"], "unknown argument: --bogus", id="unknown-flag"),
        pytest.param(["--exec-dir"], "--exec-dir needs a value", id="missing-value"),
        pytest.param(["--source", "/nonexistent"], "is not a netplugin source tree", id="bad-source"),
        pytest.param(["--python", "python3"], "--python must be an absolute path", id="relative-python"),
        pytest.param(["--lib-dir", "/opt/with space"], "--lib-dir must be an absolute path", id="unsafe-lib-dir"),
        pytest.param(["--state-dir", "var/lib"], "--state-dir must be an absolute path", id="relative-state-dir"),
        pytest.param(["--run-dir", '/run/"x'], "--run-dir must be an absolute path", id="quote-in-run-dir"),
        pytest.param(["--extras", "daemon;rm"], "--extras must be a comma-separated list", id="bad-extras"),
    ],
)
def test_install_usage_errors(tmp_path: Path, args: list[str], words: str) -> None:
    out = _install(*_flags(_targets(tmp_path)), *args)
    assert out.returncode == 2
    assert words in out.stderr
    assert not (tmp_path / "node").exists()


def test_install_refuses_symlinks(tmp_path: Path) -> None:
    src = _make_source(tmp_path)
    (src / "exec_plugins" / "example.org~sloppy" / "passwd").symlink_to("/etc/passwd")
    out = _install(*_flags(_targets(tmp_path)), "--source", str(src))
    assert out.returncode == 1
    assert "refusing symlink" in out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership; run as root")
def test_install_writes_one_config_and_a_conflist_that_only_names_it(tmp_path: Path) -> None:
    targets = _targets(tmp_path)
    state, run, config = tmp_path / "node" / "state", tmp_path / "node" / "run", targets["--config"]
    args = [*_flags(targets), "--state-dir", str(state), "--run-dir", str(run)]
    out = _install(*args)
    assert out.returncode == 0, out.stderr
    conf = json.loads((targets["--cni-conf-dir"] / "10-netplugin.conflist").read_text())
    [plugin] = [p for p in conf["plugins"] if p["type"] == "netplugin-cni"]
    # The conflist names the node's config file and the run dir, declares the portMappings
    # capability (the runtime passes hostPorts), and carries no setting.
    assert plugin == {"type": "netplugin-cni", "configFile": str(config), "runDir": str(run),
                      "capabilities": {"portMappings": True}}
    shipped = json.loads(CNI_CONFLIST.read_text())
    assert conf["name"] == shipped["name"] and conf["cniVersion"] == shipped["cniVersion"]
    assert set(shipped["plugins"][0]) == set(plugin)
    from netplugin.core.config import load_config

    cfg = load_config(str(config), environ={})
    assert (cfg.plugin_dir, cfg.state_dir, cfg.run_dir) == (str(targets["--exec-dir"]), str(state), str(run))
    example = load_config(str(REPO / "etc" / "netplugin.yaml"), environ={})
    assert (cfg.chain, dict(cfg.env)) == (example.chain, dict(example.env))  # the first run's defaults
    assert cfg.chain == ("bridge", "hostport")  # hostPorts work on a node installed with no options
    assert stat.S_IMODE(config.stat().st_mode) == 0o644

    # A user's own key survives every rerun; a rerun with other options says what it changes.
    config.write_text(config.read_text() + "record_status: true\n")
    before = config.read_text()
    again = _install(*args)
    assert "unchanged " + str(config) in again.stdout and config.read_text() == before
    other = [*args, "--plugin", "netplugin.io/bridge", "--plugin-env", "NETPLUGIN_BRIDGE_SUBNET=node"]
    dry = _install(*other, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would change {config} (0644):" in dry.stdout
    assert '  plugins: ["bridge", "hostport"] -> (unset)' in dry.stdout
    assert '  plugin: (unset) -> "netplugin.io/bridge"' in dry.stdout
    assert '  env.NETPLUGIN_BRIDGE_SUBNET: "10.244.0.0/24" -> "node"' in dry.stdout
    assert config.read_text() == before
    changed = _install(*other)
    assert changed.returncode == 0, changed.stderr
    assert f"change {config} (0644):" in changed.stdout
    cfg = load_config(str(config), environ={})
    assert (cfg.plugin, dict(cfg.env), cfg.record_status) == (
        "netplugin.io/bridge",
        {"NETPLUGIN_BRIDGE_SUBNET": "node"},
        True,
    )
    assert "nothing to do" in _install(*other).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="checks root ownership; run as root")
@pytest.mark.parametrize(
    ("extra", "chain"),
    [
        pytest.param(
            ["--plugins", "netplugin.io/bridge,netplugin.io/hostport"],
            ("netplugin.io/bridge", "netplugin.io/hostport"),
            id="plugins-list",
        ),
        pytest.param(
            ["--plugin", "bridge", "--plugin", "hostport", "--plugin", "bandwidth"],
            ("bridge", "hostport", "bandwidth"),
            id="plugin-repeated",
        ),
        pytest.param(["--plugin", "bridge", "--plugins", "hostport"], ("bridge", "hostport"), id="both-in-order"),
        pytest.param(["--plugins", "netplugin.io/bridge"], ("netplugin.io/bridge",), id="one"),
    ],
)
def test_install_sets_the_chain(tmp_path: Path, extra: list[str], chain: tuple[str, ...]) -> None:
    targets = _targets(tmp_path)
    out = _install(*_flags(targets), *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    from netplugin.core.config import load_config

    assert load_config(str(targets["--config"]), environ={}).chain == chain
    text = targets["--config"].read_text()
    assert (f"plugins: [{', '.join(chain)}]" if len(chain) > 1 else f"plugin: {chain[0]}") in text, text


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        pytest.param(["--plugin", "no such!"], "each member must be a plugin name (got 'no such!')", id="bad-plugin"),
        pytest.param(["--plugins", "bridge,,hostport"], "must be a plugin name (got '')", id="empty-member"),
        pytest.param(["--plugins", "bridge,"], "each member must be a plugin name (got '')", id="trailing-comma"),
        pytest.param(["--plugins", ""], "each member must be a plugin name (got '')", id="empty-list"),
        pytest.param(["--plugins", "bridge,x y"], "(got 'x y')", id="bad-name-in-list"),
        pytest.param(["--plugin", "bridge", "--plugins", "hostport,bridge"], "bridge is named twice", id="twice"),
        pytest.param(["--plugins", "bridge,hostport", "--config-from", "/etc/hostname"], "--config-from excludes",
                     id="plugins-and-config-from"),
        pytest.param(["--plugin-env", "1X=2"], "--plugin-env must be KEY=VALUE", id="bad-env-key"),
        pytest.param(["--plugin-env", "NOEQUALS"], "--plugin-env must be KEY=VALUE", id="env-without-value"),
        pytest.param(["--config", "etc/np.yaml"], "--config must be an absolute path", id="relative-config"),
        pytest.param(["--config-from", "/nonexistent.yaml"], "no such file", id="missing-config-from"),
    ],
)
def test_install_config_usage_errors(tmp_path: Path, extra: list[str], words: str) -> None:
    out = _install(*_flags(_targets(tmp_path)), *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in out.stderr
    assert not (tmp_path / "node").exists()


@pytest.mark.parametrize(
    ("extra", "config_text", "words"),
    [
        pytest.param(["--plugin", "brdge"], None, "network plugin 'brdge' not found", id="missing-plugin"),
        pytest.param([], "plugin: bridge\nplugn: x\n", "'plugn'", id="typo-in-config-from"),
        pytest.param([], "plugins: [bridge, gone]\n", "network plugin 'gone' not found", id="missing-member"),
    ],
)
def test_install_checks_the_config_before_it_writes_anything(
    tmp_path: Path, extra: list[str], config_text: str | None, words: str
) -> None:
    targets = _targets(tmp_path)
    state, run = tmp_path / "node" / "state", tmp_path / "node" / "run"
    if config_text is not None:
        src = tmp_path / "cm.yaml"
        dirs = f"plugin_dir: {targets['--exec-dir']}\nstate_dir: {state}\nrun_dir: {run}\n"
        src.write_text(dirs + config_text)
        extra = [*extra, "--config-from", str(src)]
    out = _install(*_flags(targets), "--state-dir", str(state), "--run-dir", str(run), *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in out.stderr and "nothing written" in out.stderr, out.stderr
    assert not (tmp_path / "node").exists()  # no file, no dir: not the plugins, not the shim


def test_install_refuses_a_config_from_with_other_dirs(tmp_path: Path) -> None:
    src = tmp_path / "cm.yaml"
    targets = _targets(tmp_path)
    src.write_text(f"plugin_dir: {targets['--exec-dir']}\nstate_dir: /somewhere/else\n")
    out = _install(*_flags(targets), "--config-from", str(src))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "state_dir" in out.stderr and "/somewhere/else" in out.stderr
    assert not targets["--config"].exists()


def test_install_venv_mode_refuses_lib_dir(tmp_path: Path) -> None:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    out = subprocess.run(
        ["bash", str(INSTALL), "--lib-dir", str(tmp_path / "lib"), "--prefix", str(tmp_path / "venv")],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
    )
    assert out.returncode == 2
    assert "--lib-dir is for --no-venv installs" in out.stderr
    assert list(tmp_path.iterdir()) == []
