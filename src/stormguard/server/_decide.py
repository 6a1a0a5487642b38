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
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import AsyncRateLimiter, RateLimiter
from .._errors import ConfigError
from ..core._decision import Decision, combine
from ..core._limiters import check_cost
from ..limiting._limiter import combined
from ..stores import MemoryStore, from_url
from ._rules import ClientAddress, KeyFunc, RequestView, Rule, compile_key

__all__ = ["RuleSet", "close_on_shutdown", "open_store"]


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


class RuleSet:
    """Rules plus their limiters on one store; decides a request in one store call.

    ``asyncio`` picks :class:`AsyncRateLimiter` (``await adecide``) or
    :class:`RateLimiter` (``decide``). ``on_store_error``, ``instances`` and
    ``retry_store_after`` go to every limiter.
    """

    __slots__ = ("_entries", "_plain", "_plain_cost", "asyncio", "owns_store", "rules", "store")

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
    ) -> None:
        rules = list(rules)
        if any(not isinstance(rule, Rule) for rule in rules):
            raise ConfigError("rules", "every rule must be a stormguard.asgi.Rule")
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise ConfigError("rules", f"rule names must be unique (pass name=...): {names}")
        self.rules = tuple(rules)
        self.asyncio = asyncio
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
        # Several rules for every request (no method or path filter, one cost) on a
        # MemoryStore: decided straight through the store's hit_many (see decide).
        self._plain: list[tuple[Any, str, KeyFunc]] | None = None
        if (
            len(rules) > 1
            and type(self.store) is MemoryStore
            and all(rule.methods is None and rule.paths is None for rule in rules)
            and len({rule.cost for rule in rules}) == 1
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

    def _groups(self, view: RequestView, method: str, path: str) -> dict[float, list[Any]]:
        groups: dict[float, list[Any]] = {}
        for rule, key_of, limiter in self._entries:
            if not rule.matches(method, path):
                continue
            key = key_of(view)
            if key is not None:
                groups.setdefault(rule.cost, []).append((limiter, key))
        return groups

    async def adecide(self, view: RequestView, method: str, path: str) -> Decision | None:
        """Decide every matching rule (None: no rule applies)."""
        groups = self._groups(view, method, path)
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

    @property
    def in_memory(self) -> bool:
        """Whether the store is a MemoryStore: :meth:`decide` then serves async limiters too."""
        return type(self.store) is MemoryStore

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
        groups = self._groups(view, method, path)
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


def _refused(decision: Decision | None) -> Decision | None:
    return None if decision is None or decision.allowed else decision
