# Vendor profiles: RetryPolicy.for_api(name) -- the retry behaviour each vendor's
# own SDK follows, as RetryPolicy keywords. Each row names the SDK file it was
# read from (docs/client/vendors.md carries the same table, with what differs).
#
#   openai     openai/openai-python src/openai/_base_client.py (_should_retry,
#              _calculate_retry_timeout) and src/openai/_constants.py:
#              2 retries; 408, 409, 429, >= 500 and x-should-retry; retry-after-ms
#              then Retry-After honoured up to 120 s; else
#              min(0.5 * 2**n, 8) * (1 - 0.25 * random())
#   anthropic  anthropics/anthropic-sdk-python src/anthropic/_base_client.py and
#              src/anthropic/_constants.py: the same, Retry-After up to 60 s
#              (529 "overloaded" is >= 500)
#   stripe     stripe/stripe-python stripe/_http_client.py (_should_retry,
#              _sleep_time_seconds) and stripe/__init__.py (max_network_retries
#              = 2): Stripe-Should-Retry, 409 and >= 500;
#              max(0.5, min(0.5 * 2**(n-1), 5) * uniform(0.5, 1)); the SDK sends
#              an Idempotency-Key on every POST
#   github     octokit/plugin-retry.js src/index.ts, src/error-request.ts,
#              src/wrap-request.ts (3 retries, (n)**2 s apart, every status >= 400
#              but 400, 401, 403, 404, 410, 422, 451) and
#              octokit/plugin-throttling.js src/index.ts (a rate-limit 403/429
#              waits for x-ratelimit-reset or Retry-After)
#   aws        aws/aws-sdk-net sdk/src/Core/Amazon.Runtime/Pipeline/RetryHandler/
#              StandardRetryPolicy.cs (the 2026 standard mode,
#              AWS_NEW_RETRIES_2026) and boto/botocore botocore/retries/
#              standard.py (3 attempts; 500, 502, 503, 504 and throttling codes):
#              jitter * min(base * 2**(n-1), 20 s), base 1 s after a throttle and
#              50 ms otherwise; x-amz-retry-after; the retry quota (RetryQuota)
#
# What stormguard keeps whatever the profile (docs/client/vendors.md): a POST
# without an Idempotency-Key is retried only on failures that prove it was not
# processed (429, a connection never made) or when the server says
# x-should-retry / Stripe-Should-Retry: true; a hint longer than max_wait ends
# the call with the last answer instead of being shortened or ignored.
#
# The AWS quota is a runtime object (protection/_quota.py); core cannot build it,
# so protection registers its factory here when it is imported (which
# `import stormguard` always does).
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ._backoff import FullJitter, _ceiling

__all__ = ["BUDGETS", "PROFILES", "GitHubBackoff", "StainlessBackoff", "StripeBackoff", "profile"]

# Factories of the budgets a profile names ("retry_quota": RetryQuota).
BUDGETS: dict[str, Callable[[], Any]] = {}

_SERVER_ERRORS = frozenset(range(500, 600))


@dataclass(frozen=True, slots=True)
class StainlessBackoff:
    """OpenAI's and Anthropic's SDKs: ``min(base * 2**(n-1), cap) * (1 - 0.25 * U)``."""

    base: float = 0.5
    cap: float = 8.0

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """Between 75 % and 100 % of the n-th ceiling."""
        return _ceiling(self.base, self.cap, failures) * (1.0 - 0.25 * rng.random())


@dataclass(frozen=True, slots=True)
class StripeBackoff:
    """Stripe's SDK: ``max(base, min(base * 2**(n-1), cap) * uniform(0.5, 1))``."""

    base: float = 0.5
    cap: float = 5.0

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """Half to all of the n-th ceiling, never under ``base``."""
        return max(self.base, _ceiling(self.base, self.cap, failures) * rng.uniform(0.5, 1.0))


@dataclass(frozen=True, slots=True)
class GitHubBackoff:
    """octokit's retry plugin: ``n**2 * base`` seconds after the n-th failure (1, 4, 9)."""

    base: float = 1.0

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """The square of the failure count, in ``base`` units (no jitter, as octokit)."""
        return float(min(failures, 1_000) ** 2) * self.base


# name -> RetryPolicy keywords ("budget" names a BUDGETS factory).
PROFILES: dict[str, dict[str, Any]] = {
    "openai": {
        "attempts": 3,
        "backoff": StainlessBackoff(0.5, 8.0),
        "max_wait": 120.0,
        "deadline": 300.0,
        "retry_statuses": frozenset({408, 409, 429}) | _SERVER_ERRORS,
    },
    "anthropic": {
        "attempts": 3,
        "backoff": StainlessBackoff(0.5, 8.0),
        "max_wait": 60.0,
        "deadline": 180.0,
        "retry_statuses": frozenset({408, 409, 429}) | _SERVER_ERRORS,
    },
    "stripe": {
        "attempts": 3,
        "backoff": StripeBackoff(0.5, 5.0),
        "max_wait": 60.0,
        "deadline": 120.0,
        "retry_statuses": frozenset({409}) | _SERVER_ERRORS,
    },
    "github": {
        "attempts": 4,
        "backoff": GitHubBackoff(1.0),
        "max_wait": 60.0,
        "deadline": 180.0,
        "retry_statuses": frozenset({408, 409, 425, 429}) | _SERVER_ERRORS,
    },
    "aws": {
        "attempts": 3,
        "backoff": FullJitter(0.05, 20.0),
        "throttle_backoff": FullJitter(1.0, 20.0),
        "max_wait": 25.0,
        "deadline": 120.0,
        "retry_statuses": frozenset({429, 500, 502, 503, 504}),
        "budget": "retry_quota",
    },
}


def profile(name: str) -> dict[str, Any]:
    """The RetryPolicy keywords of ``name`` (its budget built anew); ConfigError
    naming ``api`` for an unknown one."""
    if not isinstance(name, str) or name.lower() not in PROFILES:
        raise ConfigError("api", f"must be one of {sorted(PROFILES)}, got {name!r}")
    keywords = dict(PROFILES[name.lower()])
    budget = keywords.get("budget")
    if isinstance(budget, str):
        keywords["budget"] = BUDGETS[budget]()
    return keywords
