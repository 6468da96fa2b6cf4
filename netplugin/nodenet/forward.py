"""Pod traffic through hosts whose FORWARD policy is DROP (Docker, ufw, firewalld): accepted in a chain
netplugin owns, the way CNI's ``firewall`` plugin does it.

In detail: ``ARCHITECTURE.md``, "Module notes".
"""

from __future__ import annotations

import ipaddress
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from netplugin.core.errors import TAIL, InvalidArgument, NetpluginError
from netplugin.core.netns import in_netns
from netplugin.nodenet.policyagents import KNOWN

__all__ = ["CHAIN", "COMMENT", "Forward", "ForwardError", "ForwardState"]

CHAIN = "NETPLUGIN-FORWARD"
COMMENT = "netplugin pod forwarding"
_CHAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,27}\Z")
_COMMANDS = {4: "iptables", 6: "ip6tables"}
#: the FORWARD chains of NetworkPolicy agents, which must see a packet before our accepts do
POLICY_CHAINS = frozenset(c for agent in KNOWN for c in agent.iptables_chains)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ForwardError(NetpluginError):
    """iptables failed or timed out; carries the command's stderr tail."""


@dataclass(frozen=True, slots=True)
class ForwardState:
    """One family's FORWARD as found: its policy, whether it jumps to the chain, what the chain accepts."""

    version: int
    present: bool
    policy: str = ""
    jumps: int = 0
    accepted: tuple[str, ...] = ()

    def problem(self, cidrs: Iterable[Network]) -> str | None:
        """Why pod traffic of this family may be dropped (None: it is not), for ``doctor``."""
        want = sorted({str(n) for n in cidrs if n.version == self.version})
        if not self.present or self.policy != "DROP" or not want:
            return None
        cmd = _COMMANDS[self.version]
        if self.jumps == 0:
            return f"{cmd} FORWARD policy is DROP and does not jump to {CHAIN}: pod traffic through the node is dropped"
        missing = [c for c in want if c not in self.accepted]
        if missing:
            return f"{cmd} FORWARD policy is DROP and {CHAIN} does not accept {', '.join(missing)}"
        return None


def _collapse(nets: list[Network]) -> list[Network]:
    v4 = ipaddress.collapse_addresses(n for n in nets if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in nets if isinstance(n, ipaddress.IPv6Network))
    return [*v4, *v6]


class Forward:
    """The accept chain of one network namespace (``netns``: a path; default the caller's own)."""

    def __init__(self, chain: str = CHAIN, *, netns: str | None = None, timeout: float = 10.0) -> None:
        if not _CHAIN_NAME.match(chain):
            raise InvalidArgument("chain", chain, "1-28 letters, digits, '_' and '-', starting with a letter")
        self.chain = chain
        self.netns = netns
        self.timeout = timeout

    def __repr__(self) -> str:
        where = f", netns={self.netns!r}" if self.netns else ""
        return f"Forward({self.chain}{where})"

    def apply(self, cidrs: Sequence[Network]) -> None:
        """Accept traffic from and to ``cidrs`` in every family that has some; idempotent."""
        for version, cmd in _COMMANDS.items():
            nets = _collapse([n for n in cidrs if n.version == version])
            if not nets or shutil.which(cmd) is None:
                continue
            lines = ["*filter", f":{self.chain} - [0:0]"]
            for net in nets:
                for flag in ("-s", "-d"):
                    lines.append(f'-A {self.chain} {flag} {net} -m comment --comment "{COMMENT}" -j ACCEPT')
            forward = self._run(cmd, ["-t", "filter", "-S", "FORWARD"], ok_codes=(0, 1)).stdout.splitlines()
            lines += self._placing(forward)
            lines.append("COMMIT")
            self._run(f"{cmd}-restore", ["--noflush"], script="\n".join(lines) + "\n")

    def _placing(self, forward: list[str]) -> list[str]:
        """The restore lines that put our jump after the last policy agent's jump in FORWARD (as
        ``iptables -S FORWARD`` lists it): none when it is there already."""
        rules = [r for r in forward if r.startswith("-A FORWARD ")]
        targets = [r.split(" -j ", 1)[1].split()[0] if " -j " in r else "" for r in rules]
        ours = [i for i, t in enumerate(targets) if t == self.chain]
        policy = [i for i, t in enumerate(targets) if t in POLICY_CHAINS]
        after = max(policy, default=-1)
        if len(ours) == 1 and ours[0] > after:
            return []
        jump = f'FORWARD -m comment --comment "{COMMENT}" -j {self.chain}'
        # Each -D removes the first of ours; the agents' jumps then move up by the ours before them.
        position = after + 1 - sum(1 for i in ours if i < after) + 1
        return [f"-D {jump}" for _ in ours] + [f"-I {jump.replace('FORWARD', f'FORWARD {position}', 1)}"]

    def remove(self) -> None:
        """Delete every jump to the chain and the chain, in both families; idempotent."""
        for cmd in _COMMANDS.values():
            if shutil.which(cmd) is None:
                continue
            jump = ["FORWARD", "-m", "comment", "--comment", COMMENT, "-j", self.chain]
            while self._run(cmd, ["-D", *jump], ok_codes=(0, 1, 2)).returncode == 0:
                pass
            if self._run(cmd, ["-t", "filter", "-S", self.chain], ok_codes=(0, 1, 2)).returncode == 0:
                self._run(cmd, ["-F", self.chain])
                self._run(cmd, ["-X", self.chain])
        for family in ("ip", "ip6"):
            self._drop_empty_filter_table(family)

    def _drop_empty_filter_table(self, family: str) -> None:
        """iptables-nft made ``table <family> filter`` to hold the jump; with no rule and every chain
        accepting, it filters nothing, and it goes too, so the node is left as it was found."""
        if shutil.which("nft") is None:
            return
        argv = ["nft", "-j", "list", "table", family, "filter"]
        argv = in_netns(argv, self.netns)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False)
            items = json.loads(done.stdout or "{}").get("nftables", []) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            raise ForwardError(f"cannot run {' '.join(argv)}: {e}", chain=self.chain) from e
        if not items:
            return  # no such table (or no nft backend): nothing to leave behind
        chains = [i["chain"] for i in items if "chain" in i]
        if any("rule" in i for i in items) or any(c.get("policy", "accept") != "accept" for c in chains):
            return
        self._run("nft", ["delete", "table", family, "filter"], wait=False)

    def check(self) -> list[ForwardState]:
        """Each family's FORWARD as it is now."""
        out: list[ForwardState] = []
        for version, cmd in _COMMANDS.items():
            if shutil.which(cmd) is None:
                out.append(ForwardState(version, present=False))
                continue
            rules = self._run(cmd, ["-t", "filter", "-S"]).stdout.splitlines()
            policy = next((r.split()[2] for r in rules if r.startswith("-P FORWARD ")), "")
            jumps = sum(1 for r in rules if r.startswith("-A FORWARD ") and r.endswith(f"-j {self.chain}"))
            mine = [r.split() for r in rules if r.startswith(f"-A {self.chain} -s ")]
            accepted = tuple(str(ipaddress.ip_network(r[3])) for r in mine)
            out.append(ForwardState(version, True, policy, jumps, accepted))
        return out

    def _run(
        self,
        cmd: str,
        args: list[str],
        *,
        script: str | None = None,
        ok_codes: tuple[int, ...] = (0,),
        wait: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        argv = [cmd, "-w", *args] if wait else [cmd, *args]  # -w: wait for the xtables lock another writer holds
        argv = in_netns(argv, self.netns)
        what = f"{cmd} {' '.join(args)}"
        try:
            done = subprocess.run(
                argv, input=script or "", capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise ForwardError(f"cannot run {what}: no answer within {self.timeout:g}s", chain=self.chain) from None
        except OSError as e:
            raise ForwardError(f"cannot run {what}: {e.strerror or e}", chain=self.chain) from e
        if done.returncode not in ok_codes:
            tail = done.stderr.strip()[-TAIL:]
            raise ForwardError(
                f"{what} exited with status {done.returncode}: {tail or '(no message)'}",
                chain=self.chain,
                exit_status=done.returncode,
                stderr_tail=tail,
            )
        return done
