"""The environment an exec plugin gets: inherited (or the safe few), the config's ``env:``, and ours.

See the contract's "Environment" (``docs/plugin-contract.md``). Built-in plugins get the same
environment in ``CallContext.env``.
"""

from __future__ import annotations

# Imports inside this module's functions are kept for the per-call import set
# (tests/frontends/fastpath.py): each keeps a module off the calls that do not need it
# (BENCHMARKS.md rows B-i and B: the CLI's cold start and per-pod run without a daemon).
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from netplugin.core.chaining import CHAIN_ENV
from netplugin.core.names import PodRef
from netplugin.core.plugin import Action, CallContext

if TYPE_CHECKING:
    from netplugin.core.config import Config

__all__ = ["base_env", "call_env"]

_SAFE_ENV = ("PATH", "LANG", "LC_ALL", "TZ")
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_OWN_ENV = frozenset(
    {
        "NETPLUGIN_CONFIG",
        "NETPLUGIN_OUTPUT",
        "NETPLUGIN_VERBOSE",
        "NETPLUGIN_ACTION",
        "NETPLUGIN_PLUGIN",
        "NETPLUGIN_POD_NAMESPACE",
        "NETPLUGIN_POD_NAME",
        "NETPLUGIN_INFRA_ID",
        "NETPLUGIN_NETNS",
        "NETPLUGIN_CALL_ID",
        "NETPLUGIN_HOST_PORTS",  # the pod's own, set per call
        # set from the host at every call; an outer value must never leak in
        "NETPLUGIN_NODE_NAME",
        "NETPLUGIN_NODE_POD_CIDRS",
        "NETPLUGIN_NODE_INTERNAL_IPS",
        *CHAIN_ENV,
    }
)


def base_env(config: Config, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment common to every call: inherited (or the safe few), the config's env, and ours."""
    parent = os.environ if parent is None else parent
    env = dict(parent) if config.inherit_env else {k: parent[k] for k in _SAFE_ENV if k in parent}
    # Without PATH a bash plugin falls back to bash's built-in default, which includes ".".
    env.setdefault("PATH", _DEFAULT_PATH)
    # netplugin's own settings and per-call variables from an outer call are not the plugin's
    # business, and a stale value could mislead it; plugin settings (NETPLUGIN_BRIDGE_*) pass.
    from netplugin.core.config import ENV_VARS

    for k in [k for k in env if k in ENV_VARS or k in _OWN_ENV]:
        del env[k]
    env.update(config.env)
    env["NETPLUGIN_STATE_DIR"] = config.state_dir
    return env


def call_env(ctx: CallContext, plugin: str, action: Action, pod: PodRef | None) -> dict[str, str]:
    env = dict(ctx.env)
    env["NETPLUGIN_ACTION"] = action.value
    env["NETPLUGIN_PLUGIN"] = plugin
    if pod is not None:
        env["NETPLUGIN_POD_NAMESPACE"] = pod.namespace
        env["NETPLUGIN_POD_NAME"] = pod.name
        env["NETPLUGIN_INFRA_ID"] = pod.infra_id
        env["NETPLUGIN_NETNS"] = ctx.netns
    return env
