"""The daemon builds a caller's config once per distinct raw settings (the CLI's fast path sends them
with every request), and never serves a call whose settings changed since: an edited config file, other
variables or flags are built again and compared again."""

from __future__ import annotations

from pathlib import Path

import pytest

from netplugin.core.config import FileSnapshot, load_config, snapshot_config
from netplugin.core.errors import ConfigError, DaemonUnavailable
from netplugin.frontends.daemon.cnicalls import check_settings
from netplugin.frontends.daemon.reconfig import ServedSettings
from netplugin.manager.manager import Manager


def _live(conf: Path, snapshot: FileSnapshot | None = None) -> ServedSettings:
    """A daemon's settings loaded from ``conf`` (with ``snapshot``: as the daemon keeps them)."""
    cfg = load_config(str(conf), environ={}, snapshot=snapshot)
    return ServedSettings.of(cfg, Manager(cfg), snapshot)


def _settings(path: Path, **environ: str) -> dict[str, object]:
    return {"config_path": str(path), "environ": dict(environ), "overrides": {}}


def test_the_same_settings_are_built_once(tmp_path: Path) -> None:
    conf = tmp_path / "netplugin.yaml"
    conf.write_text("plugin: vendor.example/a\n")
    own = _live(conf)
    first = check_settings(_settings(conf), own, "sock")
    assert check_settings(_settings(conf), own, "sock") is first
    assert first.plugin == "vendor.example/a"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda conf: conf.write_text("plugin: vendor.example/bb\n"), id="file-edited"),
        pytest.param(lambda conf: (conf.unlink(), conf.write_text("plugin: vendor.example/c\n")), id="file-replaced"),
    ],
)
def test_an_edited_config_file_is_read_again(tmp_path: Path, change: object) -> None:
    conf = tmp_path / "netplugin.yaml"
    conf.write_text("plugin: vendor.example/a\n")
    own = _live(conf)
    check_settings(_settings(conf), own, "sock")
    change(conf)  # type: ignore[operator]
    with pytest.raises(DaemonUnavailable, match="different settings"):
        check_settings(_settings(conf), own, "sock")


def test_other_variables_are_other_settings_and_errors_are_never_kept(tmp_path: Path) -> None:
    conf = tmp_path / "netplugin.yaml"
    conf.write_text("plugin: vendor.example/a\n")
    own = _live(conf)
    check_settings(_settings(conf), own, "sock")
    with pytest.raises(DaemonUnavailable, match="different settings"):
        check_settings(_settings(conf, NETPLUGIN_PLUGIN="vendor.example/z"), own, "sock")
    for _ in range(2):
        with pytest.raises(ConfigError):
            check_settings(_settings(conf, NETPLUGIN_TIMEOUT="soon"), own, "sock")


def test_the_daemons_own_file_is_taken_as_it_read_it_not_as_it_is_now(tmp_path: Path) -> None:
    conf, other = tmp_path / "netplugin.yaml", tmp_path / "other.yaml"
    conf.write_text("plugin: vendor.example/a\n")
    other.write_text("plugin: vendor.example/a\n")
    own = _live(conf, snapshot_config(str(conf), environ={}))
    conf.write_text("plugin: vendor.example/a\nplugn: typo\n")  # edited, not (yet) reloaded
    assert check_settings(_settings(conf), own, "sock").plugin == "vendor.example/a"
    other.write_text("plugin: vendor.example/b\n")  # another file is read as it is
    with pytest.raises(DaemonUnavailable, match="different settings"):
        check_settings(_settings(other), own, "sock")
