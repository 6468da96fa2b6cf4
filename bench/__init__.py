"""netplugin's benchmark harness: ``python -m bench`` (or ``netplugin bench``), as root.

It measures, in one run and interleaved so that machine drift cancels, five ways of wiring
pods to a Linux bridge (see :mod:`bench.contenders`): A the reference CNI bridge + host-local
plugins, B the netplugin CLI with the bash bridge plugin, C the daemon with it, D the daemon
with the native plugin, E the pyroute2 floor. It writes ``BENCHMARKS.md`` (figures, ratios to
A, and which of the issue's targets are met or missed), ``results.json`` and a PNG plot of each
figure :data:`bench.plotspec.PLOTS` names, with the numbers it draws beside it as JSON.

Everything it creates carries a tag unique to the run (``np`` + 6 hex digits), uses subnets
inside 10.202.0.0/16 only, and is removed in ``finally`` blocks, on errors and on Ctrl-C too:
network namespaces, veths, bridges, IPAM and state dirs, daemon processes.

Usage::

    python -m bench [--quick] [--out DIR] [--pods N] [--only FIGURES] [--contenders KEYS] [--no-plots]

``--quick`` is the CI smoke size (a few pods, well under a minute). Without ``--out`` the
report goes to the checkout: ``BENCHMARKS.md``, ``bench/plots/*.png`` and ``*.json``,
``bench/out/results.json``. Plots need matplotlib (the ``bench`` extra): without it a run is
refused before it starts, unless ``--no-plots``.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the process exit status (0 also when targets are missed)."""
    from .runner import run

    return run(argv)
