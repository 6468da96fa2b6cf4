"""The node's one config file, as ``scripts/install.sh`` writes it (``python -m netplugin.frontends.nodeconfig``).

Everything on a node reads this one file: the daemon (``netplugin serve --config FILE``), the CNI
shim (the conflist names it as ``configFile``) and the CLI. The installer owns only the keys its
options describe:

* ``plugin_dir``, ``state_dir``, ``run_dir``: where it installed things, set on every run;
* the chain (``plugin``, or ``plugins`` for more than one member) and ``env``: set when
  ``--plugin`` (repeatable, in chain order) / ``--plugin-env`` are given (``--plugin-env``
  replaces the whole ``env`` map), and on the first run from the shipped example's values
  (``--defaults``, ``etc/netplugin.yaml``).

Every other key a user wrote stays. A file whose settings already are those is not touched (its
comments and layout stay); otherwise each changed key is printed (``change FILE: KEY: OLD -> NEW``)
before the file is replaced atomically, so a rerun with other options says what it changes and
``--dry-run`` shows it. ``--from FILE`` (the DaemonSet's init container: the ConfigMap's content)
copies that file as it is, after checking that its directories are the ones given.

Exit status: 0 done (the first output word says ``unchanged``, ``create``, ``change`` or ``fix``),
2 bad input (names the option or key), 1 the file could not be read or written.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from netplugin.core.config import load_config, read_config_file
from netplugin.core.discovery import scan
from netplugin.core.errors import ConfigError, NetpluginError
from netplugin.core.names import escape_plugin_name
from netplugin.plugins import BUILTINS

__all__ = ["DIR_KEYS", "changes", "main", "merged", "render"]

#: the keys set from the installer's directory options, on every run
DIR_KEYS = ("plugin_dir", "state_dir", "run_dir")
_PLAIN = re.compile(r"[A-Za-z0-9/._~+-]+\Z")
_NOT_PLAIN = re.compile(r"(?i)(true|false|yes|no|on|off|null|~|[-+]?[0-9][0-9._eE+-]*|\.[0-9].*)\Z")
_HEADER = """\
# netplugin's settings on this node (etc/netplugin.yaml in the source documents every key).
# Everything on the node reads this file: the daemon (netplugin serve --config FILE), the CNI
# shim (the conflist's configFile) and the netplugin CLI. After editing it, run
#   systemctl reload netplugin      (the daemon re-reads it; `netplugin doctor` checks the node)
# scripts/install.sh keeps the keys its options set (dirs, plugin, env) and leaves the rest alone.
"""


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and not _NOT_PLAIN.match(text):
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def _block(key: str, value: Any, indent: str = "") -> list[str]:
    if isinstance(value, Mapping):
        if not value:
            return [f"{indent}{key}: {{}}"]
        lines = [f"{indent}{key}:"]
        for k, v in value.items():
            lines += _block(_scalar(k), v, indent + "  ")
        return lines
    if isinstance(value, list | tuple):
        return [f"{indent}{key}: [{', '.join(_scalar(v) for v in value)}]"]
    if value is None:
        return [f"{indent}{key}: null"]
    return [f"{indent}{key}: {_scalar(value)}"]


def render(values: Mapping[str, Any]) -> str:
    """The file's text: the header, the installer's keys first, then every other key as given."""
    lines = [_HEADER.rstrip("\n")]
    order = [*DIR_KEYS, "plugin", "plugins", "env"]
    for key in [*(k for k in order if k in values), *(k for k in values if k not in order)]:
        lines += _block(key, values[key])
    return "\n".join(lines) + "\n"


def merged(
    existing: Mapping[str, Any] | None,
    dirs: Mapping[str, str],
    plugins: list[str] | None,
    env: Mapping[str, str] | None,
    defaults: Mapping[str, Any],
) -> dict[str, Any]:
    """The settings to write: ``existing`` (None: no file yet) with the installer's keys applied.

    ``plugins``: the chain given (one member is written ``plugin: NAME``, more ``plugins: [...]``),
    which replaces the file's; None keeps it, or on the first run takes the example's."""
    out: dict[str, Any] = dict(existing) if existing is not None else {}
    out.update(dirs)
    if plugins:
        out.pop("plugin", None)
        out.pop("plugins", None)
        if len(plugins) == 1:
            out["plugin"] = plugins[0]
        else:
            out["plugins"] = list(plugins)
    elif existing is None:
        for key in ("plugins", "plugin"):
            if defaults.get(key):
                out[key] = list(defaults[key]) if key == "plugins" else defaults[key]
                break
    if env is not None:
        out["env"] = dict(env)
    elif existing is None and isinstance(defaults.get("env"), Mapping):
        out["env"] = {str(k): str(v) for k, v in defaults["env"].items()}
    return out


def _flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``KEY: OLD -> NEW`` for every key (``env.NAME`` for mappings) whose value differs."""
    a, b = _flat(old), _flat(new)
    out = []
    for key in [*a, *(k for k in b if k not in a)]:
        if a.get(key, _UNSET) != b.get(key, _UNSET):
            was, now = (
                json.dumps(x, default=str) if x is not _UNSET else "(unset)"
                for x in (a.get(key, _UNSET), b.get(key, _UNSET))
            )
            out.append(f"{key}: {was} -> {now}")
    return out


_UNSET: Any = object()


def _env_pairs(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError("--plugin-env", f"must be KEY=VALUE with KEY a variable name (got {pair[:80]!r})")
        if "\0" in value or "\n" in value:
            raise ConfigError("--plugin-env", f"{name}: the value must be one line")
        out[name] = value
    return out


def _check(text: str, path: str) -> Any:
    """Validate ``text`` as netplugin's loader does (from a temp file; errors name ``path``); the Config."""
    fd, tmp = tempfile.mkstemp(prefix=".netplugin-config-check.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return load_config(tmp, environ={})
    except ConfigError as e:
        raise ConfigError(e.key, e.reason, source=path) from None
    finally:
        os.unlink(tmp)


def _check_chain(cfg: Any, path: str, shipped: str | None) -> None:
    """Each plugin of ``cfg``'s chain is built in, shipped in ``shipped`` (installed by this run) or
    found and trusted in the exec dir; else ConfigError naming the key, nothing written."""
    def is_shipped(name: str) -> bool:
        if shipped is None:
            return False
        exe = os.path.join(shipped, escape_plugin_name(name), name.rsplit("/", 1)[-1])
        return os.path.isfile(exe) and os.access(exe, os.X_OK)

    missing = [n for n in cfg.chain if n not in BUILTINS and not is_shipped(n)]
    if not missing:
        return
    try:
        found = {c.name: c for c in scan(cfg.plugin_dir, reserved=BUILTINS)} if os.path.isdir(cfg.plugin_dir) else {}
    except NetpluginError as e:
        found, missing = {}, [f"{n} ({e.message})" for n in missing]
    key = "plugins" if cfg.plugins else "plugin"
    for name in missing:
        cand = found.get(name)
        if cand is None:
            where = f"not in {cfg.plugin_dir}" + (f", not shipped in {shipped}" if shipped else "")
            raise ConfigError(key, f"network plugin {name!r} not found ({where})", source=path)
        if cand.problem:
            raise ConfigError(key, f"network plugin {name!r} is not usable: {cand.problem}", source=path)


def _write(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.netplugin-tmp.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if os.geteuid() == 0:
            os.chown(tmp, 0, 0)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _mode_ok(path: str) -> bool:
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()


def _plan(args: argparse.Namespace) -> tuple[str, list[str], str | None]:
    """(verb, detail lines, text to write or None)."""
    path = args.file
    dirs = {"plugin_dir": args.plugin_dir, "state_dir": args.state_dir, "run_dir": args.run_dir}
    exists = os.path.lexists(path)
    if exists and (os.path.islink(path) or not os.path.isfile(path)):
        raise ConfigError("--config", f"{path} exists and is not a regular file")
    if args.source is not None:
        with open(args.source, encoding="utf-8") as f:
            text = f.read()
        cfg = _check(text, path)
        _check_chain(cfg, path, args.plugins_from)
        for key, want in dirs.items():
            if getattr(cfg, key) != want:
                flag = "--exec-dir" if key == "plugin_dir" else "--" + key.replace("_", "-")
                raise ConfigError(key, f"is {getattr(cfg, key)} in {args.source}, but {flag} is {want}")
        if exists:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    return ("unchanged" if _mode_ok(path) else "fix"), [], None if _mode_ok(path) else text
        return ("change" if exists else "create"), [f"copy of {args.source}"], text
    env = _env_pairs(args.plugin_env) if args.plugin_env is not None else None
    defaults = read_config_file(args.defaults) if args.defaults else {}
    old = read_config_file(path) if exists else None
    new = merged(old, dirs, args.plugin, env, defaults)
    text = render(new)
    _check_chain(_check(text, path), path, args.plugins_from)
    if old is not None and not changes(old, new):
        return ("unchanged", [], None) if _mode_ok(path) else ("fix", [], text)
    return ("change" if old is not None else "create"), changes(old or {}, new), text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m netplugin.frontends.nodeconfig", description=__doc__.split("\n")[0])
    p.add_argument("file")
    p.add_argument("--plugin-dir", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--plugin", action="append", help="a member of the chain, repeatable, in order")
    p.add_argument("--plugin-env", action="append", metavar="KEY=VALUE")
    p.add_argument("--defaults", metavar="FILE", help="first-run plugin and env (the shipped example)")
    p.add_argument("--from", dest="source", metavar="FILE", help="copy this config file as it is")
    p.add_argument("--plugins-from", metavar="DIR", help="the exec plugins this install ships (DIR/NAME/NAME)")
    p.add_argument("--dry-run", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.source is not None and (args.plugin is not None or args.plugin_env is not None):
        print("nodeconfig: --from excludes --plugin and --plugin-env", file=sys.stderr)
        return 2
    try:
        verb, details, text = _plan(args)
        would = "would " if args.dry_run else ""
        if verb == "unchanged":
            print(f"unchanged {args.file}")
            return 0
        print(f"{would}{verb} {args.file} (0644)" + (":" if details else ""))
        for line in details:
            print(f"  {line}")
        if text is not None and not args.dry_run:
            _write(args.file, text)
    except ConfigError as e:
        print(f"install.sh: config: {e.message}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"install.sh: config {args.file}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
