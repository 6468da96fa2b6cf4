"""Hostile node, round 3: the config file is trusted like the exec dir, and never quotes a secret.

The config file chooses the exec dir and may turn ``check_permissions`` off, so a user who can
write it (or swap it) makes root run their program. Each attack below is set up by a throwaway
local user; root then runs ``netplugin init`` with ``--config FILE``. The file says
``check_permissions: false`` and names the user's exec dir holding a plugin that leaves a mark:
netplugin must refuse the file (exit 2, "refusing config file PATH: unsafe permissions: ...")
before anything runs. Where only root can write every step, the same file is taken (held cases).

A config path that leads to a file that is not a config (a symlink to a shadow-like file) is
reported with its path and reason only: no line of it is quoted, on stderr or anywhere else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import HostileUser, hostile_user

MARK_PLUGIN = "#!/bin/sh\ntouch \"$(dirname \"$0\")/../../ran\"\nexit 0\n"


@pytest.fixture
def hostile() -> Iterator[HostileUser]:
    yield from hostile_user()


def _evil_config(user: HostileUser) -> str:
    """The attacker's exec dir (with its marking plugin) and a config pointing at it."""
    home = user.home()
    user.sh(f"mkdir -p {home}/exec/evil && printf '%s' '{MARK_PLUGIN}' > {home}/exec/evil/evil && "
            f"chmod 755 {home}/exec/evil/evil")
    return f"plugin: evil\nplugin_dir: {home}/exec\ncheck_permissions: false\n"


def _ran(user: HostileUser) -> bool:
    return (user.home() / "ran").exists()


def _root_file(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


# Each builds the attack and returns the config path root is told to use.
Attack = Callable[[HostileUser, str], Path]


def _owned_by_user(u: HostileUser, text: str) -> Path:
    p = u.home() / "netplugin.yaml"
    u.sh(f"cat > {p} <<'EOF'\n{text}EOF\nchmod 644 {p}")
    return p


def _world_writable(u: HostileUser, text: str) -> Path:
    p = u.area / "ww.yaml"
    _root_file(p, "plugin: netplugin.io/bridge\n", 0o666)
    u.sh(f"cat > {p} <<'EOF'\n{text}EOF")  # the user rewrites root's file
    return p


def _group_writable(u: HostileUser, text: str) -> Path:
    p = u.area / "gw.yaml"
    _root_file(p, text, 0o664)
    return p


def _in_users_dir(u: HostileUser, text: str) -> Path:
    d = u.home() / "etc"
    u.sh(f"mkdir -p {d}")
    p = d / "netplugin.yaml"
    _root_file(p, text)  # root's file, in a directory the user may swap it in
    return p


def _in_world_writable_dir(u: HostileUser, text: str) -> Path:
    d = u.area / "open"
    d.mkdir(mode=0o777)
    d.chmod(0o777)  # not sticky: anyone may rename root's file away and put theirs
    p = d / "netplugin.yaml"
    _root_file(p, text)
    return p


def _users_symlink(u: HostileUser, text: str) -> Path:
    good = u.area / "good.yaml"
    _root_file(good, text)
    link = u.area / "link.yaml"
    d = u.area / "links"
    d.mkdir(mode=0o1777)
    d.chmod(0o1777)
    link = d / "netplugin.yaml"
    u.sh(f"ln -s {good} {link}")  # the user's link: they choose where it leads
    return link


def _through_users_dir_link(u: HostileUser, text: str) -> Path:
    d = u.home() / "conf"
    u.sh(f"mkdir -p {d}")
    _root_file(d / "netplugin.yaml", text)
    root_link = u.area / "conf"
    root_link.symlink_to(d)  # root's link, but to a directory the user owns
    return root_link / "netplugin.yaml"


ATTACKS: list[Any] = [
    pytest.param(_owned_by_user, "is owned by uid", id="file-owned-by-user"),
    pytest.param(_world_writable, "world-writable (mode 0666)", id="roots-file-mode-0666"),
    pytest.param(_group_writable, "group-writable (mode 0664)", id="roots-file-mode-0664"),
    pytest.param(_in_users_dir, "is owned by uid", id="roots-file-in-users-dir"),
    pytest.param(_in_world_writable_dir, "world-writable (mode 0777)", id="in-world-writable-dir"),
    pytest.param(_users_symlink, "is a symbolic link owned by uid", id="users-symlink"),
    pytest.param(_through_users_dir_link, "is owned by uid", id="roots-link-to-users-dir"),
]


def _init(cli_env: dict[str, str], config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netplugin", "--config", str(config), "init"],
                          env=cli_env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("attack", "why"), ATTACKS)
def test_a_config_file_others_can_write_is_refused_before_anything_runs(
    hostile: HostileUser, cli_env: dict[str, str], attack: Attack, why: str
) -> None:
    config = attack(hostile, _evil_config(hostile))
    r = _init(cli_env, config)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert f"refusing config file {config}: unsafe permissions:" in r.stderr, r.stderr
    assert why in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not _ran(hostile)  # the user's program never ran as root


def _in_sticky_dir(u: HostileUser, text: str) -> Path:
    d = u.area / "sticky"
    d.mkdir(mode=0o1777)
    d.chmod(0o1777)  # like /tmp: only an entry's owner may rename or remove it
    p = d / "netplugin.yaml"
    _root_file(p, text)
    return p


def _plain(u: HostileUser, text: str) -> Path:
    p = u.area / "plain.yaml"
    _root_file(p, text)
    return p


@pytest.mark.parametrize("where", [pytest.param(_plain, id="roots-dir"), pytest.param(_in_sticky_dir, id="sticky")])
def test_a_config_file_only_root_can_write_is_taken(
    hostile: HostileUser, cli_env: dict[str, str], plugin_dir: Any, where: Attack
) -> None:
    config = where(hostile, f"plugin: good\nplugin_dir: {plugin_dir.path}\n")
    plugin_dir.install("good")
    r = _init(cli_env, config)
    assert r.returncode == 0, r.stderr


def test_dev_null_is_the_empty_config(cli_env: dict[str, str]) -> None:
    r = subprocess.run([sys.executable, "-m", "netplugin", "--config", "/dev/null", "plugins"],
                       env=cli_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# --- no secret quoted ---------------------------------------------------------------------------------------

SECRET = "$y$j9T$Zq7Secr3tHashV4lue$abcdefghijklmnopqrstuvwxyz0123456789"
NOT_CONFIGS = [
    pytest.param(f"root:{SECRET}:19700:0:99999:7:::\ndaemon:*:19700:0:99999:7:::\n", id="shadow"),
    pytest.param(f"root:{SECRET}:19700:0:99999:7:::\n", id="shadow-one-line"),
    pytest.param(f"password: {SECRET}\n", id="key-value"),
    pytest.param(f"{SECRET}: x\n", id="secret-as-key"),
    pytest.param(f"[{SECRET}\n", id="not-yaml"),
    pytest.param(f"\xff\xfe{SECRET}\n", id="not-utf8"),
]


@pytest.mark.parametrize("content", NOT_CONFIGS)
def test_a_config_symlinked_to_a_secret_file_never_quotes_it(
    cli_env: dict[str, str], tmp_path: Path, content: str
) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_bytes(content.encode("latin-1"))
    shadow.chmod(0o640)
    link = tmp_path / "node.yaml"
    link.symlink_to(shadow)
    r = _init(cli_env, link)
    assert r.returncode == 2, r.stderr
    assert str(link) in r.stderr  # its path and the reason
    for piece in (SECRET, SECRET[:12], "Zq7Secr3t"):
        assert piece not in r.stderr and piece not in r.stdout
    assert "Traceback" not in r.stderr
    assert os.path.exists(shadow)
