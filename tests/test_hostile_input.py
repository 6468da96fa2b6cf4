"""Hostile input through the real CLI (issue 13, classes 4 and 7): bounded, clean, never a signal.

The manifests are written by an unprivileged user created for the test (``runuser``), into a pod
manifest directory that user may write (a node that delegates pod manifests to someone): that
user must not be able to crash or stall root's setups and teardowns. Every CLI run has an
address-space limit, so a memory bomb shows up as a failed test, not as a swapping machine.
"""

from __future__ import annotations

import functools
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netplugin.core._yaml import MAX_DEPTH

CLI_AS = 1 << 30  # 1 GiB of address space for one CLI run: plenty for netplugin, not for a bomb


# The limits are set by prlimit(1), not by a preexec_fn: a preexec_fn makes subprocess fork() the
# pytest process, which holds grpc (the containerd tests' CRI client), and grpc's fork handlers can
# abort the child before it execs.
LIMITED = ("prlimit", f"--as={CLI_AS}", "--core=0", "--")


@pytest.fixture
def cli(cli_env: dict[str, str]) -> Any:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*LIMITED, sys.executable, "-m", "netplugin", *args],
            env={**cli_env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode >= 0, f"killed by signal {-done.returncode}: {done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr, done.stderr
        return done

    return run


@pytest.fixture
def test_user() -> Iterator[str]:
    """An unprivileged user that exists for this test only."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root, useradd and runuser")
    name = "np13" + secrets.token_hex(4)
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def write_as(user: str, path: Path, data: str) -> None:
    """Write ``path`` as ``user`` (so the attack runs with that user's rights only)."""
    subprocess.run(["runuser", "-u", user, "--", "tee", str(path)], input=data, text=True, check=True,
                   stdout=subprocess.DEVNULL)


def laughs(levels: int) -> str:
    doc = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    return doc + "".join(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, levels))


def hostile_manifests(victim: str) -> dict[str, str]:
    """File name -> content; each names ``victim`` (so it may be that pod's manifest)."""
    head = f"kind: Pod\nmetadata: {{name: {victim}}}\n"
    return {
        "deep.yaml": head + "spec: " + "[" * 200_000 + "\n",  # segfaulted the C loader
        "deep.json": f'{{"kind": "Pod", "metadata": {{"name": "{victim}"}}, "spec": ' + "[" * 200_000,
        "laughs.yaml": head + laughs(10) + "spec: *a9\n",
        "dup.yaml": head + f"metadata: {{name: {victim}}}\n",
        "wide.yaml": head + "spec: [" + "0," * 300_000 + "0]\n",
    }


def test_hostile_manifests_block_only_their_own_pod_and_never_a_teardown(
    cli: Any, plugin_dir: Any, test_user: str
) -> None:
    plugin_dir.install("sc")
    # The delegated manifest dir, owned by the user, where the user can reach it (tmp_path is 0700).
    pods = Path(tempfile.mkdtemp(prefix="np13-pods-"))
    try:
        os.chmod(pods, 0o755)
        os.chown(pods, pwd.getpwnam(test_user).pw_uid, -1)
        for name, content in hostile_manifests("victim").items():
            write_as(test_user, pods / name, content)
        _attack_with_manifests(cli, pods)
    finally:
        shutil.rmtree(pods)


def _attack_with_manifests(cli: Any, pods: Path) -> None:
    base = ("--plugin", "sc", "--config", "/dev/null")
    cli = functools.partial(cli, env={"NETPLUGIN_PODS_DIR": str(pods)})
    # Another pod (no manifest at all) is set up and torn down as if the files were not there.
    assert cli(*base, "setup", "default", "bystander", "b1").returncode == 0
    assert cli(*base, "teardown", "default", "bystander", "b1").returncode == 0
    # The pod those files may describe: a clean host error naming every file, exit 5.
    done = cli(*base, "setup", "default", "victim", "v1")
    assert done.returncode == 5, done.stderr
    assert f"nested more than {MAX_DEPTH} levels deep" in done.stderr
    assert "aliases expanded" in done.stderr and "duplicate key 'metadata'" in done.stderr
    for name in hostile_manifests("victim"):
        assert str(pods / name) in done.stderr
    # Teardown and status of that pod never need its manifest.
    assert cli(*base, "teardown", "default", "victim", "v1").returncode == 0
    assert cli(*base, "status", "default", "victim", "v1").returncode == 0


@pytest.mark.parametrize(
    ("config", "key", "words"),
    [
        ("env:\n  " + laughs(10).replace("\n", "\n  ") + "\n", "config", "aliases expanded"),
        ("timeouts: " + "[" * 100_000 + "\n", "config", "nested more than"),
        ("timeout: 5\nplugin_dir: /x\ntimeout: 7\n", "config", "duplicate key 'timeout' (first on line 1) (line 3"),
        ("netns_template: '/run/netns/{infra_id:>2000000000}'\n", "netns_template", "format spec"),
        ("timeout: 1.0e-320\n", "timeout", "at least 0.001 seconds"),
    ],
    ids=["laughs", "deep", "duplicate", "template-width", "denormal"],
)
def test_hostile_config_files_are_exit_2_naming_the_key(
    cli: Any, tmp_path: Path, config: str, key: str, words: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(config)
    done = cli("--config", str(path), "plugins")
    assert done.returncode == 2, done.stderr
    assert f"config key {key!r}" in done.stderr
    assert words in done.stderr
    assert len(done.stderr) < 2000


@pytest.mark.parametrize(
    ("args", "env", "name", "words"),
    [
        (("--timeout", "1e-320"), {}, "--timeout", "at least 0.001 seconds"),
        (("--timeout", "\u0663"), {}, "--timeout", "written in ASCII digits"),  # float() reads it as 3
        (("--timeout", "\uff15"), {}, "--timeout", "written in ASCII digits"),
        ((), {"NETPLUGIN_TIMEOUT": "\u0665"}, "NETPLUGIN_TIMEOUT", "written in ASCII digits"),
        ((), {"NETPLUGIN_NETNS_TEMPLATE": "/n/{infra_id:>9999999999}"}, "NETPLUGIN_NETNS_TEMPLATE", "format spec"),
    ],
)
def test_hostile_options_are_exit_2_naming_the_option(
    cli: Any, plugin_dir: Any, args: tuple[str, ...], env: dict[str, str], name: str, words: str
) -> None:
    plugin_dir.install("sc")
    done = cli("--plugin", "sc", *args, "setup", "default", "p", "c1", env=env)
    assert done.returncode == 2, done.stderr
    assert f"config key {name!r}" in done.stderr and words in done.stderr
