"""netplugin.frontends.wire.codes: the one home of the exit codes and the CNI error codes, as data."""

from __future__ import annotations

import inspect

import pytest

from netplugin.core import errors as E
from netplugin.frontends.cni.spec import error_for
from netplugin.frontends.wire import codes


def _error_classes() -> dict[str, type]:
    return {n: c for n, c in inspect.getmembers(E, inspect.isclass) if issubclass(c, E.NetpluginError)}


@pytest.mark.parametrize("table", [codes.EXIT_CODES, codes.CNI_CODES], ids=["exit", "cni"])
def test_every_class_a_table_names_exists(table: dict[str, int]) -> None:
    """A renamed error class would otherwise fall silently to the table's default."""
    known = {*_error_classes(), "InternalError"}  # InternalError: a class only the daemon reports
    assert set(table) <= known, set(table) - known


def _make(cls: type, **kw: object) -> E.NetpluginError:
    """An instance of ``cls`` without knowing its constructor: the base's, then the class set."""
    err = E.NetpluginError.__new__(cls)
    E.NetpluginError.__init__(err, "boom")
    for k, v in kw.items():
        setattr(err, k, v)
    return err


# (class, command, the CNI code): what error_for answered as an if-chain, kept as the table's contract
CASES = [
    (E.PluginTimeout, "ADD", codes.CNI_TRY_AGAIN),
    (E.PluginFailed, "ADD", codes.CNI_INTERNAL),
    (E.PluginOutputError, "DEL", codes.CNI_INTERNAL),
    (E.ConfigError, "ADD", codes.CNI_INVALID_CONFIG),
    (E.PluginNotFound, "ADD", codes.CNI_INVALID_CONFIG),
    (E.PluginInvalid, "CHECK", codes.CNI_INVALID_CONFIG),
    (E.ChainInvalid, "ADD", codes.CNI_INVALID_CONFIG),
    (E.InvalidArgument, "ADD", codes.CNI_INVALID_ENV),
    (E.HostError, "ADD", codes.CNI_TRY_AGAIN),
    (E.DiscoveryError, "ADD", codes.CNI_IO_FAILURE),
    (E.SystemFailure, "GC", codes.CNI_IO_FAILURE),
    (E.StateError, "DEL", codes.CNI_IO_FAILURE),
    (E.DaemonUnavailable, "ADD", codes.CNI_INTERNAL),
    (E.NetpluginError, "ADD", codes.CNI_INTERNAL),
    (E.PluginTimeout, "STATUS", codes.CNI_PLUGIN_UNAVAILABLE),
    (E.ConfigError, "STATUS", codes.CNI_INVALID_CONFIG),
]


@pytest.mark.parametrize(("cls", "command", "code"), CASES, ids=[f"{c.__name__}-{m}" for c, m, _ in CASES])
def test_error_for_maps_each_class_to_its_cni_code(cls: type, command: str, code: int) -> None:
    extra: dict[str, object] = {"stderr_tail": "", "stdout_tail": ""} if issubclass(cls, E.PluginError) else {}
    if issubclass(cls, E.InvalidArgument):
        extra["field"] = "namespace"
    assert error_for(_make(cls, **extra), command).code == code


def test_a_bad_plugin_name_is_a_config_error() -> None:
    err = _make(E.InvalidArgument, field="plugin name")
    assert error_for(err, "ADD").code == codes.CNI_INVALID_CONFIG
    assert error_for(_make(E.InvalidArgument, field="namespace"), "ADD").code == codes.CNI_INVALID_ENV


def test_error_classes_stop_at_the_base() -> None:
    assert codes.error_classes(E.ChainInvalid) == ["ChainInvalid", "PluginInvalid", "NetpluginError"]
    assert codes.exit_code_for(_make(E.ChainInvalid)) == codes.EXIT_NOT_FOUND


def test_the_compiled_shim_takes_its_cni_codes_from_the_generated_header() -> None:
    import re
    from pathlib import Path

    from netplugin.frontends.cni.native import source_path
    from netplugin.frontends.wire.protocol import c_header

    header = c_header()
    assert f"#define NPF_E_IO {codes.CNI_IO_FAILURE}\n" in header
    assert f"#define NPF_E_TRY_AGAIN {codes.CNI_TRY_AGAIN}\n" in header
    source = Path(source_path()).read_text()
    assert re.findall(r"cni_fail\(\s*\d", source) == []  # no literal code beside the named ones
    assert "cni_fail(NPF_E_IO," in source
