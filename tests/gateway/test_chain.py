"""The request chain (gateway/chain): stage outcomes, the two drivers, the setting."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import yaml

from stormguard.gateway._app import Gateway
from stormguard.gateway._config import parse_config
from stormguard.gateway._metrics import GatewayMetrics
from stormguard.gateway._runtime import Runtime
from stormguard.gateway.chain import (
    DONE,
    DRIVER_ENV,
    NEEDS_CYCLE,
    Exchange,
    Stage,
    arun,
    begin,
    begin_resume,
    driver_of,
    entry_for,
    run,
    stages_of,
)
from stormguard.gateway.chain._stages import (
    ATTEMPTS,
    BODY_CAP,
    CLIENT,
    GUARD,
    IDEMPOTENCY,
    LIMITS,
    OVERLOAD,
    RETRIES,
    ROUTE,
)
from stormguard.server._refusal import Refusal
from stormguard.stores._pending import Pending

REFUSED = Refusal.of(429, "slow down", reason="rate_limited")


class Recorder(Stage):
    """A stage that notes each call in ``seen`` and returns ``outcome``."""

    def __init__(self, name: str, seen: list[str], outcome: Any = None) -> None:
        self.name, self.seen, self.outcome = name, seen, outcome

    def run(self, ex: Any) -> Any:
        self.seen.append(self.name)
        return self.outcome

    def resume(self, ex: Any, result: Any) -> Any:
        self.seen.append(f"{self.name} resumed with {result}")
        return REFUSED if result == "refuse" else None


class Probe(Exchange):
    """An exchange whose answer, failure and hand-over are recorded."""

    def __init__(self, stages: tuple[Stage, ...], loop: Any = None) -> None:
        proto = type("Proto", (), {"loop": loop})()
        scope = {"method": "GET", "path": "/", "headers": []}
        super().__init__(proto, scope, True, None, None, stages)  # type: ignore[arg-type]
        self.answers: list[Any] = []

    def refuse(self, refusal: Refusal) -> None:
        self.answers.append(refusal)

    async def arefuse(self, refusal: Refusal) -> None:
        self.answers.append(refusal)

    def fail(self) -> None:
        self.answers.append("failed")

    def to_cycle(self, i: int) -> None:
        self.answers.append(("cycle", i))


def test_continue_runs_every_stage_in_order() -> None:
    """Stages that continue run one after another, and the chain ends after the last."""
    seen: list[str] = []
    ex = Probe(tuple(Recorder(n, seen) for n in ("a", "b", "c")))
    run(ex, 0)
    assert seen == ["a", "b", "c"] and ex.answers == []


def test_an_answer_stops_the_chain_and_is_sent() -> None:
    """A stage's refusal is answered; the stages after it never run."""
    seen: list[str] = []
    ex = Probe((Recorder("a", seen), Recorder("b", seen, REFUSED), Recorder("c", seen)))
    run(ex, 0)
    assert seen == ["a", "b"] and ex.answers == [REFUSED]


def test_done_ends_the_chain_without_an_answer_of_the_drivers() -> None:
    """DONE: the stage answered itself; nothing more runs."""
    seen: list[str] = []
    ex = Probe((Recorder("a", seen, DONE), Recorder("b", seen)))
    run(ex, 0)
    assert seen == ["a"] and ex.answers == []


def test_a_stage_waiting_on_a_future_is_resumed_by_its_callback_without_a_task() -> None:
    """A Pending resolved later resumes the chain from its done-callback: no event
    loop runs here at all, so no task can have been made."""
    seen: list[str] = []
    pending: Pending[str] = Pending()
    ex = Probe((Recorder("a", seen, pending), Recorder("b", seen)))
    run(ex, 0)
    assert seen == ["a"]  # waiting
    pending.set_result("ok")
    assert seen == ["a", "a resumed with ok", "b"] and ex.answers == []


def test_a_resumed_stage_can_answer() -> None:
    """The outcome of ``resume`` is acted on like that of ``run``."""
    seen: list[str] = []
    pending: Pending[str] = Pending()
    ex = Probe((Recorder("a", seen, pending), Recorder("b", seen)))
    run(ex, 0)
    pending.set_result("refuse")
    assert seen == ["a", "a resumed with refuse"] and ex.answers == [REFUSED]


def test_a_future_that_fails_fails_the_request() -> None:
    """An exception in the awaited result is the request's failure (a 502 on the wire)."""
    seen: list[str] = []
    pending: Pending[str] = Pending()
    ex = Probe((Recorder("a", seen, pending), Recorder("b", seen)))
    run(ex, 0)
    pending.set_exception(RuntimeError("store gone"))
    assert seen == ["a"] and ex.answers == ["failed"]


class CallbackProbe(Probe):
    """A Probe that notes each done-callback the driver hands a future."""

    def __init__(self, stages: tuple[Stage, ...]) -> None:
        super().__init__(stages)
        self.callbacks = 0

    def on_result(self, future: Any) -> None:
        self.callbacks += 1
        super().on_result(future)


def _resolved(value: Any) -> Pending[Any]:
    pending: Pending[Any] = Pending()
    pending.set_result(value)
    return pending


@pytest.mark.parametrize(
    ("value", "seen_after", "answers"),
    [
        ("ok", ["a", "a resumed with ok", "b"], []),
        ("refuse", ["a", "a resumed with refuse"], [REFUSED]),
    ],
)
def test_a_pending_resolved_already_is_resumed_in_place(
    value: str, seen_after: list[str], answers: list[Any]
) -> None:
    """A decision made in this process (approximate limits) comes back as a Pending
    resolved already: the driver resumes the stage in the same loop, with no
    done-callback, and acts on the outcome as on any other."""
    seen: list[str] = []
    ex = CallbackProbe((Recorder("a", seen, _resolved(value)), Recorder("b", seen)))
    run(ex, 0)
    assert seen == seen_after and ex.answers == answers
    assert ex.callbacks == 0


def test_a_pending_failed_already_fails_the_request() -> None:
    """A Pending resolved with an error before the stage returned it: a 502, and the
    stages after it never run."""
    seen: list[str] = []
    pending: Pending[str] = Pending()
    pending.set_exception(RuntimeError("store gone"))
    ex = CallbackProbe((Recorder("a", seen, pending), Recorder("b", seen)))
    run(ex, 0)
    assert seen == ["a"] and ex.answers == ["failed"] and ex.callbacks == 0


def test_a_store_limits_stage_goes_on_at_once_when_the_store_has_nothing_to_say() -> None:
    """Approximate limits admitted from this process's reservations (the rules'
    NOTHING): the stage continues the chain (None), no Pending to resume; any other
    answer is handed to the driver as it is."""
    from stormguard.gateway.chain._stages import StoreLimitsStage
    from stormguard.server._plan import NOTHING

    later: Pending[Any] = Pending()
    for answer, expected in ((NOTHING, None), (later, later)):
        rules = type("Rules", (), {"submit": lambda self, *a, quiet, x=answer: x})()
        ex = Probe(())
        ex.proto = None  # (no connection: each request submitted whole)
        ex.route = type("Route", (), {"rules": rules})()  # type: ignore[assignment]
        ex.view = object()
        assert StoreLimitsStage().run(ex) is expected


def test_a_steady_client_submits_through_its_kept_submitter() -> None:
    """The store-limits stage of a connection's one client: the rules' submitter is
    asked for once and kept on the connection; its next requests call it, with no
    view or key made again; a new client (limits_known reset) asks afresh."""
    from stormguard.gateway.chain._stages import StoreLimitsStage

    calls: list[str] = []

    class Rules:
        def submitter(self, view: Any) -> Any:
            calls.append("submitter")
            return lambda: calls.append("kept") or None

        def submit(self, *args: Any, quiet: bool) -> Any:  # pragma: no cover - not asked
            calls.append("submit")

    rules = Rules()
    proto = type("Proto", (), {"limits_known": None, "loop": None})()
    identity = type("Identity", (), {"per_connection": True})()
    stage = StoreLimitsStage()
    for steady in (False, True, True):
        ex = Probe(())
        ex.proto = proto
        ex.steady = steady
        ex.route = type("Route", (), {"rules": rules})()  # type: ignore[assignment]
        ex.rt = type("Rt", (), {"identity": identity})()  # type: ignore[assignment]
        assert stage.run(ex) is None
    assert calls == ["submitter", "kept", "kept", "kept"]


def test_a_coroutine_runs_in_a_task_and_its_result_is_the_outcome() -> None:
    """A stage that must run a coroutine gets a task; the chain goes on after it."""
    seen: list[str] = []

    async def main() -> None:
        async def wait() -> None:
            await asyncio.sleep(0)
            seen.append("coroutine")

        ex = Probe((Recorder("a", seen, wait()), Recorder("b", seen)), asyncio.get_running_loop())
        run(ex, 0)
        assert ex.waiting is not None  # the task
        assert seen == ["a"]
        await ex.waiting
        assert seen == ["a", "coroutine", "b"] and ex.waiting is None

    asyncio.run(main())


def test_needs_cycle_hands_the_request_over_at_that_stage() -> None:
    """NEEDS_CYCLE hands the exchange to the ASGI cycle, which resumes at that stage."""
    seen: list[str] = []
    ex = Probe((Recorder("a", seen), Recorder("b", seen, NEEDS_CYCLE), Recorder("c", seen)))
    run(ex, 0)
    assert seen == ["a", "b"] and ex.answers == [("cycle", 1)]


def test_a_stage_that_raises_fails_the_request() -> None:
    """A bug in a stage is the request's failure, never the listener's."""

    class Broken(Stage):
        def run(self, ex: Any) -> Any:
            raise ZeroDivisionError

    ex = Probe((Broken(),))
    run(ex, 0)
    assert ex.answers == ["failed"]


def test_the_task_driver_awaits_futures_and_coroutines_in_place() -> None:
    """On the ASGI leg the same stages run, waiting in the task."""
    seen: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        loop.call_soon(future.set_result, "ok")

        async def wait() -> None:
            seen.append("coroutine")

        stages = (Recorder("a", seen, future), Recorder("b", seen, wait()), Recorder("c", seen))
        await arun(Probe(stages, loop), 0)

    asyncio.run(main())
    assert seen == ["a", "a resumed with ok", "b", "coroutine", "c"]


@pytest.mark.parametrize(
    ("value", "driver"),
    [
        (None, "auto"),
        ("", "auto"),
        ("callback", "callback"),
        ("RESUME", "resume"),
        ("auto", "auto"),
    ],
)
def test_the_driver_setting(value: str | None, driver: str) -> None:
    """STORMGUARD_GATEWAY_DRIVER names the driver (case-insensitive); unset is auto."""
    environ = {} if value is None else {DRIVER_ENV: value}
    assert driver_of(environ) == driver


@pytest.mark.parametrize("value", ["fast", "callbacks", "1"])
def test_a_bad_driver_setting_is_an_error_naming_the_variable(value: str) -> None:
    """Any other value is refused with the variable's name and the choices."""
    with pytest.raises(ValueError, match=r"STORMGUARD_GATEWAY_DRIVER=.*callback, resume, auto"):
        driver_of({DRIVER_ENV: value})


def test_a_bad_driver_setting_stops_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway does not start on a bad driver setting."""
    monkeypatch.setenv(DRIVER_ENV, "sideways")
    with pytest.raises(ValueError, match=DRIVER_ENV):
        Gateway(parse_config(yaml.safe_dump(CONFIG)))


@pytest.mark.parametrize(
    ("driver", "entry"), [("callback", begin), ("auto", begin), ("resume", begin_resume)]
)
def test_the_driver_picks_the_listener_entry(driver: str, entry: Any) -> None:
    """callback and auto run stages in the parser callback; resume never does."""
    assert entry_for(driver) is entry


CONFIG = {
    "upstreams": {
        "a": {"url": "http://127.0.0.1:9"},
        "r": {"url": "http://127.0.0.1:9", "retries": {"attempts": 2}},
        "o": {"url": "http://127.0.0.1:9", "overload": {"limit": 2}},
    },
    "limits": {"pc": {"algorithm": "token_bucket", "rate": 1, "burst": 5, "per": "client"}},
    "routes": [
        {"path": "/keyed", "upstream": "a", "idempotency": "honor"},
        {"path": "/retried", "upstream": "r"},
        {"path": "/plain", "upstream": "a"},
        {"path": "/lined", "upstream": "o"},
        {"path": "/", "upstream": "a", "limits": ["pc"]},
    ],
}


def _runtime() -> Runtime:
    return Runtime(parse_config(yaml.safe_dump(CONFIG)), GatewayMetrics())


@pytest.mark.parametrize(
    ("path", "stages"),
    [
        ("/", (ROUTE, CLIENT, BODY_CAP, LIMITS, GUARD, ATTEMPTS)),
        ("/plain", (ROUTE, CLIENT, BODY_CAP, GUARD, ATTEMPTS)),
        ("/keyed", (ROUTE, CLIENT, BODY_CAP, IDEMPOTENCY, GUARD, ATTEMPTS)),
        ("/retried", (ROUTE, CLIENT, BODY_CAP, RETRIES, GUARD, ATTEMPTS)),
        ("/lined", (ROUTE, CLIENT, BODY_CAP, OVERLOAD, GUARD, ATTEMPTS)),
    ],
)
def test_a_route_has_its_stage_tuple_built_once(path: str, stages: tuple[Stage, ...]) -> None:
    """The tuple holds the stages that apply, in the chain's order, made once per route."""
    route = _runtime().match(path, "GET", None)
    assert route is not None
    built = stages_of(route)
    assert built == stages
    assert route.stages is built


class Loop:
    """A stand-in for the event loop: records call_soon."""

    def __init__(self) -> None:
        self.soon: list[Any] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.soon.append((callback, args))


class Proto:
    """What the entries read of the listener's connection."""

    def __init__(self) -> None:
        self.loop = Loop()
        self.client_known: Any = None
        self.limits_known: Any = None
        self.cycle: Any = None


def _scope(path: str, headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
        "headers": [(b"host", b"gw"), *(headers or [])],
    }


def test_the_resume_driver_runs_no_stage_in_the_parser_callback() -> None:
    """begin_resume makes the exchange and schedules its first stage; nothing else."""
    runtime = _runtime()
    proto = Proto()
    ex = begin_resume(runtime, proto, _scope("/"), True)
    assert isinstance(ex, Exchange)
    assert ex.route is None and runtime.store._data == {}  # no route matched, no limit
    [(callback, args)] = proto.loop.soon
    assert callback == ex.run_from and args == (0,)


def test_the_callback_driver_decides_limits_in_the_parser_callback() -> None:
    """begin runs the stages at once: the route is matched and the limit charged."""
    runtime = _runtime()

    async def main() -> None:
        proto = Proto()
        proto.loop = asyncio.get_running_loop()  # type: ignore[assignment]
        ex = begin(runtime, proto, _scope("/"), True)
        assert ex.route is not None and ex.route.name == "/"
        assert runtime.store._data != {}  # the limit was charged in the callback
        assert ex.admitted  # the guard admitted it: it waits for an upstream connection
        task = ex.waiting
        assert task is not None
        await asyncio.sleep(0)  # the connect begins
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
