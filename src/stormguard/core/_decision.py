# A limiter's answer and how it is written on the wire.
#
# Header shapes (what `headers()` renders):
#   RateLimit-Policy: "per-client";q=100;w=60, "global";q=5000;w=1
#   RateLimit: "per-client";r=41;t=17, "global";r=4990;t=1
#   X-RateLimit-Limit / -Remaining / -Reset   (the binding limit; Reset in seconds)
#   Retry-After                               (only on denial)
# The IETF names follow draft-ietf-httpapi-ratelimit-headers (-08 and later):
# quota `q`, window `w`, remaining `r`, reset `t`. Integers are rounded so that a
# client never comes back early and never believes it has more than it has:
# remaining rounds down, reset and Retry-After round up (Retry-After at least 1).
#
# What `t` means on a denial: since draft -10, "the number of seconds until
# additional quota is made available" -- when the same request would pass, not
# when the quota is whole again (they differ for a sliding window, a token bucket
# and GCRA: a denial with `t=80` and `Retry-After: 32` sends a client that follows
# the draft away 2.5 times too long). So on a denial every denying part's `t`,
# `X-RateLimit-Reset` and `Retry-After` are one number: the hit's retry_after,
# rounded up, at least 1 (a cost that can never fit keeps the time to a whole
# quota, and no Retry-After). An allowed part's `t` is the time to a whole quota.
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from .._errors import ConfigError

__all__ = ["Decision", "combine"]


def _sf_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _up(seconds: float) -> int:
    return math.ceil(seconds - 1e-9) if seconds > 0 else 0


# Decision is an immutable NamedTuple rather than a frozen dataclass: it is built
# on every hit, and on the in-memory hot path a 9-field frozen dataclass costs
# about as much as the whole decision around it (~5x a tuple). Use `_replace` to
# derive one.
class Decision(NamedTuple):
    """The answer of a limiter for one hit.

    ``allowed``: admitted or not. ``limit``: the quota. ``remaining``: what is left
    after this hit. ``reset_after``: seconds until the quota is whole again.
    ``retry_after``: seconds until the same hit would be admitted (0 when allowed;
    ``inf`` when the cost can never fit). ``name`` and ``window`` describe the policy
    for headers; ``lease`` is the token to release for :class:`Concurrency`;
    ``parts`` holds one decision per limit when several were decided together.
    """

    allowed: bool
    limit: float
    remaining: float
    reset_after: float
    retry_after: float
    name: str = "default"
    window: float | None = None
    lease: str | None = None
    parts: tuple[Decision, ...] = ()

    def __bool__(self) -> bool:  # a tuple would always be true
        return self.allowed

    def headers(self) -> dict[str, str]:
        """Response headers: IETF RateLimit/RateLimit-Policy, X-RateLimit-*, Retry-After.

        ``Retry-After`` appears only on denial, and not at all when the hit can
        never be admitted (``retry_after`` is infinite).
        """
        parts = self.parts or (self,)
        policies = []
        limits = []
        for part in parts:
            policy = f"{_sf_string(part.name)};q={math.floor(part.limit)}"
            if part.window is not None:
                policy += f";w={_up(part.window)}"
            policies.append(policy)
            remaining = math.floor(part.remaining + 1e-9)
            limits.append(f"{_sf_string(part.name)};r={remaining};t={part.reset_seconds()}")
        headers = {
            "RateLimit-Policy": ", ".join(policies),
            "RateLimit": ", ".join(limits),
            "X-RateLimit-Limit": str(math.floor(self.limit)),
            "X-RateLimit-Remaining": str(math.floor(self.remaining + 1e-9)),
            "X-RateLimit-Reset": str(self.reset_seconds()),
        }
        if not self.allowed and math.isfinite(self.retry_after):
            headers["Retry-After"] = str(max(1, _up(self.retry_after)))
        return headers

    def reset_seconds(self) -> int:
        """The whole seconds a client is told to wait for more quota (``t``,
        ``X-RateLimit-Reset``): on a denial the same as ``Retry-After`` (when the
        hit would pass: ``retry_after`` rounded up, at least 1), else the time to
        a whole quota (``reset_after`` rounded up)."""
        if not self.allowed and math.isfinite(self.retry_after):
            return max(1, _up(self.retry_after))
        return _up(self.reset_after)


def combine(parts: Sequence[Decision]) -> Decision:
    """One decision for several limits: allowed only if all allowed.

    The binding limit (the denying one that asks to wait longest, else the one with
    least remaining) supplies limit, remaining, reset and name; ``retry_after`` is
    the longest wait among the denials; ``parts`` keeps every decision.
    """
    if len(parts) == 1:
        return parts[0]
    if not parts:
        raise ConfigError("parts", "combine() needs at least one decision")
    denied = [p for p in parts if not p.allowed]
    if denied:
        binding = max(denied, key=lambda p: p.retry_after)
    else:
        binding = min(parts, key=lambda p: p.remaining)
    lease = next((p.lease for p in parts if p.lease), None)
    return binding._replace(allowed=not denied, lease=lease, parts=tuple(parts))
