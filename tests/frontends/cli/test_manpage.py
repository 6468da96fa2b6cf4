"""The manual page: generated from the click tree, shipped as man/netplugin.1, readable by man."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from netplugin.frontends.cli.app import COMMANDS, cli
from netplugin.frontends.cli.manpage import render
from netplugin.frontends.wire.codes import EXIT_MEANINGS

SHIPPED = Path(__file__).resolve().parents[3] / "man" / "netplugin.1"


def test_the_shipped_page_is_the_generated_one() -> None:
    # Regenerate: python -m netplugin.frontends.cli.manpage > man/netplugin.1
    assert SHIPPED.read_text() == render(cli)


def test_the_page_has_every_command_exit_code_and_global_option() -> None:
    page = render(cli)
    for name in COMMANDS:
        assert f"\n.SS {name}\n.B netplugin {name}\n" in page, name
    for code in EXIT_MEANINGS:
        assert f"\n.TP\n.B {code}\n" in page
    for option in ("--config FILE", "--log-level LEVEL", "-o, --output [text|json|yaml|wide]"):
        assert option in page
    assert "Examples:" in page


@pytest.mark.skipif(shutil.which("man") is None, reason="man is not installed")
def test_man_renders_it_without_warnings() -> None:
    shown = subprocess.run(
        ["man", "--warnings", "-l", str(SHIPPED)], capture_output=True, text=True, timeout=60, env={"MANWIDTH": "100"}
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""
    assert "netplugin - Manage kubelet exec network plugins on this node." in shown.stdout
