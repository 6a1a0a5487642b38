"""Goodput past capacity through ``stormguard gateway``: bench_overload's load, with
the gateway's priority and overload stage on the upstream (``on``) or without it.

    python -m bench overload-gateway [--quick]
"""

from __future__ import annotations

from bench.bench_overload import main_gateway as main

__all__ = ["main"]
