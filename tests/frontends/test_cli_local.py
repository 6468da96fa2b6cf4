"""The CLI's direct path (no daemon): pod commands run without click, with the full CLI's output and codes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

FULL = "import sys; from netplugin.frontends.cli.app import main; main(sys.argv[1:])"
MODULES = (
    "import sys, runpy; sys.argv[0] = 'netplugin'\n"
    "try:\n    runpy.run_module('netplugin', run_name='__main__')\n"
    "finally:\n    print('click' in sys.modules, file=sys.stderr)"
)


def _both(cli_env: dict[str, str], args: list[str], **env: str) -> tuple[Any, Any]:
    full_env = {**cli_env, **env}
    run = {"env": full_env, "capture_output": True, "text": True, "timeout": 60, "stdin": subprocess.DEVNULL}
    fast = subprocess.run([sys.executable, "-c", MODULES, *args], **run)  # type: ignore[call-overload]
    full = subprocess.run([sys.executable, "-c", FULL, *args], **run)  # type: ignore[call-overload]
    return fast, full


@pytest.mark.parametrize(
    ("args", "setup", "status", "code"),
    [
        (["setup", "default", "web-0", "abc"], {}, '{"ip":"10.203.1.2"}', 0),
        (["-o", "json", "setup", "default", "web-0", "abc"], {}, '{"ip":"10.203.1.2"}', 0),
        (["setup", "default", "web-0", "abc"], {"exit": 3, "stderr": "np: no bridge"}, "", 1),
        (["-o", "json", "setup", "default", "web-0", "abc"], {"exit": 3, "stderr": "np: no bridge"}, "", 1),
        (["setup", "default", "Bad_Name", "abc"], {}, "", 2),
        (["--timeout", "soon", "setup", "default", "web-0", "abc"], {}, "", 2),
        (["-o", "json", "status", "default", "web-0", "abc"], {}, '{"ip":"10.203.1.2"}', 0),
        (["status", "default", "web-0", "abc"], {}, '{"ip":"10.203.1.300"}', 1),
        (["teardown", "default", "web-0", "abc"], {}, "", 0),
    ],
)
def test_the_direct_path_prints_what_the_full_cli_prints(
    plugin_dir: Any, cli_env: dict[str, str], args: list[str], setup: dict[str, Any], status: str, code: int
) -> None:
    p = plugin_dir.install("p")
    p.set("setup", **setup)
    p.set("status", stdout=status)
    fast, full = _both(cli_env, args, NETPLUGIN_PLUGIN="p")
    lines = fast.stderr.splitlines()
    fast_err, click_loaded = "\n".join(lines[:-1]), lines[-1]
    assert (fast.returncode, fast.stdout, fast_err.strip()) == (full.returncode, full.stdout, full.stderr.strip())
    assert fast.returncode != 0 or code == 0
    if args[-4] in ("setup", "teardown", "status") and code != 2:
        assert click_loaded == "False", fast.stderr  # no click on the direct path
    if "-o" in args and fast.returncode == 0 and fast.stdout:
        json.loads(fast.stdout)
