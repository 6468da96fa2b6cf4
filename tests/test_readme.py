"""The README and the docs/ pages say what is true: the quick start runs as written, and every
command, option, file and link they name exists; docs/config.md is the config's defaults."""

from __future__ import annotations

import glob
import os
import re
import secrets
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from netplugin.core.config import Config
from netplugin.core.configkeys import ENV_VARS, PARSERS
from netplugin.frontends.cli import GLOBAL_VALUE_OPTIONS
from netplugin.frontends.cli.app import cli
from tests.support.nettest import kernel_gate

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "exec_plugins" / "README.md"]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
#: the one project URL every absolute link to this tree is built from
SOURCE = PROJECT["urls"]["Source"]
#: what the quick start's sample output was made with, and what stands for it when compared
SAMPLE_CHECKOUT = "/usr/local/src/netplugin"
SAMPLE_NETNS = "pod1"
TOP_DIRS = ("scripts", "etc", "docs", "exec_plugins", "netplugin", "tests", "bench", "man", ".ci")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


def quick_start() -> list[tuple[str, list[str]]]:
    """The README's quick start: each ``$ command`` with the output lines shown after it."""
    block = re.search(r"```console\n(.*?)```", _section(README.read_text(), "Quick start"), re.S)
    assert block is not None, "the quick start has a console block"
    steps: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def shape(lines: list[str], checkout: str, netns: str) -> list[list[str]]:
    """Lines as their words, with what differs from run to run (names, numbers, times) masked."""
    text = "\n".join(lines).replace(checkout, "CHECKOUT")
    text = re.sub(rf"\b{re.escape(netns)}\b", "NETNS", text)
    text = re.sub(r"\bnp[0-9a-f]{12}\b", "VETH", text)
    text = re.sub(r"fe80::[0-9a-f:]+/64", "LINKLOCAL", text)
    text = re.sub(r"[0-9]+", "0", text)
    return [line.split() for line in text.splitlines()]


@pytest.fixture
def quick_start_world(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A checkout (its exec plugins, root's), ``netplugin`` on PATH, private dirs, and a network
    namespace to run in, so the bridge the quick start makes is the test's own."""
    kernel_gate(request)
    checkout = tmp_path / "netplugin"
    shutil.copytree(REPO / "exec_plugins", checkout / "exec_plugins", symlinks=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "netplugin").write_text(f'#!/bin/sh\nexec {sys.executable} -m netplugin "$@"\n')
    (bin_dir / "netplugin").chmod(0o755)
    for d in ("state", "run"):
        (tmp_path / d).mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NETPLUGIN_")}
    env.update(
        PATH=f"{bin_dir}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}",
        PYTHONPATH=str(REPO),
        NETPLUGIN_STATE_DIR=str(tmp_path / "state"),
        NETPLUGIN_RUN_DIR=str(tmp_path / "run"),
        NETPLUGIN_CONFIG="/dev/null",
    )
    tag = "np" + secrets.token_hex(4)
    outer, pod = tag + "q", tag + "p"
    subprocess.run(["ip", "netns", "add", outer], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", outer, "ip", "link", "set", "lo", "up"], check=True)
        yield {"checkout": checkout, "env": env, "outer": outer, "netns": pod}
    finally:
        subprocess.run(["ip", "netns", "del", pod], capture_output=True)
        subprocess.run(["ip", "netns", "del", outer], capture_output=True)


@pytest.mark.kernel
def test_the_quick_start_runs_as_written(quick_start_world: dict[str, Any]) -> None:
    w = quick_start_world
    steps = quick_start()
    script = ["set -u"]
    for i, (command, _) in enumerate(steps):
        ours = re.sub(rf"\b{SAMPLE_NETNS}\b", w["netns"], command)
        script += [f"echo '@@ step {i}'", f"{ours} 2>&1 || echo \"@@ failed: $?\""]
    done = subprocess.run(
        ["ip", "netns", "exec", w["outer"], "bash", "-c", "\n".join(script)],
        cwd=w["checkout"], env=w["env"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    outputs = re.split(r"^@@ step \d+\n", done.stdout, flags=re.M)[1:]
    assert len(outputs) == len(steps), done.stdout
    for (command, sample), got in zip(steps, outputs, strict=True):
        assert "@@ failed" not in got, f"{command}:\n{got}"
        assert shape(got.splitlines(), str(w["checkout"]), w["netns"]) == shape(
            sample, SAMPLE_CHECKOUT, SAMPLE_NETNS
        ), f"{command}:\n{got}"


# --- links, commands, options and files ----------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.*)$", text, re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # a code span is no link
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)


def _target(page: Path, link: str) -> tuple[Path, str]:
    """The file of this tree a link names, and its anchor."""
    where, _, anchor = link.partition("#")
    if where.startswith("http"):
        m = re.fullmatch(re.escape(SOURCE) + r"/(?:blob|tree)/main/(.+)", where)
        assert m is not None, f"{page.name}: {link} is not built from the project URL {SOURCE}"
        return REPO / m.group(1), anchor
    return (page.parent / where).resolve() if where else page, anchor


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_names_a_file_and_heading_of_this_tree(page: Path) -> None:
    for link in _links(page):
        if page == README:
            # Shown on a package index page too, where a relative link leads nowhere.
            assert link.startswith((SOURCE + "/", "#")), f"README: {link} is relative"
        target, anchor = _target(page, link)
        assert target.exists(), f"{page.name}: {link}: no {target}"
        if anchor:
            assert target.suffix == ".md" and anchor in _anchors(target), f"{page.name}: {link}: no heading {anchor}"


def test_the_project_urls_are_absolute_and_resolve() -> None:
    urls = PROJECT["urls"]
    assert {"Homepage", "Documentation", "Source", "Issues", "Benchmarks"} <= set(urls)
    for name, url in urls.items():
        assert url.startswith("https://"), name
        if url.startswith(SOURCE + "/blob/") or url.startswith(SOURCE + "/tree/"):
            assert _target(README, url)[0].exists(), name


def _code(page: Path) -> list[str]:
    """Every code span and code block line of a page."""
    text = page.read_text()
    lines = [ln.strip() for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for ln in block.splitlines()]
    lines += [ln.strip() for ln in re.findall(r"^    (\S.*)$", text, re.M)]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return lines + re.findall(r"`([^`\n]+)`", prose)


def _netplugin_words(code: str) -> list[str] | None:
    """The words of a `netplugin ...` command line (None: not one), up to a pipe, redirection or comment."""
    code = code.removeprefix("$ ")
    if not code.startswith("netplugin "):
        return None
    words = []
    for w in code.split()[1:]:
        if w in ("|", "||", "&&", ">", "2>&1", "#") or w.startswith(("#", ">", "2>")):
            break
        words.append(w.rstrip(")"))
    return words


def _command_and_options(words: list[str]) -> tuple[list[str], list[str]]:
    """The command path (``config check``) and the options of a `netplugin` command line."""
    takes_value = {name for f in GLOBAL_VALUE_OPTIONS for name in f.names}
    path: list[str] = []
    options: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w.startswith("-"):
            options.append(w.split("=")[0].strip("[],"))
            skip = w in takes_value
        elif not options or not path:
            if re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", w) and len(path) < 2:
                path.append(w)
            else:
                break
    return path, [o for o in options if re.fullmatch(r"--?[a-z][a-z-]*", o)]


def _command_options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


def _resolve(path: list[str]) -> list[click.Command]:
    """Each command a path names (``setup|teardown``: both); AssertionError when one is missing."""
    ctx = click.Context(cli)
    found: list[click.Command] = [cli]
    if not path:
        return found
    names = path[0].split("|")
    out = []
    for name in names:
        command = cli.get_command(ctx, name)
        assert command is not None, f"netplugin {name}: no such command"
        if isinstance(command, click.Group) and len(path) > 1 and command.get_command(ctx, path[1]) is not None:
            sub = command.get_command(ctx, path[1])
            assert sub is not None
            command = sub
        out.append(command)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_netplugin_command_and_option_named_exists(page: Path) -> None:
    global_options = _command_options(cli)
    checked = 0
    for code in _code(page):
        words = _netplugin_words(code)
        if words is None:
            continue
        path, options = _command_and_options(words)
        for command in _resolve(path):
            known = global_options | _command_options(command) | {"--help"}
            for option in options:
                assert option in known, f"{page.name}: `{code}`: {option} is no option of netplugin {' '.join(path)}"
        checked += 1
    if page == README:
        assert checked >= 10, checked


def test_the_cli_page_lists_every_global_option_and_command() -> None:
    page = (REPO / "docs" / "cli.md").read_text()
    options = re.findall(r"^\| `(-[^`]*)` \|", page, re.M)
    listed = {o for row in options for o in re.findall(r"(?<![\w-])--?[a-z][a-z-]*", row)}
    assert listed == _command_options(cli), listed ^ _command_options(cli)
    commands = {re.split(r"[ |]", row)[0] for row in re.findall(r"^\| `([a-z][^`]*)` \|", page, re.M)}
    assert set(cli.list_commands(click.Context(cli))) <= commands, set(cli.list_commands(click.Context(cli))) - commands


def test_every_installer_option_the_docs_name_exists() -> None:
    helped = subprocess.run(["bash", str(REPO / "scripts" / "install.sh"), "--help"], capture_output=True, text=True)
    known = set(re.findall(r"--[a-z][a-z-]*", helped.stdout + helped.stderr)) | {"--help"}
    for page in PAGES:
        for code in _code(page):
            if "install.sh" not in code:
                continue
            for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", code.split("install.sh", 1)[1].split("#")[0]):
                assert option in known, f"{page.name}: `{code}`: install.sh has no {option}"
    # and the README's own mentions in prose (`--uninstall`, `--purge`, ...)
    readme_options = set(re.findall(r"`(--[a-z][a-z-]*)", _section(README.read_text(), "Upgrade and uninstall")))
    assert readme_options and readme_options <= known, readme_options - known


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_named_exists(page: Path) -> None:
    pattern = re.compile(rf"^(?:{'|'.join(re.escape(d) for d in TOP_DIRS)})/[\w./*~-]*$")
    for code in _code(page):
        for word in code.split():
            word = word.strip("(),;:'\"")
            if not pattern.match(word) or "<" in word:
                continue
            assert glob.glob(str(REPO / word)), f"{page.name}: `{code}` names {word}, which is not in the tree"


def test_the_two_commands_are_what_ci_and_the_demo_run() -> None:
    two = _section(README.read_text(), "Two commands")
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    assert "\n    bash scripts/test.sh " in two and "\n    scripts/demo.sh " in two
    assert "netplugin demo" in (REPO / "scripts" / "demo.sh").read_text()


def test_the_troubleshooting_messages_are_netplugins_own() -> None:
    """Each message the table quotes is one netplugin prints (its placeholders, and what the source
    fills in, such as the mode's ``group-``, aside)."""
    table = _section(README.read_text(), "Troubleshooting")
    sources = "".join(p.read_text() for p in (REPO / "netplugin").rglob("*.py"))
    rows = re.findall(r"^\| (?!you see)([^|]+) \|(?!-)", table, re.M)
    assert len(rows) == 5, rows
    quoted = [[m for m in re.findall(r"`([^`]+)`", row) if not m.startswith("netplugin ")] for row in rows]
    assert all(quoted), rows
    for message in (m for row in quoted for m in row):
        for fragment in re.split(r"\b(?:NAME|PATH|TIME|KEY|group-)|\.\.\.|[0-9]+|reason|[():,]", message):
            fragment = fragment.strip(" '():,")
            if len(fragment) >= 8:
                assert fragment in sources, f"{message!r}: {fragment!r} is not in netplugin's source"


# --- docs/config.md is the defaults ------------------------------------------------------------------


def _shown(value: Any) -> str:
    """A default as docs/config.md writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) if value else "{}"
    return str(value)


def test_the_config_page_lists_every_key_with_its_default_variable_and_flag() -> None:
    page = (REPO / "docs" / "config.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \|([^|]*)\|([^|]*)\|([^|]*)\|", page, re.M)
    assert [key for key, *_ in rows] == list(PARSERS)
    defaults = Config()
    variables = {key: var for var, key in ENV_VARS.items()}
    flags = {f.config_key: f.names[-1] for f in GLOBAL_VALUE_OPTIONS if f.config_key}
    serve = cli.get_command(click.Context(cli), "serve")
    assert serve is not None
    for key, default, variable, flag in rows:
        assert default.strip().strip("`") == _shown(getattr(defaults, key)), key
        assert variable.strip().strip("`") == variables.get(key, ""), key
        flag = flag.strip().strip("`")
        if key in flags:
            assert flag == flags[key], key
        elif flag:
            assert flag.startswith("serve ") and flag.split()[1] in _command_options(serve), key
