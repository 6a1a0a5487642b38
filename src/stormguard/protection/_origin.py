# Per-origin protection for the HTTP adapters: one breaker, one retry budget and
# one bulkhead per origin (scheme://host:port), plus one cooldown and one pacer
# registry keyed by origin, bundled so an adapter needs four calls per attempt:
#
#     guard = guards.get(origin)              # once per logical request
#     policy = guard.policy(base_policy)      # breaker/budget wired into RetryPolicy
#     wait = guard.wait_before(limit)         # cooldown + pacing; RateLimited if too long
#     with guard.slot(max_wait): send         # bulkhead
#     guard.observe(status, headers)          # 429/503 hint -> cooldown; quotas -> pacer
#
# Each part is on with safe defaults or off with one keyword: True (defaults),
# False/None (off), a mapping of settings, or a ready object shared by every
# origin. With `store=RedisStore(url)` breakers, budgets and cooldowns are shared
# by every process (named after the origin).
from __future__ import annotations

import contextlib
import logging
import random
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any, TypedDict, Unpack
from urllib.parse import urlsplit

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import ConfigError, RateLimited
from ..core._headers import wait_hint
from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._bulkhead import Bulkhead
from ._cooldown import Cooldown
from ._pacer import Pacer
from ._throttle import AdaptiveThrottle

__all__ = [
    "OriginGuard",
    "OriginGuards",
    "Protection",
    "guards_for",
    "origin_of",
    "process_guards",
    "reset_process_guards",
]

# Statuses whose wait hint pauses the whole origin.
COOLDOWN_STATUSES = frozenset({429, 503})
COOLDOWN_SPREAD = 0.25  # resumptions spread over [pause, 1.25 x pause]
_MAX_ORIGINS = 1024
_EVICTION_SCAN = 16  # least recently used guards looked at per new origin
_AUTHORITY_END = re.compile(r"[/?#\\]")
_RNG = random.Random()
_log = logging.getLogger("stormguard")
_DEFAULT_BULKHEAD = {"limit": 100, "max_wait": 60.0}
# The adapters' per-origin breaker: "a blip must not become an outage".
#
# The breaker counts attempts, and every failing request makes several of them
# (the retries). A blip -- one connection reset and one 503 per request, then
# 200 -- across 20 concurrent requests is 60 attempts, 40 of them failures: with
# CircuitBreaker()'s own min_calls=10 (or the 20 used before) that opens the
# breaker on the first burst, and the retries that would have succeeded are
# refused (19 CircuitOpen). So the adapters judge on at least 100 attempts in a
# 30 s window (Microsoft.Extensions.Http.Resilience's standard pipeline: minimum
# throughput 100, sampling 30 s, break 5 s), failure rate 50 %: a burst of up to
# ~50 concurrent requests each failing twice passes, while a sustained outage
# under steady load (>= ~3.3 attempts/s) reaches 100 attempts in the window and
# opens it. Below that rate the breaker stays closed and the retry budget is what
# bounds the extra load (at most its reserve plus 10 %). Failure rate 50 %, not
# Microsoft's 10 %: retries are already bounded by the budget; the breaker is for
# an origin that is down, and a flaky-but-up API at 30 % errors should still be
# called. CircuitBreaker()'s own defaults are unchanged.
_DEFAULT_BREAKER = {"min_calls": 100, "window": 30.0, "failure_rate": 0.5, "open_for": 5.0}


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lower-cased (the unit of protection).

    Never more than that: a malformed URL (``http://[::1/x?secret=1``) gives its
    scheme and authority as written, without user info, path, query or fragment,
    so a secret in the query never reaches a key, a metric or a log line.
    """
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        port = parts.port
    except ValueError:
        scheme, sep, rest = url.partition("://")
        authority = _AUTHORITY_END.split(rest, maxsplit=1)[0] if sep else ""
        authority = authority.rpartition("@")[2].lower()
        return f"{(scheme if sep else 'http').lower()}://{authority}"
    scheme = (parts.scheme or "http").lower()
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


Setting = bool | Mapping[str, Any] | None | object


class Protection(TypedDict, total=False):
    """The per-origin protection keywords, each ``True`` by default (``store``: None).

    ``breaker``, ``budget``, ``bulkhead``, ``cooldown``, ``pacing``: ``True`` (on,
    defaults), ``False``/``None`` (off), a mapping of settings, or a ready object
    shared by every origin. ``store`` shares breakers, budgets and cooldowns across
    processes. ``throttle`` (off by default): SRE adaptive throttling per origin
    (:class:`stormguard.AdaptiveThrottle`; ``True``, a mapping of its settings, or
    one shared object).
    """

    breaker: Setting
    budget: Setting
    bulkhead: Setting
    cooldown: Setting
    pacing: Setting
    store: Any
    throttle: Setting


_PARTS = ("breaker", "budget", "bulkhead", "cooldown", "pacing")


def unknown_keywords(owner: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Raise TypeError, as Python would, for a keyword ``owner`` does not take."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")


def _settings(value: object, field: str, kind: type) -> dict[str, Any] | object | None:
    # True -> {} (defaults), False/None -> None (off), Mapping -> dict, instance -> shared.
    if value is True:
        return {}
    if value is False or value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, kind):
        return value
    raise ConfigError(field, f"True, False, a mapping of settings or a {kind.__name__}")


class OriginGuard:
    """The protection of one origin (see :class:`OriginGuards`)."""

    __slots__ = (
        "_clock",
        "_cooldown",
        "_episode",
        "_pacer",
        "_policy_cache",
        "_rng",
        "breaker",
        "budget",
        "bulkhead",
        "origin",
        "throttle",
    )

    def __init__(
        self,
        origin: str,
        *,
        breaker: CircuitBreaker | None,
        budget: RetryBudget | None,
        bulkhead: Bulkhead | None,
        cooldown: Cooldown | None,
        pacer: Pacer | None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        throttle: AdaptiveThrottle | None = None,
    ) -> None:
        self.origin = origin
        self.throttle = throttle
        self._clock = clock
        self._rng = rng or _RNG
        self.breaker = breaker
        self.budget = budget
        self.bulkhead = bulkhead
        self._cooldown = cooldown
        self._pacer = pacer
        self._policy_cache: tuple[Any, Any] | None = None
        # The kind of delay ("cooldown", "pacing") told in the log since the
        # origin last let a request through at once: one INFO line per episode.
        self._episode: str | None = None

    @property
    def paced(self) -> bool:
        """Whether :meth:`wait_before` can ask for a wait (a cooldown or pacing is on)."""
        return self._cooldown is not None or self._pacer is not None

    @property
    def pacing(self) -> bool:
        """Whether :meth:`observe` learns from every response (pacing reads quotas)."""
        return self._pacer is not None

    def in_use(self, *, breaker: bool = True, bulkhead: bool = True) -> bool:
        """Whether forgetting this guard would lose protection that is running now.

        True while its breaker is not closed, its bulkhead has holders or waiters,
        or its cooldown pauses the origin (``breaker=False`` / ``bulkhead=False``
        leave that part out).
        """
        if breaker and self.breaker is not None and self.breaker.last_state != "closed":
            return True
        slots = self.bulkhead
        if bulkhead and slots is not None and (slots.in_flight or slots.waiting):
            return True
        return self._cooldown is not None and self._cooldown.running(self.origin)

    def policy(self, base: Any) -> Any:
        """``base`` (a RetryPolicy) with this origin's breaker and budget, unless it has its own."""
        cached = self._policy_cache
        if cached is not None and cached[0] is base:
            return cached[1]
        changes: dict[str, Any] = {}
        if base.breaker is None and self.throttle is not None:
            changes["breaker"] = self.throttle.guarding(self.breaker)  # breaker, then throttle
        elif base.breaker is None and self.breaker is not None:
            changes["breaker"] = self.breaker
        if base.budget is None and self.budget is not None:
            changes["budget"] = self.budget
        policy = base.replace(**changes) if changes else base
        self._policy_cache = (base, policy)
        return policy

    def wait_before(self, limit: float) -> float:
        """Seconds to wait before the next attempt (cooldown, then pacing).

        Raises :class:`stormguard.RateLimited` with the wait when it is longer than
        ``limit`` (the call's remaining deadline, or the longest wait it honours):
        the request fails fast with the hint instead of sleeping past its deadline.
        """
        wait = 0.0
        if self._cooldown is not None:
            wait = self._cooldown.remaining(self.origin)
        return self._pace(wait, limit)

    async def await_before(self, limit: float) -> float:
        """Async twin of :meth:`wait_before` (awaits a shared cooldown)."""
        wait = 0.0
        if self._cooldown is not None:
            wait = await self._cooldown.aremaining(self.origin)
        return self._pace(wait, limit)

    def _pace(self, wait: float, limit: float) -> float:
        if wait > limit:
            self._tell("cooldown", wait, refused=True)
            raise RateLimited(wait, f"{self.origin} is cooling down for {wait:.3f}s")
        if wait:
            self._tell("cooldown", wait, refused=False)
            # Everyone paused by one hint would wake at the same instant: spread the
            # resumption over the last quarter-again of the pause (a herd that
            # starts together fails together), without passing the limit.
            wait = min(limit, wait * (1.0 + COOLDOWN_SPREAD * self._rng.random()))
        if self._pacer is not None:
            paced = self._pacer.reserve(self.origin, limit=limit)
            if paced > limit:
                self._tell("pacing", paced, refused=True)
                raise RateLimited(paced, f"{self.origin} is paced: next slot in {paced:.3f}s")
            if paced and not wait:
                self._tell("pacing", paced, refused=False)
            wait = max(wait, paced)
        if not wait:
            self._episode = None  # a request went through at once: the episode is over
        return wait

    def _tell(self, kind: str, wait: float, *, refused: bool) -> None:
        # One INFO line per origin per episode (not per request): the first
        # request a cooldown or pacing delays or refuses says so, with the wait.
        if self._episode == kind:
            return
        self._episode = kind
        if not _log.isEnabledFor(logging.INFO):
            return
        quotas = (
            [] if kind == "cooldown" or self._pacer is None else self._pacer.quotas(self.origin)
        )
        if kind == "cooldown":
            why = "cooling down as the server asked"
        else:
            why = f"pacing quota {', '.join(quotas) or 'default'} until its reset"
        action = "refusing requests that cannot wait" if refused else "delaying requests"
        _log.info(
            "%s: %s; %s (wait %.3fs)",
            self.origin,
            why,
            action,
            wait,
            extra={
                "stormguard": {
                    "event": kind,
                    "origin": self.origin,
                    "wait": wait,
                    "refused": refused,
                    "quotas": quotas,
                }
            },
        )

    def _hint(self, status: int, headers: Any, hint: float | None) -> float | None:
        if self._cooldown is None or status not in COOLDOWN_STATUSES:
            return None
        if hint is None:
            try:
                hint = wait_hint(status, headers, now=self._clock.time())
            except Exception:  # hostile headers never break a request
                return None
        return hint

    def observe(self, status: int, headers: Any, hint: float | None = None) -> None:
        """Learn from a response: a 429/503 hint pauses the origin; quotas feed pacing.

        ``hint`` is the server's wait if the caller already parsed it (else it is
        read from ``headers``).
        """
        hint = self._hint(status, headers, hint)
        if status == 429 and self.throttle is not None:
            self.throttle.retract()  # counted as accepted (not a 5xx): it was a refusal
        if hint and self._cooldown is not None:
            self._cooldown.pause(self.origin, hint)
        if self._pacer is not None:
            self._pacer.observe(self.origin, headers)

    async def aobserve(self, status: int, headers: Any, hint: float | None = None) -> None:
        """Async twin of :meth:`observe`."""
        hint = self._hint(status, headers, hint)
        if status == 429 and self.throttle is not None:
            self.throttle.retract()
        if hint and self._cooldown is not None:
            await self._cooldown.apause(self.origin, hint)
        if self._pacer is not None:
            self._pacer.observe(self.origin, headers)

    def cooldown_remaining(self) -> float:
        """Seconds this origin stays paused (0.0 when not, or without a cooldown)."""
        return 0.0 if self._cooldown is None else self._cooldown.remaining(self.origin)

    async def acooldown_remaining(self) -> float:
        """Async twin of :meth:`cooldown_remaining`."""
        return 0.0 if self._cooldown is None else await self._cooldown.aremaining(self.origin)

    @contextlib.contextmanager
    def slot(self, max_wait: float | None = None) -> Iterator[None]:
        """Hold a bulkhead slot (if any) for one attempt; raises BulkheadFull."""
        if self.bulkhead is None:
            yield
            return
        self.bulkhead.acquire(max_wait)
        try:
            yield
        finally:
            self.bulkhead.release()

    @contextlib.asynccontextmanager
    async def aslot(self, max_wait: float | None = None) -> AsyncIterator[None]:
        """Async twin of :meth:`slot`."""
        if self.bulkhead is None:
            yield
            return
        await self.bulkhead.aacquire(max_wait)
        try:
            yield
        finally:
            self.bulkhead.release()


class OriginGuards:
    """Per-origin breakers, budgets, bulkheads, cooldown and pacing for an HTTP client.

    Each keyword takes ``True`` (on, defaults), ``False``/``None`` (off), a mapping
    of settings for the per-origin object (``breaker={"failure_rate": 0.3}``), or a
    ready object to share across all origins. Defaults: a :class:`CircuitBreaker`
    per origin counting 5xx and transport errors (not 4xx); a :class:`RetryBudget`
    per origin (10 % + 10/s); a :class:`Bulkhead` of 100 per origin waiting at most
    the call's deadline; a shared :class:`Cooldown` honouring 429/503 hints; a
    :class:`Pacer` spreading the last 10 % of each quota. ``store`` shares
    breakers, budgets and cooldowns across processes.
    """

    __slots__ = (
        "_breaker",
        "_budget",
        "_bulkhead",
        "_clock",
        "_cooldown",
        "_cooldown_settings",
        "_guards",
        "_lock",
        "_pacer",
        "_pacer_settings",
        "_rng",
        "_store",
        "_throttle",
        "generation",
    )

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        **protection: Unpack[Protection],
    ) -> None:
        unknown_keywords("OriginGuards", protection, Protection.__optional_keys__)
        breaker, budget, bulkhead, cooldown, pacing = (
            protection.get(name, True) for name in _PARTS
        )
        self._clock = clock or SYSTEM_CLOCK
        self._rng = rng
        self._store = protection.get("store")
        self._breaker = _settings(breaker, "breaker", CircuitBreaker)
        if isinstance(self._breaker, dict):
            self._breaker = {**_DEFAULT_BREAKER, **self._breaker}
        self._budget = _settings(budget, "budget", RetryBudget)
        bulk = _settings(bulkhead, "bulkhead", Bulkhead)
        if isinstance(bulk, dict):
            bulk = {**_DEFAULT_BULKHEAD, **bulk}
        self._bulkhead = bulk
        self._cooldown_settings = _settings(cooldown, "cooldown", Cooldown)
        self._pacer_settings = _settings(pacing, "pacing", Pacer)
        self._throttle = _settings(protection.get("throttle"), "throttle", AdaptiveThrottle)
        self._guards: OrderedDict[str, OriginGuard] = OrderedDict()  # least recent first
        # Bumped whenever a guard handed out stops being the registry's (an eviction,
        # a reset): an adapter that keeps guards per origin checks it on each request.
        self.generation = 0
        self._lock = threading.Lock()
        self._fresh_shared_parts()

    def _fresh_shared_parts(self) -> None:
        # The cooldown and pacer every origin shares: built from settings here, or
        # the ready objects given (which reset() leaves as they are).
        cool = self._cooldown_settings
        if isinstance(cool, dict):
            cool = Cooldown(clock=self._clock, store=self._store, **cool)
        self._cooldown: Cooldown | None = cool  # type: ignore[assignment]
        pace = self._pacer_settings
        if isinstance(pace, dict):
            pace = Pacer(clock=self._clock, **pace)
        self._pacer: Pacer | None = pace  # type: ignore[assignment]

    @property
    def enabled(self) -> bool:
        """False when every part is off (the adapter can skip the bookkeeping)."""
        return any(
            part is not None
            for part in (
                self._breaker,
                self._budget,
                self._bulkhead,
                self._cooldown,
                self._pacer,
                self._throttle,
            )
        )

    def get(self, origin: str) -> OriginGuard:
        """The guard of ``origin`` (created on first use).

        At most 1,024 origins are kept: a new one makes room by forgetting the
        least recently used origin whose protection is idle -- never one whose
        breaker is not closed, whose bulkhead has holders or whose cooldown runs
        (the registry grows past the bound rather than forget a sick origin).
        """
        guards = self._guards
        guard = guards.get(origin)
        if guard is not None:
            try:
                guards.move_to_end(origin)  # most recently used (O(1), atomic)
            except KeyError:
                pass  # forgotten meanwhile by another thread: it has its guard already
            return guard
        with self._lock:
            guard = guards.get(origin)
            if guard is None:
                if len(guards) >= _MAX_ORIGINS:
                    self._evict()
                guard = guards[origin] = self._build(origin)
        return guard

    def touch(self, origin: str) -> None:
        """Mark ``origin`` recently used, as :meth:`get` does (nothing if it has no guard)."""
        try:
            self._guards.move_to_end(origin)  # (O(1), atomic)
        except KeyError:
            pass

    def _evict(self) -> None:
        # Lock held. The least recently used idle guard goes; busy ones seen on the
        # way move to the recent end (they are in use), so the scan stays O(1).
        # A breaker or bulkhead given ready-made is shared by every origin: dropping
        # one origin's guard loses nothing of it, so only per-origin ones count.
        guards = self._guards
        own_breaker = isinstance(self._breaker, dict)
        own_bulkhead = isinstance(self._bulkhead, dict)
        for _ in range(min(_EVICTION_SCAN, len(guards))):
            origin, guard = next(iter(guards.items()))
            if not guard.in_use(breaker=own_breaker, bulkhead=own_bulkhead):
                del guards[origin]
                self.generation += 1
                return
            guards.move_to_end(origin)

    def reset(self) -> None:
        """Start afresh: forget every origin's breaker, budget and bulkhead, every
        pause and all pacing (objects passed in ready-made are kept as they are;
        state shared through a store stays in the store)."""
        with self._lock:
            self._guards.clear()
            self._fresh_shared_parts()
            self.generation += 1

    def for_url(self, url: str) -> OriginGuard:
        """The guard of the origin of ``url``."""
        return self.get(origin_of(url))

    def origins(self) -> Iterable[str]:
        """Origins seen so far."""
        return list(self._guards)

    def _build(self, origin: str) -> OriginGuard:
        breaker = self._breaker
        if isinstance(breaker, dict):
            settings = {"name": origin, "clock": self._clock, "rng": self._rng, **breaker}
            if self._store is not None:
                settings.setdefault("store", self._store)
            breaker = CircuitBreaker(**settings)
        budget = self._budget
        if isinstance(budget, dict):
            settings = {"name": origin, "clock": self._clock, **budget}
            if self._store is not None:
                settings.setdefault("store", self._store)
            budget = RetryBudget(**settings)
        bulkhead = self._bulkhead
        if isinstance(bulkhead, dict):
            bulkhead = Bulkhead(**{"name": origin, "clock": self._clock, **bulkhead})
        throttle = self._throttle
        if isinstance(throttle, dict):
            settings = {"name": origin, "clock": self._clock, "rng": self._rng, **throttle}
            throttle = AdaptiveThrottle(**settings)
        return OriginGuard(
            origin,
            breaker=breaker,  # type: ignore[arg-type]
            budget=budget,  # type: ignore[arg-type]
            bulkhead=bulkhead,  # type: ignore[arg-type]
            cooldown=self._cooldown,
            pacer=self._pacer,
            clock=self._clock,
            rng=self._rng,
            throttle=throttle,  # type: ignore[arg-type]
        )


_PROCESS_GUARDS: OriginGuards | None = None
_PROCESS_LOCK = threading.Lock()


def process_guards() -> OriginGuards:
    """The process-wide registry every adapter with default protection shares.

    One breaker, budget and bulkhead per origin for the whole process, and one
    cooldown and pacer: every client object, thread and task calling an upstream
    is judged and paused together, as the upstream sees them.
    """
    global _PROCESS_GUARDS
    guards = _PROCESS_GUARDS
    if guards is None:
        with _PROCESS_LOCK:
            if _PROCESS_GUARDS is None:
                _PROCESS_GUARDS = OriginGuards()
            guards = _PROCESS_GUARDS
    return guards


def reset_process_guards() -> None:
    """Forget the process-wide per-origin protection (see :func:`process_guards`).

    Every breaker, budget, bulkhead, cooldown and pacer that the adapters with
    default protection share is dropped; the next request of every adapter, old
    or new, starts with fresh ones (:meth:`OriginGuards.reset` on the shared
    registry). Meant for tests (one test's open breaker must not refuse the next
    test's calls) and for an operator's "start over".
    """
    with _PROCESS_LOCK:
        guards = _PROCESS_GUARDS
    if guards is not None:
        guards.reset()


def guards_for(
    *,
    guards: OriginGuards | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    **protection: Unpack[Protection],
) -> OriginGuards:
    """What an adapter's protection keywords resolve to.

    ``guards`` wins when given: pass one :class:`OriginGuards` to several clients
    to share exactly that set (or give each client its own to keep them apart,
    e.g. clients that stand for separate hosts in a test). With every keyword at
    its default, the adapter uses :func:`process_guards`: one set per origin
    shared by every client object, thread and task in the process. Any custom
    setting (or a clock, an RNG or a store) gives the adapter its own registry;
    ``store`` then shares it with every process.
    """
    if guards is not None:
        return guards
    defaults = all(protection.get(name, True) is True for name in _PARTS)
    defaults = defaults and not protection.get("throttle")
    if defaults and (protection.get("store"), clock, rng) == (None, None, None):
        return process_guards()
    return OriginGuards(clock=clock, rng=rng, **protection)
