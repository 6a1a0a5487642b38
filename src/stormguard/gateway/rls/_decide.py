# One ShouldRateLimit call: a RateLimitRequest in, a RateLimitResponse out.
#
# The answer follows envoyproxy/ratelimit field by field:
# * each descriptor is matched in its domain (_config.Domain.find); a request-side
#   limit override (`descriptor.limit`) replaces the configured limit; an unknown
#   domain or descriptor is OK with no limit; `replaces` drops the named limits;
# * `unlimited` is OK with limit_remaining = 2^32-1 and never reaches the store;
#   `requests_per_unit: 0` is OVER_LIMIT without reaching the store;
# * hits are `descriptor.hits_addend` when set (0: look, take nothing), else the
#   request's `hits_addend`, else 1;
# * overall_code is OVER_LIMIT when an enforced descriptor is over its limit, or when
#   every quota_mode descriptor is; shadow_mode descriptors are always OK.
#
# Where stormguard differs, on purpose: every limited descriptor of a request is
# decided in ONE store call, all or nothing -- a request refused by one descriptor
# takes nothing from the others (envoyproxy/ratelimit counts every descriptor, the
# refused ones too, unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is set). Two
# descriptors of one request that name the same counter are one hit of both costs.
# Descriptors with different hits_addend values are one store call per value (Envoy
# sends one value per request unless descriptors override it). A store outage is
# answered by `on_store_error` in the limiters, never by an error of ours.
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..._clock import SYSTEM_CLOCK, Clock
from ...core._decision import Decision, combine
from ...core._limiters import FixedWindow
from ...limiting._limiter import AsyncRateLimiter, OnStoreError
from ...server._refusal import HeaderStyle, limit_headers
from ._config import MAX_UINT32, UNITS, Domain, LimitSpec
from ._pb import base_pb2, rls_pb2
from ._shadow import hit_all

__all__ = ["UNKNOWN_DOMAIN", "Decider", "Outcome", "RequestError", "counter_key"]

Response = rls_pb2.RateLimitResponse
Status = Response.DescriptorStatus
OK, OVER_LIMIT = Response.Code.OK, Response.Code.OVER_LIMIT
# envoy.type.v3.RateLimitUnit (a request's limit override) -> our unit names
_OVERRIDE_UNITS = {1: "second", 2: "minute", 3: "hour", 4: "day", 5: "month", 6: "year"}
_MAX_OVERRIDES = 1024
_MAX_KEY = 512  # longer counter keys are stored by their SHA-256
UNKNOWN_DOMAIN = "(unknown)"


class RequestError(ValueError):
    """A request the protocol forbids (no domain, no descriptors): INVALID_ARGUMENT."""


class Outcome(NamedTuple):
    """What one descriptor of one request came to, for the stats.

    ``result`` is ``allowed``, ``refused``, ``shadow_refused`` or ``unmatched``;
    ``value`` is the counter key the descriptor counted under (empty when unmatched).
    """

    domain: str
    label: str
    result: str
    value: str


def _escape(text: str) -> str:
    # Counter keys join entries with "|" and "="; escape those (and "%") in values.
    if "|" in text or "=" in text or "%" in text:
        return text.replace("%", "%25").replace("|", "%7C").replace("=", "%3D")
    return text


def counter_key(domain: str, entries: tuple[tuple[str, str], ...]) -> str:
    """The store key of a descriptor: ``domain|key=value|key=value`` (escaped).

    Keys longer than 512 characters are replaced by their SHA-256, so a hostile
    descriptor cannot make the store hold huge keys.
    """
    key = _escape(domain) + "".join(f"|{_escape(k)}={_escape(v)}" for k, v in entries)
    if len(key) > _MAX_KEY:
        import hashlib

        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def _duration(seconds: float) -> dict[str, int]:
    # A google.protobuf.Duration of whole seconds, rounded up: a client that waits this
    # long never comes back early.
    return {"seconds": math.ceil(seconds - 1e-9) if seconds > 0 else 0}


def _remaining(value: float) -> int:
    return min(MAX_UINT32, max(0, math.floor(value + 1e-9)))


class Decider:
    """Answers ``RateLimitRequest`` messages for ``domains`` with state in ``store``.

    ``store`` is an async store (``MemoryStore``, ``AsyncRedisStore``): every limit is
    an :class:`AsyncRateLimiter` on it with ``on_store_error`` and ``instances``.
    ``headers`` is the style of ``response_headers_to_add`` (``"ietf"``, ``"github"``,
    ``"both"``) or None for none; ``record`` is told every descriptor's
    :class:`Outcome`.
    """

    def __init__(
        self,
        domains: Mapping[str, Domain],
        store: Any,
        *,
        on_store_error: OnStoreError = "local",
        instances: int = 1,
        headers: HeaderStyle | None = "ietf",
        record: Callable[[Outcome], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.domains = dict(domains)
        self.store = store
        self.on_store_error: OnStoreError = on_store_error
        self.instances = instances
        self.headers = headers
        self.record = record
        self.clock = clock
        self._limiters: dict[str, AsyncRateLimiter] = {}
        for domain in self.domains.values():
            for spec in domain.limits():
                if spec.algorithm is not None:
                    self._limiters[spec.store_name] = self._limiter(spec)
        self._overrides: dict[tuple[str, int, str], tuple[LimitSpec, AsyncRateLimiter]] = {}
        self._wire_limits: dict[tuple[str, int, str], Any] = {}  # current_limit messages

    def _limiter(self, spec: LimitSpec) -> AsyncRateLimiter:
        assert spec.algorithm is not None
        return AsyncRateLimiter(
            spec.algorithm,
            self.store,
            name=spec.store_name,
            on_store_error=self.on_store_error,
            instances=self.instances,
            clock=self.clock,
        )

    @property
    def store_down(self) -> bool:
        """Whether a limiter is in a store outage (answers follow ``on_store_error``)."""
        return any(limiter.store_down for limiter in self._limiters.values())

    def _override(self, domain: str, descriptor: Any) -> tuple[LimitSpec, AsyncRateLimiter] | None:
        # envoyproxy/ratelimit: an override is a fixed window, never shadow, named by
        # the descriptor's keys (values would let requests choose metric labels).
        unit = _OVERRIDE_UNITS.get(descriptor.limit.unit)
        if unit is None:
            return None
        label = ".".join([domain, *(e.key for e in descriptor.entries)]) + ".(override)"
        rpu = descriptor.limit.requests_per_unit
        cached = self._overrides.get((label, rpu, unit))
        if cached is None:
            algorithm = FixedWindow(rpu, UNITS[unit][0]) if rpu > 0 else None
            spec = LimitSpec(label, "", unit, rpu, algorithm=algorithm, store_name=label + "#fw")
            if len(self._overrides) >= _MAX_OVERRIDES:
                self._overrides.clear()
            limiter = self._limiter(spec) if algorithm is not None else None
            cached = self._overrides[(label, rpu, unit)] = (spec, limiter)  # type: ignore[assignment]
        return cached

    async def decide(self, request: Any) -> Any:
        """The ``RateLimitResponse`` for ``request`` (a ``RateLimitRequest``).

        Raises :class:`RequestError` when the request has no domain or no descriptors
        (envoyproxy/ratelimit refuses those too); never raises on store errors.
        """
        name = request.domain
        descriptors = request.descriptors
        if not name:
            raise RequestError("rate limit domain must not be empty")
        if not descriptors:
            raise RequestError("rate limit descriptor list must not be empty")
        domain = self.domains.get(name)
        if domain is None:
            name = UNKNOWN_DOMAIN  # stats never take a label a request chose
        count = len(descriptors)
        statuses: list[Any] = [None] * count
        # per counter: [spec, limiter, key, cost, descriptor indexes]
        counters: dict[tuple[str, str], list[Any]] = {}
        matched: list[tuple[LimitSpec, AsyncRateLimiter | None, str, float] | None] = []
        default_cost = float(request.hits_addend or 1)
        for descriptor in descriptors:
            entries = tuple([(e.key, e.value) for e in descriptor.entries])
            found: tuple[LimitSpec, tuple[str, ...] | None] | None = None
            limiter = None
            if domain is not None and entries:
                if descriptor.HasField("limit"):
                    override = self._override(name, descriptor)
                    if override is not None:
                        spec, limiter = override
                        found = (spec, None)
                else:
                    found = domain.find(entries)
                    if found is not None and found[0].algorithm is not None:
                        limiter = self._limiters[found[0].store_name]
            if found is None:
                matched.append(None)
                continue
            spec, values = found
            cost = (
                float(descriptor.hits_addend.value)
                if descriptor.HasField("hits_addend")
                else default_cost
            )
            if values is not None:  # share_threshold: a pattern stands for the values
                entries = tuple(zip([k for k, _ in entries], values))
            key = counter_key(name, entries)
            matched.append((spec, limiter, key, cost))
        replacing = {r for m in matched if m is not None for r in m[0].replaces}
        decided: list[Decision | None] = [None] * count
        for i, m in enumerate(matched):
            if m is None:
                statuses[i] = Status(code=OK)
                self._record(name, "", "unmatched", "")
                continue
            spec, limiter, key, cost = m
            if spec.unlimited:
                statuses[i] = Status(code=OK, limit_remaining=MAX_UINT32)
                self._record(name, spec.label, "allowed", key)
            elif spec.name and spec.name in replacing:
                matched[i] = None  # replaced: as if unmatched, and nothing counted
                statuses[i] = Status(code=OK)
            elif limiter is None:  # requests_per_unit: 0
                seconds = UNITS[spec.unit][0]
                wait = seconds - self.clock.time() % seconds
                decided[i] = Decision(False, 0.0, 0.0, wait, wait, spec.label, float(seconds))
            else:
                slot = counters.get((spec.store_name, key))
                if slot is None:
                    counters[(spec.store_name, key)] = [spec, limiter, key, cost, [i]]
                else:  # the same counter twice in one request: one hit of both costs
                    slot[3] += cost
                    slot[4].append(i)
        by_cost: dict[float, list[list[Any]]] = {}
        for slot in counters.values():
            by_cost.setdefault(slot[3], []).append(slot)
        for cost, slots in by_cost.items():
            soft = {j for j, slot in enumerate(slots) if slot[0].shadow or slot[0].quota}
            items = [(slot[1], slot[2]) for slot in slots]
            for slot, decision in zip(slots, await hit_all(items, cost, soft)):
                for i in slot[4]:
                    decided[i] = decision
        return self._answer(name, matched, decided, statuses)

    def _answer(
        self,
        domain: str,
        matched: list[tuple[LimitSpec, AsyncRateLimiter | None, str, float] | None],
        decided: list[Decision | None],
        statuses: list[Any],
    ) -> Any:
        over = False
        quota_total = quota_refused = 0
        enforced: list[Decision] = []
        for i, decision in enumerate(decided):
            m = matched[i]
            if decision is None or m is None:
                continue
            spec, _, key, _ = m
            code = OK if decision.allowed else OVER_LIMIT
            if spec.quota:
                quota_total += 1
                quota_refused += code == OVER_LIMIT
            if code == OVER_LIMIT and spec.shadow:
                code = OK
                result = "shadow_refused"
            else:
                result = "allowed" if code == OK else "refused"
                over = over or (code == OVER_LIMIT and not spec.quota)
                enforced.append(decision._replace(name=spec.name or spec.label))
            reset = decision.reset_after if decision.allowed else decision.retry_after
            if not math.isfinite(reset):
                reset = decision.reset_after
            statuses[i] = Status(
                code=code,
                current_limit=self._wire_limit(spec),
                limit_remaining=_remaining(decision.remaining),
                duration_until_reset=_duration(reset),
            )
            self._record(domain, self._label(spec, key), result, key)
        if quota_total and quota_refused == quota_total:
            over = True
        response = Response(overall_code=OVER_LIMIT if over else OK, statuses=statuses)
        if not over:  # an admitted request's headers show no refusal (quota_mode)
            enforced = [part for part in enforced if part.allowed]
        if enforced and self.headers is not None:
            headers = limit_headers(combine(enforced), self.headers, now=self.clock.time())
            response.response_headers_to_add.extend(
                base_pb2.HeaderValue(key=k, value=v) for k, v in headers
            )
        return response

    def _wire_limit(self, spec: LimitSpec) -> Any:
        # The current_limit message of a limit, built once.
        key = (spec.name, spec.requests_per_unit, spec.unit)
        wire = self._wire_limits.get(key)
        if wire is None:
            if len(self._wire_limits) >= _MAX_OVERRIDES:
                self._wire_limits.clear()
            wire = self._wire_limits[key] = Response.RateLimit(
                name=spec.name,
                requests_per_unit=spec.requests_per_unit,
                unit=spec.unit_code,  # type: ignore[arg-type]
            )
        return wire

    @staticmethod
    def _label(spec: LimitSpec, key: str) -> str:
        # detailed_metric: the stats name carries the request's values, as
        # envoyproxy/ratelimit does (an opt-in: it can make many labels).
        return key.replace("|", ".").replace("=", "_") if spec.detailed else spec.label

    def _record(self, domain: str, label: str, result: str, value: str) -> None:
        if self.record is not None:
            self.record(Outcome(domain, label, result, value))
