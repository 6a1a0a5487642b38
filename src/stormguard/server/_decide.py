# The per-request decision: every rule matching a request, decided together.
#
# A RuleSet owns one limiter per rule, all on one store. For a request it picks the
# rules that match (method, path prefix, a key that resolves) and decides them in
# ONE store call (hit_many: one Lua round trip on Redis), all or nothing: a request
# refused by the global rule takes nothing from the client's quota. Rules of one
# request with different costs are one call per distinct cost (rare; documented).
#
# Store outages follow `on_store_error` inside the limiters; `store_down` says an
# answer came from that fallback, so a front end can tell "you are over your limit"
# (429) from "we cannot count right now" (the closed mode: 503).
#
# Entry points: `decide` (sync; a MemoryStore serves async callers through it too),
# `adecide` (a coroutine), and `submit` -- no coroutine, no task: a Pending resolved
# from the store connection's callbacks (server/_plan.py), for a request chain that
# continues in a done-callback. All three give the same answers.
#
# Shadow rules (`Rule(shadow=True)`, or `RuleSet(shadow=True)` for every rule) are
# decided and counted but never refuse: they are decided after the enforced rules,
# only when those admitted (what enforcing them would have seen), and a request
# they would have refused gets the enforced decision as a `Shadowed` one whose
# `.shadow` lists their refusals (reason "shadow:<limit name>"; `shadow_refusals`),
# and `on_shadow(view, refusals)` is called. That is the whole API a front end
# needs (the gateway counts them; the rate-limit service's `shadow_mode` is this).
#
# Approximate rules (`Rule(sync=SECONDS)`) on a Redis store are decided from this
# process's reservations (stores/_lease.py, one table per store); on a MemoryStore
# they are exact.
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from .. import AsyncRateLimiter, RateLimiter
from .._errors import ConfigError
from ..core._decision import Decision, combine
from ..core._limiters import Concurrency, check_cost
from ..limiting._limiter import combined
from ..stores import MemoryStore, from_url
from ..stores._lease import LeaseTable
from ..stores._pending import Pending, done
from ._plan import NOTHING, Entry, Plan, Shadowed, shadow_refusals, shadowed
from ._rules import CALLABLE_PREFIX, ClientAddress, KeyFunc, RequestView, Rule, compile_key

__all__ = [
    "RuleSet",
    "Shadowed",
    "close_on_shutdown",
    "lease_table",
    "open_store",
    "shadow_refusals",
]

OnShadow = Callable[[RequestView, tuple[Decision, ...]], None]
_MAX_PLANS = 4096
_TABLES: weakref.WeakKeyDictionary[object, LeaseTable] = weakref.WeakKeyDictionary()


def lease_table(store: object, instances: int = 1) -> LeaseTable:
    """The approximate limits' reservations of this process on ``store`` (one per store)."""
    table = _TABLES.get(store)
    if table is None:
        table = _TABLES.setdefault(store, LeaseTable(store, instances=instances))
    return table


def open_store(store: object, *, asyncio: bool) -> Any:
    """A store object from ``store``: an object as is, a URL through ``from_url``, None: memory."""
    if store is None:
        return MemoryStore()
    if isinstance(store, str):
        return from_url(store, asyncio=asyncio)  # type: ignore[call-overload]
    return store


def _flat(decisions: list[Decision]) -> Decision:
    return combine([part for d in decisions for part in (d.parts or (d,))])


def close_on_shutdown(send: Any, store: Any) -> Any:
    """Wrap a lifespan ``send``: close ``store`` before ``lifespan.shutdown.complete``.

    For stores a middleware opened itself from a URL (their connections belong to
    the server's event loop).
    """

    async def sending(message: Any) -> None:
        if message["type"] == "lifespan.shutdown.complete":
            closer = getattr(store, "aclose", None)
            if closer is not None:
                try:
                    await closer()
                except Exception:  # closing a dead store must not fail the shutdown
                    pass
        await send(message)

    return sending


def _nothing() -> Pending[Decision | None]:
    # RuleSet.submitter's answer for a client no rule has a key for
    return NOTHING


class RuleSet:
    """Rules plus their limiters on one store; decides a request in one store call.

    ``asyncio`` picks :class:`AsyncRateLimiter` (``await adecide``, ``submit``) or
    :class:`RateLimiter` (``decide``). ``on_store_error``, ``instances`` and
    ``retry_store_after`` go to every limiter. ``shadow=True`` makes every rule a
    shadow rule; ``on_shadow(view, refusals)`` is called with the decisions of the
    shadow rules that would have refused a request (see the module notes).
    """

    __slots__ = (
        "_by_keys",
        "_entries",
        "_memory",
        "_plain",
        "_plain_cost",
        "_plans",
        "_specs",
        "_submits",
        "_table",
        "asyncio",
        "on_shadow",
        "owns_store",
        "rules",
        "shadow",
        "store",
    )

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        store: object = None,
        on_store_error: str = "open",
        trusted_proxies: Sequence[str] = (),
        asyncio: bool = True,
        instances: int | None = None,
        retry_store_after: float = 1.0,
        shadow: bool = False,
        on_shadow: OnShadow | None = None,
    ) -> None:
        rules = list(rules)
        if any(not isinstance(rule, Rule) for rule in rules):
            raise ConfigError("rules", "every rule must be a stormguard.asgi.Rule")
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise ConfigError("rules", f"rule names must be unique (pass name=...): {names}")
        if on_shadow is not None and not callable(on_shadow):
            raise ConfigError("on_shadow", f"must be callable, got {on_shadow!r}")
        self.rules = tuple(rules)
        self.asyncio = asyncio
        self.shadow = bool(shadow)
        self.on_shadow = on_shadow
        self.store = open_store(store, asyncio=asyncio)
        self.owns_store = isinstance(store, str)
        address = ClientAddress.of(trusted_proxies)
        limiter_type: Any = AsyncRateLimiter if asyncio else RateLimiter
        self._entries: list[tuple[Rule, KeyFunc, Any]] = [
            (
                rule,
                compile_key(rule.key, address),
                limiter_type(
                    rule.algorithm,
                    self.store,
                    name=rule.name,
                    on_store_error=on_store_error,  # validated by the limiter
                    instances=instances,
                    retry_store_after=retry_store_after,
                ),
            )
            for rule in rules
        ]
        self._memory = type(self.store) is MemoryStore
        # Per rule: (limiter, key function, cost, shadow, sync seconds or None).
        self._specs = [
            (limiter, key_of, rule.cost, self.shadow or rule.shadow, rule.sync)
            for rule, key_of, limiter in self._entries
        ]
        approximate = any(rule.sync is not None for rule in rules)
        # Redis: a store whose decisions can be submitted (AsyncRedisStore).
        self._submits = asyncio and callable(getattr(self.store, "submit", None))
        self._table = (
            lease_table(self.store, instances or int(getattr(self.store, "instances", 1)))
            if approximate and self._submits
            else None
        )
        self._plans: dict[tuple[str | None, ...], Plan] = {}
        # A request's keys decide its answer alone: no rule filters by method or path,
        # and no shadow rule's refusal is reported with the request (on_shadow).
        self._by_keys = all(rule.methods is None and rule.paths is None for rule in rules) and (
            on_shadow is None or not any(spec[3] for spec in self._specs)
        )
        # Several rules for every request (no method or path filter, one cost, no
        # shadow rule) on a MemoryStore: decided straight through the store's
        # hit_many (see decide).
        self._plain: list[tuple[Any, str, KeyFunc]] | None = None
        if (
            len(rules) > 1
            and self._memory
            and all(rule.methods is None and rule.paths is None for rule in rules)
            and len({rule.cost for rule in rules}) == 1
            and not any(spec[3] for spec in self._specs)
        ):
            self._plain = [(rule.algorithm, rule.name, key_of) for rule, key_of, _ in self._entries]
            self._plain_cost = check_cost(rules[0].cost)

    @property
    def store_down(self) -> bool:
        """Whether the store is in an outage (answers follow ``on_store_error``)."""
        return bool(self._entries) and self._entries[0][2].store_down

    @property
    def fails_closed(self) -> bool:
        """Whether a rule denies while the store is down (``on_store_error="closed"``)."""
        return any(limiter.on_store_error == "closed" for _, _, limiter in self._entries)

    @property
    def in_memory(self) -> bool:
        """Whether the store is a MemoryStore: :meth:`decide` then serves async limiters too."""
        return self._memory

    def _groups(
        self, view: RequestView, method: str, path: str, shadow: bool = False
    ) -> dict[float, list[Any]]:
        groups: dict[float, list[Any]] = {}
        for (rule, key_of, limiter), spec in zip(self._entries, self._specs):
            if spec[3] is not shadow or not rule.matches(method, path):
                continue
            key = key_of(view)
            if key is not None:
                groups.setdefault(rule.cost, []).append((limiter, key))
        return groups

    # -- submit: no coroutine, no task ---------------------------------------------

    def submit(
        self, view: RequestView, method: str, path: str, *, quiet: bool = False
    ) -> Pending[Decision | None]:
        """:meth:`adecide` without a coroutine: a :class:`~stormguard.stores._pending.Pending`
        (``add_done_callback``, ``result``, awaitable) resolved from the store's
        callbacks -- at once on a MemoryStore, when the reply of the batch it joined
        is in on Redis. With ``quiet``, an admitted request that took no lease
        answers None (nothing built). Call it on the event loop."""
        if not self._submits:
            if self._memory or not self.asyncio:
                return done(_quieted(self.decide(view, method, path), quiet))
            return _in_task(self._adecide(view, method, path), quiet)
        found = []  # (a loop: a generator's frame is resumed once per rule)
        for rule, key_of, _ in self._entries:
            found.append(key_of(view) if rule.matches(method, path) else None)
        keys = tuple(found)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plan(keys)
            if plan is None:
                return NOTHING
        hook = self.on_shadow
        on_shadow = None if hook is None else (lambda refused: hook(view, refused))
        return plan.submit(quiet, on_shadow)

    def submitter(self, view: RequestView) -> Callable[[], Pending[Decision | None]] | None:
        """:meth:`submit` with ``quiet=True`` for ``view``'s keys, as a callable, for a
        caller that submits for the same client again and again (a connection's one
        client): no key is computed and no plan looked up again. None when the
        answer could depend on more than the keys (a rule filters by method or
        path, or a shadow rule's refusal goes to ``on_shadow`` with the request) or
        the store takes no submits: call :meth:`submit` each time."""
        if not self._submits or not self._by_keys:
            return None
        found = []
        for _, key_of, _ in self._entries:
            found.append(key_of(view))
        keys = tuple(found)
        plan = self._plans.get(keys) or self._plan(keys)
        if plan is None:
            return _nothing
        return partial(plan.submit, True, None)

    def _plan(self, keys: tuple[str | None, ...]) -> Plan | None:
        entries: list[Entry] = [
            (limiter, key, cost, shadow, sync)
            for (limiter, _, cost, shadow, sync), key in zip(self._specs, keys)
            if key is not None
        ]
        if not entries:
            return None
        leases = any(type(e[0].algorithm) is Concurrency for e in entries)
        if len({(e[0].name, e[1]) for e in entries}) < len(entries):
            raise ConfigError("items", "the same (limiter name, key) appears twice")
        plan = Plan(self.store, entries, leases, self._table)
        plans = self._plans
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[keys] = plan
        return plan

    async def adecide(self, view: RequestView, method: str, path: str) -> Decision | None:
        """Decide every matching rule (None: no rule applies)."""
        if self._submits:
            return await self.submit(view, method, path)
        return await self._adecide(view, method, path)

    async def _adecide(self, view: RequestView, method: str, path: str) -> Decision | None:
        # Any other async store: the limiters' hit_many, group by group.
        decision = await self._adecide_groups(self._groups(view, method, path))
        if decision is not None and not decision.allowed:
            return decision
        shadow = self._groups(view, method, path, shadow=True)
        if not shadow:
            return decision
        return self._shadowed(view, decision, await self._adecide_groups(shadow))

    @staticmethod
    async def _adecide_groups(groups: dict[float, list[Any]]) -> Decision | None:
        if len(groups) == 1:
            ((cost, items),) = groups.items()
            if len(items) == 1:  # one limit: the limiter's own fast path
                limiter, key = items[0]
                return await limiter.hit(key, cost)  # type: ignore[no-any-return]
            return await AsyncRateLimiter.hit_many(items, cost)
        if not groups:
            return None
        decisions = []
        for cost, items in groups.items():
            decision = await AsyncRateLimiter.hit_many(items, cost)
            decisions.append(decision)
            if not decision.allowed:
                break
        return decisions[0] if len(decisions) == 1 else _flat(decisions)

    def _shadowed(
        self, view: RequestView, decision: Decision | None, shadow: Decision | None
    ) -> Decision | None:
        # The enforced `decision`, told what the shadow rules (`shadow`) refused.
        if shadow is None or shadow.allowed:
            return decision
        refused = tuple(part for part in (shadow.parts or (shadow,)) if not part.allowed)
        if self.on_shadow is not None:
            self.on_shadow(view, refused)
        return shadowed(decision, refused) if decision is not None else None

    # -- the sync path (and every MemoryStore call) ---------------------------------

    def refusal(self, view: RequestView, method: str, path: str) -> Decision | None:
        """:meth:`decide` for a caller that only acts on a refusal: the decision when
        a limit refused the request, else None (admitted, or no rule applied) --
        on the plain path without building the admitted decisions at all."""
        limits = self.plain_limits(view)
        if limits is not None:
            return self.refusal_of(limits)
        return _refused(self.decide(view, method, path))

    def plain_limits(self, view: RequestView) -> list[tuple[Any, str, str]] | None:
        """The plain path's ``(algorithm, name, key)`` of every rule for ``view``
        (what :meth:`refusal_of` decides); None without a plain path or when a rule
        has no key for ``view`` (then :meth:`refusal` or :meth:`decide`). A caller
        whose keys cannot change may keep the list for its next requests."""
        plain = self._plain
        if plain is None:
            return None
        limits = []
        for algorithm, name, key_of in plain:
            key = key_of(view)
            if key is None:
                return None
            limits.append((algorithm, name, key))
        return limits

    def refusal_of(self, limits: list[tuple[Any, str, str]]) -> Decision | None:
        """:meth:`refusal` for limits from :meth:`plain_limits`: one hit of them all."""
        parts = self.store.hit_many(limits, self._plain_cost, quiet=True)
        return None if parts is None else _refused(combined(parts))

    def refusal_hitter(self, limits: list[tuple[Any, str, str]]) -> Callable[[], Decision | None]:
        """:meth:`refusal_of` ``(limits)`` as a callable, for a caller that decides
        the same limits again and again (a connection's one client): the store's
        group hitter, which answers None at once when every limit admits."""
        return self.store.group_hitter(limits, self._plain_cost, lambda: self.refusal_of(limits))  # type: ignore[no-any-return]

    def client_hitter(self, client: Any) -> Callable[[str], Decision | None] | None:
        """:meth:`refusal` as ``hit(key)`` for rules each keyed by ``client`` (one key
        callable: the request's client, ``key`` what it returns) or ``"global"``, on
        the plain path: the store's keyed hitter, built once for every client (None
        when the rules are keyed otherwise, or there is no plain path)."""
        if self._plain is None:
            return None
        limits = []
        per_hit = []
        for index, rule in enumerate(self.rules):
            if rule.key is client:
                limits.append((rule.algorithm, rule.name, CALLABLE_PREFIX))
                per_hit.append(index)
            elif rule.key == "global":
                limits.append((rule.algorithm, rule.name, "global"))
            else:
                return None

        def otherwise(key: str) -> Decision | None:
            keyed = [
                (algorithm, name, prefix + key if index in per_hit else prefix)
                for index, (algorithm, name, prefix) in enumerate(limits)
            ]
            return self.refusal_of(keyed)

        return self.store.keyed_hitter(limits, self._plain_cost, otherwise, tuple(per_hit))  # type: ignore[no-any-return]

    def decide(self, view: RequestView, method: str, path: str) -> Decision | None:
        """Sync twin of :meth:`adecide` (on a MemoryStore, for async limiters too:
        nothing there is ever awaited)."""
        plain = self._plain
        if plain is not None:
            # Every rule applies; names are unique and the store is one by construction.
            limits = []
            for algorithm, name, key_of in plain:
                key = key_of(view)
                if key is None:
                    break
                limits.append((algorithm, name, key))
            else:
                return combined(self.store.hit_many(limits, self._plain_cost))
        decision = _decide_groups(self._groups(view, method, path))
        if decision is not None and not decision.allowed:
            return decision
        shadow = self._groups(view, method, path, shadow=True)
        if not shadow:
            return decision
        return self._shadowed(view, decision, _decide_groups(shadow))


def _decide_groups(groups: dict[float, list[Any]]) -> Decision | None:
    if len(groups) == 1:
        ((cost, items),) = groups.items()
        return RateLimiter.hit_many(items, cost)
    if not groups:
        return None
    decisions = []
    for cost, items in groups.items():
        decision = RateLimiter.hit_many(items, cost)
        decisions.append(decision)
        if not decision.allowed:
            break
    return decisions[0] if len(decisions) == 1 else _flat(decisions)


def _quieted(decision: Decision | None, quiet: bool) -> Decision | None:
    if quiet and decision is not None and decision.allowed and not decision.lease:
        return None
    return decision


_TASKS: set[Any] = set()


def _in_task(coroutine: Any, quiet: bool) -> Pending[Decision | None]:
    # A store that can only be awaited: the coroutine in a task, its answer copied.
    import asyncio

    pending: Pending[Decision | None] = Pending()

    def finished(task: Any) -> None:
        if task.cancelled():
            pending.set_exception(asyncio.CancelledError())
        elif task.exception() is not None:
            pending.set_exception(task.exception())
        else:
            pending.set_result(_quieted(task.result(), quiet))

    task = asyncio.get_running_loop().create_task(coroutine)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    task.add_done_callback(finished)
    return pending


def _refused(decision: Decision | None) -> Decision | None:
    return None if decision is None or decision.allowed else decision
