# One request's limits on a Redis store, decided without a task: `Plan`.
#
# A RuleSet finds, for a request, the rules that apply and their keys. The Plan of
# that combination is made once and kept (keyed by the keys, bounded): its groups
# -- the enforced limits of one cost, all or nothing, each group decided only if
# the one before it committed (as `adecide` stops at the first refusal); then the
# shadow limits, decided only if the enforced ones committed -- are encoded once
# (stores/_lua.py `Item`), so a request costs an append to the store's next batch
# and, when the reply is in, a look at one flag per group. Approximate limits
# (`sync`) are taken from this process's reservations first (stores/_lease.py) and
# are not part of the item.
#
# The answer is the decision `adecide` gives: the enforced limits' combined
# decision (None when no rule applied), a `Shadowed` one when shadow limits would
# have refused (their decisions in `.shadow`; reason "shadow:<limit name>"), or --
# with `quiet` -- None for an admitted request that took no lease.
#
# Outages: every limiter of the plan has its StoreHealth; a plan asks the store
# only while they allow it (stores/_fallback.py) and answers from each limit's
# on_store_error otherwise, or when the batch fails.
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..core._decision import Decision, combine
from ..core._limiters import LimitRequest, check_cost
from ..limiting._limiter import _fallback
from ..stores import _lua
from ..stores._fallback import StoreHealth
from ..stores._pending import Pending, done

__all__ = ["Entry", "Plan", "Shadowed", "shadow_refusals"]

NOTHING: Pending[Any] = done(None)
_DEGRADED = operator.attrgetter("degraded")  # (no generator frame per request)


class Shadowed(Decision):
    """An enforced decision that shadow limits would have refused; ``shadow`` holds
    their decisions (each refusal's reason is ``"shadow:<name>"``)."""

    shadow: tuple[Decision, ...]


def shadowed(decision: Decision, refused: Sequence[Decision]) -> Shadowed:
    """``decision`` carrying the shadow refusals ``refused``."""
    out = Shadowed._make(decision)
    out.shadow = tuple(refused)
    return out


def shadow_refusals(decision: Decision | None) -> tuple[Decision, ...]:
    """The shadow limits that would have refused ``decision``'s request (else ())."""
    return getattr(decision, "shadow", ()) if decision is not None else ()


# (limiter, key, cost, shadow, sync seconds or None) of one applying rule.
Entry = tuple[Any, str, float, bool, float | None]


class Plan:
    """The encoded limits of one combination of keys (see the module notes)."""

    __slots__ = (
        "approximate",
        "costs",
        "enforced",
        "groups",
        "healths",
        "item",
        "limiters",
        "loud",
        "shadow_at",
        "store",
        "table",
    )

    def __init__(
        self, store: Any, entries: Sequence[Entry], leases: bool, table: Any = None
    ) -> None:
        self.store = store
        self.table = table  # the store's LeaseTable, when some entries are approximate
        exact = [e for e in entries if e[4] is None or table is None]
        self.approximate = [e for e in entries if e[4] is not None and table is not None]
        self.approximate.sort(key=lambda e: e[3])  # enforced first
        # groups: enforced ones by cost (in order of first appearance), then shadow.
        self.groups = _by_cost(exact, False) + _by_cost(exact, True)
        self.shadow_at = sum(1 for g in self.groups if not g[0][3])
        self.costs = [check_cost(g[0][2]) for g in self.groups]
        # Every enforced limit, exact or not, by cost: what the outage fallback decides.
        self.enforced = _by_cost(list(entries), False)
        self.limiters = [e[0] for e in entries]
        self.healths: list[StoreHealth] = [limiter._health for limiter in self.limiters]
        # Items: quiet (one enforced group may answer with a flag) and loud; none
        # when a Concurrency limit needs a fresh lease per request (`leases`).
        self.item: _lua.Item | None = None
        self.loud: _lua.Item | None = None
        if self.groups and not leases:
            self.item = self._encode(True)
            self.loud = self._encode(False)

    def _encode(self, quiet: bool, leases: Sequence[Sequence[str]] | None = None) -> _lua.Item:
        store = self.store
        pieces = []
        layouts = []
        one = self.shadow_at == 1
        for i, group in enumerate(self.groups):
            names = leases[i] if leases is not None else ("",) * len(group)
            pieces.append(
                [
                    _lua.piece(store, e[0].algorithm, e[0].name, e[1], e[2], lease)
                    for e, lease in zip(group, names)
                ]
            )
            layouts.append(
                _lua.Group(
                    tuple(e[0].algorithm for e in group),
                    tuple(e[0].name for e in group),
                    tuple(names),
                    (False,) * len(group),
                    group[0][3] or (quiet and one),  # shadow groups answer only refusals
                    i > 0,
                )
            )
        return _lua.item_of(pieces, layouts, self.groups[0][0][1])

    def submit(self, quiet: bool, on_shadow: OnShadow) -> Pending[Decision | None]:
        """Decide the plan: the answer, resolved from the store's callbacks."""
        if self.approximate:
            return self._approximate(quiet, on_shadow)
        return self._exact(quiet, on_shadow, [], [], [])

    # -- exact limits: one item in the store's next batch ---------------------------

    def _exact(
        self,
        quiet: bool,
        on_shadow: OnShadow,
        taken: list[Entry],
        local: list[Decision],
        shadow: list[Decision],
    ) -> Pending[Decision | None]:
        # `taken`: approximate limits taken here (given back if an exact one refuses);
        # `local`: their decisions (loud answers); `shadow`: approximate shadow
        # limits that refused.
        if not self.groups:
            return done(self._answer([], quiet, on_shadow, taken, local, shadow))
        leases: list[list[str]] | None = None
        item = self.item if quiet and not local else self.loud
        if item is None:  # fresh Concurrency leases, encoded for this request
            leases = [[e[0]._request(e[1], e[2]).lease for e in g] for g in self.groups]
            item = self._encode(False, leases)
        healths = self.healths
        if any(map(_DEGRADED, healths)) and not all(h.usable() for h in healths):
            self._put_back(taken)
            for health in healths:
                health.fell_back()
            return done(self._fallback(leases))
        pending: Pending[Decision | None] = Pending()

        def answered(results: Any, stamp: Any) -> None:
            if results is None:
                self._put_back(taken)
                for health in healths:
                    health.failed(stamp)
                    health.fell_back()
                pending.set_result(self._fallback(leases))
                return
            for health in healths:
                if health.degraded:
                    health.succeeded()
            pending.set_result(self._answer(results, quiet, on_shadow, taken, local, shadow))

        self.store.submit(item, answered)
        return pending

    def _answer(
        self,
        results: list[tuple[int, list[Decision] | None, Any]],
        quiet: bool,
        on_shadow: OnShadow,
        taken: list[Entry],
        local: list[Decision],
        shadow: list[Decision],
    ) -> Decision | None:
        parts: list[Decision] = list(local)
        refused = False
        for i, (flag, decisions, _) in enumerate(results):
            if i >= self.shadow_at:
                if flag == _lua.REFUSED and decisions is not None:
                    shadow = shadow + [d for d in decisions if not d.allowed]
                continue
            if decisions is not None:
                parts += decisions
            if flag == _lua.REFUSED:
                refused = True
        if refused:
            self._put_back(taken)
            shadow = []
        if shadow and on_shadow is not None:
            on_shadow(tuple(shadow))
        if not parts:  # quiet and admitted, or only shadow limits applied
            return None
        decision = combine(parts)
        if not refused and quiet and not decision.lease:
            return None
        return shadowed(decision, shadow) if shadow else decision

    def _fallback(self, leases: Sequence[Sequence[str]] | None = None) -> Decision | None:
        # Each enforced group by its limits' on_store_error, in order, stopping at a
        # refusal (shadow limits are not decided while the store is down).
        decisions = []
        for i, group in enumerate(self.enforced):
            names = leases[i] if leases and i < len(leases) else ("",) * len(group)
            cost = check_cost(group[0][2])
            requests = [
                LimitRequest(e[0].algorithm, e[1], e[0].name, cost, lease)
                for e, lease in zip(group, names)
            ]
            decision = _fallback([e[0] for e in group], requests)
            decisions.append(decision)
            if not decision.allowed:
                break
        if not decisions:
            return None
        if len(decisions) == 1:
            return decisions[0]
        return combine([part for d in decisions for part in (d.parts or (d,))])

    # -- approximate limits: this process's reservations first ----------------------

    def _approximate(self, quiet: bool, on_shadow: OnShadow) -> Pending[Decision | None]:
        table = self.table
        taken: list[Entry] = []
        shadow: list[Decision] = []
        for entry in self.approximate:
            limiter, key, cost, is_shadow, every = entry
            if is_shadow and shadow:
                continue  # a shadow limit refused: the others are not decided
            health = limiter._health
            reserve = not health.degraded or health.usable()
            got = table.take(limiter.algorithm, limiter.name, key, cost, every, reserve)
            if got is True:
                taken.append(entry)
                continue
            if got is None:  # nothing held and the store is down
                self._put_back(taken)
                health.fell_back()
                return done(self._fallback())
            if isinstance(got, Decision):
                if is_shadow:  # the shadow limits take nothing then (all or nothing)
                    shadow.append(got)
                    self._put_back([e for e in taken if e[3]])
                    taken = [e for e in taken if not e[3]]
                    continue
                self._put_back(taken)
                return done(got)
            # A reservation is on its way: take again when it is in.
            self._put_back(taken)
            return _then(got, partial(self._reserved, limiter, quiet, on_shadow))
        local = [] if quiet else [table.decision(e[0].name, e[1]) for e in taken if not e[3]]
        if not self.groups and not local and not shadow:
            return NOTHING  # every limit is approximate and admitted: nothing to say
        return self._exact(quiet, on_shadow, taken, local, shadow)

    def _reserved(
        self, limiter: Any, quiet: bool, on_shadow: OnShadow, error: BaseException | None
    ) -> Pending[Decision | None]:
        if error is not None:
            limiter._health.failed(error)
            for health in self.healths:
                health.fell_back()
            return done(self._fallback())
        if limiter._health.degraded:
            limiter._health.succeeded()
        return self._approximate(quiet, on_shadow)

    def _put_back(self, taken: Sequence[Entry]) -> None:
        for limiter, key, cost, _, _ in taken:
            self.table.give_back(limiter.name, key, cost)


OnShadow = Callable[[tuple[Decision, ...]], None] | None


def _by_cost(entries: Sequence[Entry], shadow: bool) -> list[list[Entry]]:
    by_cost: dict[float, list[Entry]] = {}
    for e in entries:
        if e[3] is shadow:
            by_cost.setdefault(e[2], []).append(e)
    return list(by_cost.values())


def _then(
    first: Pending[Any], step: Callable[[BaseException | None], Pending[Decision | None]]
) -> Pending[Decision | None]:
    # `step(error)` once `first` is in; its answer becomes the answer.
    out: Pending[Decision | None] = Pending()

    def resume(p: Pending[Any]) -> None:
        try:
            p.result()
            error = None
        except Exception as exc:
            error = exc
        step(error).add_done_callback(lambda answer: _copy(answer, out))

    first.add_done_callback(resume)
    return out


def _copy(source: Pending[Any], target: Pending[Any]) -> None:
    try:
        target.set_result(source.result())
    except Exception as exc:
        target.set_exception(exc)
