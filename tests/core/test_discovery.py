"""netplugin.core.discovery: every kind of candidate in the exec dir, and selection around broken ones."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from netplugin.core.discovery import Candidate, scan
from netplugin.core.errors import DiscoveryError, InvalidArgument, PluginInvalid, PluginNotFound
from netplugin.core.execplugin.exec_plugin import ExecPlugin
from netplugin.core.plugin import NOOP_NAME
from netplugin.plugins import BUILTINS

OTHER_UID = 1000


def _mkdir(d: Any, dirname: str, mode: int = 0o755) -> Path:
    p = d.path / dirname
    p.mkdir()
    p.chmod(mode)
    return p


def _exe_is_dir(d: Any) -> None:
    (_mkdir(d, "isdir") / "isdir").mkdir()


def _exe_is_fifo(d: Any) -> None:
    os.mkfifo(_mkdir(d, "isfifo") / "isfifo")


def _chown_exe(d: Any) -> None:
    os.chown(d.install("foreign").exe, OTHER_UID, OTHER_UID)


def _chown_dir(d: Any) -> None:
    os.chown(d.install("foreigndir").dir, OTHER_UID, 0)


def _symlink_to(mode: int) -> Callable[[Any], None]:
    def setup(d: Any) -> None:
        target_dir = d.path.parent / "elsewhere"
        target_dir.mkdir(exist_ok=True)
        target = target_dir / f"real-{mode:o}"
        target.write_text("#!/bin/sh\nexit 0\n")
        target.chmod(mode)
        (_mkdir(d, "linked") / "linked").symlink_to(target)

    return setup


CANDIDATES = [
    # (id, setup, name, path of the exe relative to the exec dir, problem words or None)
    ("valid", lambda d: d.install("good"), "good", "good/good", None),
    ("vendored", lambda d: d.install("vendor.example/foo"), "vendor.example/foo", "vendor.example~foo/foo", None),
    ("no-executable", lambda d: _mkdir(d, "empty"), "empty", "empty/empty", "no executable: {exe} does not exist"),
    ("not-executable", lambda d: d.install("noexec", mode=0o644), "noexec", "noexec/noexec",
     "not executable: {exe} (mode 0644)"),
    ("exe-is-a-directory", _exe_is_dir, "isdir", "isdir/isdir", "not a regular file: {exe}"),
    ("exe-is-a-fifo", _exe_is_fifo, "isfifo", "isfifo/isfifo", "not a regular file: {exe}"),
    ("name-leading-dash", lambda d: d.install("-bad"), "-bad", None, "invalid name '-bad'"),
    ("name-two-slashes", lambda d: _mkdir(d, "a~b~c"), "a/b/c", None, "invalid name 'a/b/c': must have at most one"),
    ("name-prefix-not-dns", lambda d: d.install("UPPER/x"), "UPPER/x", None, "prefix 'UPPER'"),
    ("name-64-chars", lambda d: d.install("n" * 64), "n" * 64, None, "at most 63 characters (got 64)"),
    ("name-hidden-dir", lambda d: _mkdir(d, ".cache"), ".cache", None, "invalid name '.cache'"),
    ("duplicate-of-builtin", lambda d: d.install(NOOP_NAME), NOOP_NAME, None,
     "duplicate name 'kubernetes.io/no-op' (also a built-in plugin)"),
    ("plugin-dir-0775", lambda d: d.install("gw", dir_mode=0o775), "gw", "gw/gw",
     "unsafe permissions: {dir} is group-writable (mode 0775)"),
    ("plugin-dir-0757", lambda d: d.install("ww", dir_mode=0o757), "ww", "ww/ww",
     "unsafe permissions: {dir} is world-writable (mode 0757)"),
    ("exe-0757", lambda d: d.install("wexe", mode=0o757), "wexe", "wexe/wexe",
     "unsafe permissions: {exe} is world-writable (mode 0757)"),
    ("exe-0775", lambda d: d.install("gexe", mode=0o775), "gexe", "gexe/gexe",
     "unsafe permissions: {exe} is group-writable (mode 0775)"),
    ("exe-0777", lambda d: d.install("aexe", mode=0o777), "aexe", "aexe/aexe",
     "unsafe permissions: {exe} is group- and world-writable (mode 0777)"),
    ("exe-owned-by-uid-1000", _chown_exe, "foreign", "foreign/foreign",
     "unsafe permissions: {exe} is owned by uid 1000"),
    ("dir-owned-by-uid-1000", _chown_dir, "foreigndir", "foreigndir/foreigndir",
     "unsafe permissions: {dir} is owned by uid 1000"),
    ("symlink-to-safe-file", _symlink_to(0o755), "linked", "linked/linked", None),
    ("symlink-to-unsafe-file", _symlink_to(0o777), "linked", "linked/linked",
     "unsafe permissions: {exe} is group- and world-writable"),
]

@pytest.mark.parametrize(("setup", "name", "rel", "problem"), [c[1:] for c in CANDIDATES],
                         ids=[c[0] for c in CANDIDATES])
def test_candidate(plugin_dir: Any, setup: Callable[[Any], Any], name: str, rel: str | None,
                   problem: str | None) -> None:
    setup(plugin_dir)
    plugin_dir.install("bystander")  # one good plugin next to it is not affected
    found = {c.name: c for c in scan(str(plugin_dir.path), reserved=BUILTINS)}
    assert set(found) == {name, "bystander"}
    cand = found[name]
    assert found["bystander"].valid
    if rel is not None:
        assert cand.path == str(plugin_dir.path / rel)
    if problem is None:
        assert cand.valid and cand.problem is None
    else:
        exe = cand.path
        expected = problem.format(exe=exe, dir=os.path.dirname(exe))
        assert not cand.valid
        assert cand.problem is not None and expected in cand.problem


@pytest.mark.parametrize(("setup", "name", "rel", "problem"), [c[1:] for c in CANDIDATES],
                         ids=[c[0] for c in CANDIDATES])
def test_check_permissions_false_relaxes_only_permissions(
    plugin_dir: Any, setup: Callable[[Any], Any], name: str, rel: str | None, problem: str | None
) -> None:
    setup(plugin_dir)
    (cand,) = [c for c in scan(str(plugin_dir.path), check_permissions=False, reserved=BUILTINS) if c.name == name]
    is_permission_problem = problem is not None and problem.startswith("unsafe")
    assert cand.valid == (problem is None or is_permission_problem)


@pytest.mark.parametrize(("mode", "words"), [(0o777, "group- and world-writable (mode 0777)"),
                                             (0o775, "group-writable (mode 0775)"),
                                             (0o757, "world-writable (mode 0757)")])
def test_unsafe_exec_dir_makes_every_candidate_invalid(plugin_dir: Any, mode: int, words: str) -> None:
    plugin_dir.install("one")
    plugin_dir.install("two")
    os.chmod(plugin_dir.path, mode)
    cands = scan(str(plugin_dir.path))
    assert [c.name for c in cands] == ["one", "two"]
    for c in cands:
        assert c.problem == f"unsafe permissions: {plugin_dir.path} is {words}"
    assert all(c.valid for c in scan(str(plugin_dir.path), check_permissions=False))


def test_exec_dir_owned_by_another_user_is_unsafe(plugin_dir: Any) -> None:
    plugin_dir.install("one")
    os.chown(plugin_dir.path, OTHER_UID, OTHER_UID)
    (cand,) = scan(str(plugin_dir.path))
    assert cand.problem == f"unsafe permissions: {plugin_dir.path} is owned by uid {OTHER_UID} (must be root or uid 0)"


def test_scan_never_executes_anything(plugin_dir: Any) -> None:
    p = plugin_dir.install("quiet")
    scan(str(plugin_dir.path))
    assert p.calls() == []


def test_files_in_the_exec_dir_are_not_candidates_and_order_is_by_dirname(plugin_dir: Any) -> None:
    (plugin_dir.path / "README").write_text("not a plugin\n")
    (plugin_dir.path / "stray.sh").write_text("#!/bin/sh\n")
    for name in ["zeta", "alpha", "vendor.example/mid"]:
        plugin_dir.install(name)
    assert [c.name for c in scan(str(plugin_dir.path))] == ["alpha", "vendor.example/mid", "zeta"]


def test_empty_exec_dir_has_no_candidates(plugin_dir: Any) -> None:
    assert scan(str(plugin_dir.path)) == []


@pytest.mark.parametrize("kind", ["missing", "a-file", "a-dangling-symlink"])
def test_unreadable_exec_dir_is_a_discovery_error_naming_the_path(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "exec"
    if kind == "a-file":
        path.write_text("")
    elif kind == "a-dangling-symlink":
        path.symlink_to(tmp_path / "nowhere")
    with pytest.raises(DiscoveryError) as info:
        scan(str(path))
    assert info.value.path == str(path)
    assert str(path) in info.value.message


def test_candidate_to_dict() -> None:
    c = Candidate("p", "/x/p/p", "no executable")
    assert c.to_dict() == {"name": "p", "path": "/x/p/p", "valid": False, "problem": "no executable",
                           "builtin": False}
    assert Candidate("p", "/x/p/p").to_dict()["valid"] is True


# --- selection around broken candidates ---------------------------------------------------------------------


def test_broken_stray_dir_does_not_stop_selecting_a_good_plugin(plugin_dir: Any, make_manager: Any) -> None:
    _mkdir(plugin_dir, "stray")
    plugin_dir.install("bad~x~y")
    plugin_dir.install("unsafe", mode=0o777)
    good = plugin_dir.install("good")
    plugin = make_manager(plugin="good").plugin
    assert isinstance(plugin, ExecPlugin)
    assert (plugin.name, plugin.path) == ("good", str(good.exe))


def test_broken_candidates_show_up_in_the_plugins_listing(plugin_dir: Any, run_cli: Any) -> None:
    _mkdir(plugin_dir, "stray")
    plugin_dir.install("unsafe", mode=0o777)
    good = plugin_dir.install("good")
    r = run_cli("-o", "json", "plugins")
    assert r.returncode == 0, r.stderr
    listing = {c["name"]: c for c in json.loads(r.stdout)}
    assert listing["good"] == {"name": "good", "path": str(good.exe), "valid": True, "problem": None,
                               "builtin": False}
    assert listing["stray"]["valid"] is False
    assert "no executable" in listing["stray"]["problem"]
    assert listing["unsafe"]["valid"] is False
    assert "world-writable" in listing["unsafe"]["problem"]
    assert listing[NOOP_NAME]["builtin"] is True and listing[NOOP_NAME]["valid"] is True
    text = run_cli("plugins")
    assert text.returncode == 0
    lines = {line.split("\t")[0]: line.split("\t") for line in text.stdout.splitlines()}
    assert lines["good"][1] == "ok"
    assert lines["stray"][1] == "INVALID" and "no executable" in lines["stray"][3]


def test_selecting_an_invalid_plugin_names_the_problem(plugin_dir: Any, make_manager: Any) -> None:
    p = plugin_dir.install("unsafe", mode=0o757)
    with pytest.raises(PluginInvalid) as info:
        make_manager(plugin="unsafe").plugin  # noqa: B018
    assert info.value.plugin == "unsafe"
    assert info.value.path == str(p.exe)
    assert "world-writable" in info.value.problem
    assert p.calls() == []


def test_not_found_lists_available_plugins_and_problems(plugin_dir: Any, make_manager: Any) -> None:
    plugin_dir.install("good")
    _mkdir(plugin_dir, "stray")
    with pytest.raises(PluginNotFound) as info:
        make_manager(plugin="wanted").plugin  # noqa: B018
    err = info.value
    assert err.plugin == "wanted"
    assert "good" in err.details["available"] and NOOP_NAME in err.details["available"]
    assert "stray" not in err.details["available"]
    assert any(p.startswith("stray: no executable") for p in err.problems)


def test_a_builtin_name_selects_the_builtin_even_with_a_same_named_dir(plugin_dir: Any, make_manager: Any) -> None:
    d = plugin_dir.install(NOOP_NAME)
    m = make_manager(plugin=NOOP_NAME)
    assert not isinstance(m.plugin, ExecPlugin)
    assert m.plugin.name == NOOP_NAME
    from netplugin.core.names import PodRef

    m.setup(PodRef("default", "web-0", "abc"))
    assert d.calls() == []


def test_selecting_a_bad_name_is_invalid_argument_and_scans_nothing(tmp_path: Path, make_manager: Any) -> None:
    # the exec dir does not even exist: validation comes first
    with pytest.raises(InvalidArgument) as info:
        make_manager(plugin_dir=str(tmp_path / "missing")).select("a/b/c")
    assert info.value.field == "plugin name"
