"""The daemon builds a caller's config once per distinct settings, and again when the file changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netplugin.core.config import Config
from netplugin.core.errors import ConfigError
from netplugin.frontends.cni.netconf import build_config, built_config
from netplugin.frontends.cni.spec import CniRequest, parse_request
from netplugin.frontends.wire.fingerprint import BuiltSettings, fingerprint


def _req(conf: dict[str, object]) -> CniRequest:
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "abc",
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_PATH": "/y",
    }
    return parse_request(env, json.dumps(conf).encode())


def test_same_settings_reuse_the_config_and_an_edit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "np.yaml"
    path.write_text(f"plugin: bridge\nstate_dir: {tmp_path}/state\n")
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "netplugin-cni", "configFile": str(path)}
    built = BuiltSettings()

    def config(req: CniRequest, environ: dict[str, str]) -> Config:
        cfg, print_ = built_config(req, environ, built, None)
        assert print_ == fingerprint(cfg)
        return cfg

    first = config(_req(conf), {})
    again = config(_req({**conf, "prevResult": {}}), {})
    assert again is first  # keys that are not settings do not matter
    assert build_config(_req(conf), {}) is not first  # the local shim builds its own
    other_env = config(_req(conf), {"NETPLUGIN_HOST": "none"})
    assert other_env is not first and other_env.host == "none"
    other_conf = config(_req({**conf, "env": {"A": "1"}}), {})
    assert other_conf is not first and other_conf.env["A"] == "1"
    path.write_text(f"plugin: other\nstate_dir: {tmp_path}/state\n")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    edited = config(_req(conf), {})
    assert edited.plugin == "other"


def test_a_bad_setting_is_never_cached(tmp_path: Path) -> None:
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "netplugin-cni", "plugin": "bridge",
            "netplugin": {"timeouts": {"setup": "soon"}}}  # fmt: skip
    built = BuiltSettings()
    for _ in range(2):
        with pytest.raises(ConfigError) as info:
            built_config(_req(conf), {}, built, None)
        assert info.value.key == "netplugin.timeouts"
