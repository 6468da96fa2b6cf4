"""Validators of outside input, plugin-name escaping, and PodRef."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from netplugin.core import plaindata
from netplugin.core._yaml import short_repr
from netplugin.core.errors import InvalidArgument
from netplugin.core.names import (
    MAX_INFRA_ID,
    PodRef,
    escape_plugin_name,
    plugin_dir_and_exe,
    plugin_name_problem,
    unescape_plugin_name,
    validate_infra_id,
    validate_namespace,
    validate_plugin_name,
    validate_pod_name,
)

LABEL_63 = "a" * 63
SUBDOMAIN_253 = ".".join(["a" * 63] * 3 + ["a" * 61])  # 63*3 + 61 + 3 dots = 253

VALID = [
    # (validator, value)
    (validate_namespace, "default"),
    (validate_namespace, "a"),
    (validate_namespace, "kube-system"),
    (validate_namespace, "0ns9"),
    (validate_namespace, LABEL_63),
    (validate_pod_name, "web-0"),
    (validate_pod_name, "a.b.c"),
    (validate_pod_name, "0"),
    (validate_pod_name, SUBDOMAIN_253),
    (validate_infra_id, "abc123"),
    (validate_infra_id, "A.b_c-D"),
    (validate_infra_id, "0"),
    (validate_infra_id, "f" * MAX_INFRA_ID),
    (validate_plugin_name, "bridge"),
    (validate_plugin_name, "kubernetes.io/no-op"),
    (validate_plugin_name, "vendor.example/foo"),
    (validate_plugin_name, "A_b.c-D"),
    (validate_plugin_name, "x" * 63),
    (validate_plugin_name, "vendor.example/" + "x" * 63),
]


@pytest.mark.parametrize(("validator", "value"), VALID, ids=lambda v: getattr(v, "__name__", str(v)[:20]))
def test_valid_values_are_returned_unchanged(validator: Callable[[str], str], value: str) -> None:
    assert validator(value) == value


INVALID = [
    # (validator, value, field named in the error, words of the reason)
    (validate_namespace, "", "namespace", "empty"),
    (validate_namespace, "Default", "namespace", "DNS-1123 label"),
    (validate_namespace, "-a", "namespace", "DNS-1123 label"),
    (validate_namespace, "a-", "namespace", "DNS-1123 label"),
    (validate_namespace, "a_b", "namespace", "DNS-1123 label"),
    (validate_namespace, "a.b", "namespace", "DNS-1123 label"),
    (validate_namespace, "a\n", "namespace", "DNS-1123 label"),
    (validate_namespace, "a" * 64, "namespace", "at most 63"),
    (validate_pod_name, "", "pod name", "empty"),
    (validate_pod_name, "Web", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, "a..b", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, ".a", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, "a.", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, "a_b", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, "a/b", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, "web\n", "pod name", "DNS-1123 subdomain"),
    (validate_pod_name, SUBDOMAIN_253 + "a", "pod name", "at most 253"),
    (validate_infra_id, "", "infra container id", "empty"),
    (validate_infra_id, "-abc", "infra container id", "start with a letter or digit"),
    (validate_infra_id, ".abc", "infra container id", "start with a letter or digit"),
    (validate_infra_id, "_abc", "infra container id", "start with a letter or digit"),
    (validate_infra_id, "a/b", "infra container id", "only letters"),
    (validate_infra_id, "a b", "infra container id", "only letters"),
    (validate_infra_id, "abc\n", "infra container id", "only letters"),
    (validate_infra_id, "café", "infra container id", "only letters"),
    (validate_infra_id, "f" * (MAX_INFRA_ID + 1), "infra container id", "at most 128 characters (got 129)"),
    (validate_infra_id, "f" * 248, "infra container id", "at most 128"),  # passed, then broke both bridges
    (validate_plugin_name, "", "plugin name", "empty"),
    (validate_plugin_name, "-bad", "plugin name", "starting and ending alphanumeric"),
    (validate_plugin_name, "bad-", "plugin name", "starting and ending alphanumeric"),
    (validate_plugin_name, "a~b", "plugin name", "alphanumerics"),
    (validate_plugin_name, "a b", "plugin name", "alphanumerics"),
    (validate_plugin_name, "a/b/c", "plugin name", "at most one '/'"),
    (validate_plugin_name, "UPPER/x", "plugin name", "prefix 'UPPER'"),
    (validate_plugin_name, "/x", "plugin name", "prefix ''"),
    (validate_plugin_name, "vendor.example/", "plugin name", "name part must not be empty"),
    (validate_plugin_name, "x" * 64, "plugin name", "at most 63"),
]


@pytest.mark.parametrize(
    ("validator", "value", "field", "reason"), INVALID, ids=lambda v: getattr(v, "__name__", repr(v)[:24])
)
def test_invalid_values_name_the_field_and_the_value(
    validator: Callable[[str], str], value: str, field: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        validator(value)
    err = info.value
    assert err.field == field
    assert err.value == value
    assert reason in err.reason
    # Quoted cut to 80 characters (docs/trust.md, "Input limits"): a huge value never makes a huge message.
    assert err.message.startswith(f"invalid {field} {short_repr(value)}: ")
    assert len(err.to_dict()["value"]) <= 80 and len(err.message) < 80 + len(field) + len(err.reason) + 20
    assert err.to_dict()["field"] == field


@pytest.mark.parametrize("value", [None, 3, ["a"]])
def test_plugin_name_problem_of_non_strings(value: object) -> None:
    # a config file may hold any YAML value where a name belongs: a problem, not a crash
    assert plugin_name_problem(value) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "dirname", "exe"),
    [
        ("bridge", "bridge", "bridge"),
        ("vendor.example/foo", "vendor.example~foo", "foo"),
        ("kubernetes.io/no-op", "kubernetes.io~no-op", "no-op"),
    ],
)
def test_plugin_name_escaping(name: str, dirname: str, exe: str) -> None:
    assert escape_plugin_name(name) == dirname
    assert unescape_plugin_name(dirname) == name
    assert plugin_dir_and_exe(name) == (dirname, exe)


def test_podref_fields_key_and_str() -> None:
    ref = PodRef("default", "web-0", "abc123")
    assert (ref.namespace, ref.name, ref.infra_id) == ("default", "web-0", "abc123")
    assert ref.key == "default_web-0"
    assert str(ref) == "default/web-0"
    assert ref == PodRef("default", "web-0", "abc123")
    assert hash(ref) == hash(PodRef("default", "web-0", "abc123"))


def test_podref_keys_of_different_pods_differ() -> None:
    # '_' is in neither a namespace nor a pod name, so the key cannot be ambiguous
    assert PodRef("a-b", "c", "x").key != PodRef("a", "b-c", "x").key
    assert PodRef("a", "b.c", "x").key != PodRef("a", "b", "x").key


def test_podref_is_frozen() -> None:
    ref = PodRef("default", "web-0", "abc123")
    with pytest.raises(plaindata.FrozenInstanceError):
        ref.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("Bad_NS", "web-0", "abc"), "namespace"),
        (("", "web-0", "abc"), "namespace"),
        (("default", "Web", "abc"), "pod name"),
        (("default", "web-0", "-abc"), "infra container id"),
        (("default", "web-0", ""), "infra container id"),
        (("default", "web-0", "../../etc"), "infra container id"),
    ],
)
def test_podref_validates_every_field(args: tuple[str, str, str], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        PodRef(*args)
    assert info.value.field == field


def test_a_huge_argument_is_quoted_short() -> None:
    for validate in (validate_infra_id, validate_namespace, validate_pod_name, validate_plugin_name):
        with pytest.raises(InvalidArgument) as info:
            validate("a" * 1_000_000)
        assert len(info.value.message) < 500
