# A channel's gRPC service config (JSON), read by the interceptors so that a
# grpcio user's existing config means the same thing under stormguard (gRPC A6,
# grpc/proposal A6-client-retries.md; the fields of grpc/grpc-proto
# grpc/service_config/service_config.proto):
#
#   methodConfig[].name          [{"service": S, "method": M}] -- M exact first,
#                                then {"service": S}, then {} (every method)
#   methodConfig[].timeout       "1.5s": the call's deadline across attempts
#   methodConfig[].retryPolicy   maxAttempts (2..; more than 5 counts as 5),
#                                initialBackoff, maxBackoff, backoffMultiplier,
#                                retryableStatusCodes -> attempts, the backoff
#                                random(0, min(initial * multiplier**(n-1), max)),
#                                and the codes retried for that method whatever
#                                `idempotent` says (the service owner chose them)
#   methodConfig[].hedgingPolicy maxAttempts, hedgingDelay, nonFatalStatusCodes
#                                (client/_hedge.py)
#   retryThrottling              maxTokens, tokenRatio -> one RetryThrottling for
#                                every call of the interceptor (per server name)
#
# A method the config names without a retryPolicy is not retried, as in gRPC. An
# invalid config fails at construction with ConfigError naming the field
# ("service_config.methodConfig[0].retryPolicy.maxAttempts"). `channel_options()`
# builds the channel's own options to go with it: gRPC's retries off (one
# component decides, and grpcio then passes grpc-previous-rpc-attempts on) and
# the config without the parts stormguard performs.
from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from .._errors import ConfigError
from ..core._policy import RetryPolicy
from ..protection._quota import RetryThrottling

__all__ = ["A6Backoff", "Hedging", "MethodSettings", "ServiceConfig", "channel_options"]

# gRPC's client-side ceiling on maxAttempts (A6, "Limits on Retries and Hedges").
MAX_ATTEMPTS = 5
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)s\s*")
_PERFORMED = ("retryPolicy", "hedgingPolicy")


@dataclass(frozen=True, slots=True)
class A6Backoff:
    """gRPC A6's backoff: ``uniform(0, min(initial * multiplier**(n-1), cap))``."""

    initial: float
    cap: float
    multiplier: float

    def delay(self, failures: int, rng: random.Random, previous: float | None = None) -> float:
        """A uniform draw under the n-th ceiling."""
        ceiling = self.initial
        for _ in range(min(failures, 64) - 1):
            ceiling *= self.multiplier
            if ceiling >= self.cap:
                break
        return rng.uniform(0.0, min(ceiling, self.cap))


@dataclass(frozen=True, slots=True)
class Hedging:
    """A method's hedgingPolicy: up to ``attempts`` copies, ``delay`` apart; an
    answer with a ``non_fatal`` code sends the next copy at once."""

    attempts: int
    delay: float
    non_fatal: frozenset[grpc.StatusCode]


@dataclass(frozen=True, slots=True)
class MethodSettings:
    """What the config says of one method (``None`` fields: it says nothing)."""

    attempts: int | None = None
    backoff: A6Backoff | None = None
    codes: frozenset[grpc.StatusCode] | None = None
    timeout: float | None = None
    hedging: Hedging | None = None

    def policy(self, base: RetryPolicy, throttling: RetryThrottling | None) -> RetryPolicy:
        """``base`` as this method's config changes it."""
        changes: dict[str, Any] = {"attempts": self.attempts or 1}
        if self.backoff is not None:
            changes["backoff"] = self.backoff
            changes["throttle_backoff"] = None
        if self.timeout is not None:
            changes["deadline"] = min(base.deadline_s, self.timeout)
        if throttling is not None:
            changes["budget"] = throttling
        return base.replace(**changes)


def _duration(value: object, field: str) -> float:
    # proto3 JSON Duration: decimal seconds with an "s" suffix ("0.1s", "1s").
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(field, f'must be a duration such as "0.5s", got {value!r}')
    seconds = float(match[1])
    if seconds <= 0:
        raise ConfigError(field, f"must be > 0 seconds, got {value!r}")
    return seconds


def _number(value: object, field: str, *, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > low:
        raise ConfigError(field, f"must be a number > {low:g}, got {value!r}")
    return float(value)


def _attempts(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigError(field, f"must be an integer >= 2, got {value!r}")
    return min(value, MAX_ATTEMPTS)


def _codes(value: object, field: str) -> frozenset[grpc.StatusCode]:
    if not isinstance(value, list) or not value:
        raise ConfigError(field, f"must be a non-empty list of status codes, got {value!r}")
    codes = set()
    by_number = {code.value[0]: code for code in grpc.StatusCode}
    for item in value:
        code = None
        if isinstance(item, str):
            code = grpc.StatusCode.__members__.get(item.strip().upper())
        elif isinstance(item, int) and not isinstance(item, bool):
            code = by_number.get(item)
        if code is None or code is grpc.StatusCode.OK:
            raise ConfigError(field, f"{item!r} is not a gRPC status code")
        codes.add(code)
    return frozenset(codes)


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(field, f"must be an object, got {value!r}")
    return value


def _retry_policy(raw: object, field: str) -> dict[str, Any]:
    policy = _mapping(raw, field)
    initial = _duration(policy.get("initialBackoff"), f"{field}.initialBackoff")
    cap = _duration(policy.get("maxBackoff"), f"{field}.maxBackoff")
    multiplier = _number(policy.get("backoffMultiplier"), f"{field}.backoffMultiplier", low=0)
    return {
        "attempts": _attempts(policy.get("maxAttempts"), f"{field}.maxAttempts"),
        "backoff": A6Backoff(initial, max(cap, initial), multiplier),
        "codes": _codes(policy.get("retryableStatusCodes"), f"{field}.retryableStatusCodes"),
    }


def _hedging_policy(raw: object, field: str) -> Hedging:
    policy = _mapping(raw, field)
    delay = policy.get("hedgingDelay", "0s")
    non_fatal = policy.get("nonFatalStatusCodes")
    return Hedging(
        attempts=_attempts(policy.get("maxAttempts"), f"{field}.maxAttempts"),
        delay=0.0 if delay in ("0s", None) else _duration(delay, f"{field}.hedgingDelay"),
        non_fatal=_codes(non_fatal, f"{field}.nonFatalStatusCodes") if non_fatal else frozenset(),
    )


def _names(raw: object, field: str) -> list[tuple[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(field, f"must be a non-empty list of names, got {raw!r}")
    names = []
    for index, item in enumerate(raw):
        name = _mapping(item, f"{field}[{index}]")
        service, method = name.get("service", ""), name.get("method", "")
        if not isinstance(service, str) or not isinstance(method, str) or (method and not service):
            raise ConfigError(f"{field}[{index}]", f"a method needs its service, got {item!r}")
        names.append((service, method))
    return names


def _document(config: str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError as exc:
            raise ConfigError("service_config", f"is not valid JSON: {exc}") from None
    return _mapping(config, "service_config")


class ServiceConfig:
    """A parsed service config: per-method settings, and the retry throttling."""

    __slots__ = ("_by_name", "throttling")

    def __init__(self, config: str | Mapping[str, Any]) -> None:
        document = _document(config)
        self._by_name: dict[tuple[str, str], MethodSettings] = {}
        self.throttling: RetryThrottling | None = None
        throttling = document.get("retryThrottling")
        if throttling is not None:
            raw = _mapping(throttling, "service_config.retryThrottling")
            try:
                self.throttling = RetryThrottling(
                    max_tokens=raw.get("maxTokens"),  # type: ignore[arg-type]
                    token_ratio=raw.get("tokenRatio"),  # type: ignore[arg-type]
                )
            except ConfigError as exc:
                field = {"max_tokens": "maxTokens", "token_ratio": "tokenRatio"}[exc.field]
                raise ConfigError(f"service_config.retryThrottling.{field}", str(exc)) from None
        entries = document.get("methodConfig", [])
        if not isinstance(entries, list):
            raise ConfigError("service_config.methodConfig", "must be a list")
        for index, raw_entry in enumerate(entries):
            field = f"service_config.methodConfig[{index}]"
            entry = _mapping(raw_entry, field)
            settings: dict[str, Any] = {}
            if entry.get("timeout") is not None:
                settings["timeout"] = _duration(entry["timeout"], f"{field}.timeout")
            retry, hedge = entry.get("retryPolicy"), entry.get("hedgingPolicy")
            if retry is not None and hedge is not None:
                raise ConfigError(field, "takes a retryPolicy or a hedgingPolicy, not both")
            if retry is not None:
                settings.update(_retry_policy(retry, f"{field}.retryPolicy"))
            if hedge is not None:
                settings["hedging"] = _hedging_policy(hedge, f"{field}.hedgingPolicy")
            for name in _names(entry.get("name"), f"{field}.name"):
                self._by_name.setdefault(name, MethodSettings(**settings))

    def for_method(self, method: str) -> MethodSettings | None:
        """The settings of ``method`` (``"/pkg.Service/Method"``): its own entry, its
        service's, or the default one; None when the config names it nowhere."""
        service, _, name = method.lstrip("/").partition("/")
        by_name = self._by_name
        return by_name.get((service, name)) or by_name.get((service, "")) or by_name.get(("", ""))


def channel_options(
    service_config: str | Mapping[str, Any] | None = None,
) -> list[tuple[str, Any]]:
    """Options for the channel a stormguard interceptor retries on.

    gRPC's own retries are switched off (``grpc.enable_retries`` 0): stormguard
    decides alone, as the requests adapter switches urllib3's off, and grpcio
    then passes the interceptor's ``grpc-previous-rpc-attempts`` on (its retry
    filter replaces it otherwise). With ``service_config``, the channel keeps the
    rest of that config (load balancing, ``waitForReady``, timeouts) without the
    ``retryPolicy``/``hedgingPolicy``/``retryThrottling`` the interceptor
    performs from the same document::

        channel = grpc.insecure_channel(target, options=channel_options(config))
        channel = grpc.intercept_channel(channel, RetryInterceptor(service_config=config))
    """
    options: list[tuple[str, Any]] = [("grpc.enable_retries", 0)]
    if service_config is None:
        return options
    ServiceConfig(service_config)  # validated as the interceptor will read it
    document = dict(_document(service_config))
    document.pop("retryThrottling", None)
    entries = []
    for entry in document.get("methodConfig", []):
        kept = {key: value for key, value in entry.items() if key not in _PERFORMED}
        entries.append(kept)
    if "methodConfig" in document:
        document["methodConfig"] = entries
    options.append(("grpc.service_config", json.dumps(document)))
    return options
