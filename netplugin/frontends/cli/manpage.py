"""``netplugin.1``, the manual page, generated from the click tree (``python -m netplugin.frontends.cli.manpage``).

Every command's usage, help (with its examples) and options come from the commands themselves, the
environment from the config-key table; ``man/netplugin.1`` is this module's output, checked by a
test, installed by ``scripts/install.sh`` and by the wheel (``share/man/man1``).
"""

from __future__ import annotations

import sys

import click

from netplugin import __version__
from netplugin.core.configkeys import ENV_VARS
from netplugin.frontends.wire.codes import EXIT_MEANINGS

__all__ = ["render"]

_SEE_ALSO = "journalctl(1), systemctl(1), kubelet(8)"


def _roff(text: str) -> str:
    """Plain text as roff: backslashes and leading dots or quotes escaped."""
    out = []
    for line in text.replace("\\", "\\e").splitlines():
        out.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(out)


def _help_body(help_text: str) -> str:
    """A command's help: paragraphs filled, ``\\b`` blocks (the examples) kept as they are."""
    parts = []
    for para in click.unstyle(help_text).strip().split("\n\n"):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            parts.append(".nf\n" + _roff("\n".join(line.strip() for line in lines[1:])) + "\n.fi")
        else:
            parts.append(_roff(" ".join(para.split())))
    return "\n.PP\n".join(parts)


def _options(cmd: click.Command, ctx: click.Context) -> str:
    out = []
    for param in cmd.get_params(ctx):
        # Options only: the synopsis names the arguments (click 8.5 gives them a record without help).
        record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
        if record is not None:
            out.append(f".TP\n.B {_roff(record[0])}\n{_roff(' '.join(record[1].split()))}")
    return "\n".join(out)


def render(group: click.Group) -> str:
    """The manual page of ``group`` and every command it lists."""
    root = click.Context(group, info_name="netplugin")
    page = [
        f'.TH NETPLUGIN 1 "" "netplugin {__version__}" "netplugin manual"',
        ".SH NAME\nnetplugin \\- " + _roff(group.get_short_help_str(200)),
        ".SH SYNOPSIS\n.B netplugin\n[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]",
        ".SH DESCRIPTION\n" + _help_body(group.help or ""),
        ".SH GLOBAL OPTIONS\nAccepted before or after the command.\n" + _options(group, root),
        ".SH COMMANDS",
    ]
    for name in group.list_commands(root):
        cmd = group.get_command(root, name)
        assert cmd is not None
        ctx = click.Context(cmd, info_name=name, parent=root)
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        page.append(f".SS {name}\n.B netplugin {name}\n{_roff(usage)}\n.PP\n{_help_body(cmd.help or '')}")
        page.append(_options(cmd, ctx))
    page.append(".SH EXIT STATUS")
    page.extend(f".TP\n.B {code}\n{_roff(meaning)}" for code, meaning in EXIT_MEANINGS.items())
    page.append(".SH ENVIRONMENT")
    page.extend(f".TP\n.B {var}\nthe config key \\fB{key}\\fR" for var, key in sorted(ENV_VARS.items()))
    page.append(
        ".SH FILES\n.TP\n.B /etc/netplugin/netplugin.yaml\nthe config file\n"
        ".TP\n.B /usr/libexec/kubernetes/kubelet-plugins/net/exec/\nthe exec plugins"
    )
    page.append(f".SH SEE ALSO\n{_SEE_ALSO}")
    return "\n".join(p for p in page if p) + "\n"


if __name__ == "__main__":
    from netplugin.frontends.cli.app import cli

    sys.stdout.write(render(cli))
