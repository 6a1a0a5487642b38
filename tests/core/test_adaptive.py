"""The adaptive concurrency limit: its response to latency, its bounds and its probes."""

from __future__ import annotations

import math

import pytest

from stormguard._errors import ConfigError
from stormguard.core._adaptive import AdaptiveLimitCore, percentile

STEP = 0.005  # seconds of virtual time per model step


class Service:
    """A service with `slots` parallel slots and a service time, under saturating load.

    With L requests in flight (L = the controller's limit: callers always wait), it
    finishes min(L, slots) / service requests per second, each after
    service * max(1, L / slots) seconds (Little's law: the excess queues inside).
    Deterministic: completions accumulate fractionally.
    """

    def __init__(self, slots: int, service: float) -> None:
        self.slots = slots
        self.service = service
        self.now = 0.0
        self._owed = 0.0

    def run(self, core: AdaptiveLimitCore, seconds: float) -> list[int]:
        """Advance ``seconds``; the limit seen at each step."""
        seen = []
        for _ in range(round(seconds / STEP)):
            limit = core.current()
            seen.append(limit)
            self._owed += min(limit, self.slots) / self.service * STEP
            rtt = self.service * max(1.0, limit / self.slots)
            while self._owed >= 1.0:
                self._owed -= 1.0
                core.record(self.now, rtt, limit)
            self.now += STEP
        return seen


def test_percentile_is_nearest_rank() -> None:
    """The median of 1..10 is 5 and the 0.9 quantile 9 (nearest rank)."""
    values = [float(v) for v in range(10, 0, -1)]
    assert percentile(values, 0.5) == 5.0 and percentile(values, 0.9) == 9.0
    assert percentile(values, 1.0) == 10.0 and percentile([3.0], 0.5) == 3.0


def test_settles_just_above_the_knee() -> None:
    """Saturated, the limit settles a little above the service's slots (headroom only)."""
    core = AdaptiveLimitCore(initial_limit=40, max_limit=200)
    service = Service(slots=20, service=0.05)
    settled = service.run(core, 20.0)[-400:]
    knee, headroom = 20, 1.1 * 20 + math.sqrt(30)
    assert min(settled) >= knee
    assert max(settled) <= math.ceil(headroom)
    assert core.min_rtt == pytest.approx(0.05)


def test_capacity_step_down_and_back_up() -> None:
    """Half the slots gone: the limit follows down within seconds, and back up after."""
    core = AdaptiveLimitCore(initial_limit=20, max_limit=200)
    service = Service(slots=40, service=0.05)
    before = service.run(core, 10.0)[-1]
    service.slots = 20
    during = service.run(core, 10.0)
    service.slots = 40
    after = service.run(core, 10.0)
    assert before >= 40
    assert during[-1] < before * 0.7 and during[-1] >= 20
    assert after[-1] >= 40


def test_latency_step_lowers_the_limit_at_once() -> None:
    """Latency triples at the same in-flight count: the next interval's gradient is the
    floor 0.5 and the limit falls."""
    core = AdaptiveLimitCore(initial_limit=40, interval=0.1, min_samples=5, probe_samples=5)
    now = 0.0
    for _ in range(5):  # the start-up probe at ceil(40 * 0.25) = 10
        core.record(now, 0.010, 10)
    assert core.min_rtt == 0.010 and not core.probing
    for _ in range(20):  # a full, steady interval at the min RTT
        now += 0.01
        core.record(now, 0.010, 40)
    steady = core.limit
    assert steady > 40  # unloaded latency: grows (gradient 1.1 plus headroom)
    for _ in range(20):
        now += 0.01
        core.record(now, 0.030, 40)
    assert core.gradient == 0.5
    assert core.limit < steady
    assert core.sample_rtt == 0.030


def test_app_limited_does_not_grow() -> None:
    """With at most a quarter of the limit in flight, fast answers do not raise it."""
    core = AdaptiveLimitCore(initial_limit=40, min_samples=5, probe_samples=5)
    now = 0.0
    for _ in range(200):
        now += 0.01
        core.record(now, 0.010, 8)
    assert core.current() == 40


def test_drops_back_off() -> None:
    """Dropped requests in an interval cut the limit by `backoff` at least."""
    core = AdaptiveLimitCore(initial_limit=50, min_samples=5, probe_samples=5, backoff=0.8)
    now = 0.0
    for _ in range(5):
        core.record(now, 0.010, 10)
    before = core.limit
    for _ in range(3):
        now += 0.05
        core.record(now, 0.010, 50, dropped=True)
    assert core.limit <= before * 0.8


def test_bounds_hold() -> None:
    """However the latency moves, the limit stays within [min_limit, max_limit]."""
    core = AdaptiveLimitCore(min_limit=4, max_limit=30, initial_limit=10, probe_samples=5)
    service = Service(slots=200, service=0.01)  # never saturated: the limit grows
    assert max(service.run(core, 10.0)) <= 30
    service.slots = 1  # everything queues: the limit falls
    assert min(service.run(core, 10.0)) >= 1
    assert core.current() >= 4 or core.probing


def test_probes_measure_the_unloaded_latency() -> None:
    """Start-up probe at ceil(limit * probe_ratio); then every probe_interval again."""
    core = AdaptiveLimitCore(
        initial_limit=40, probe_ratio=0.25, probe_samples=4, probe_interval=1.0, min_samples=2
    )
    assert core.probing and core.current() == 10
    for rtt in (0.04, 0.02, 0.03, 0.05):
        core.record(0.0, rtt, 10)
    assert not core.probing and core.min_rtt == 0.03 and core.current() == 40
    now = 0.0
    while not core.probing:
        now += 0.05
        core.record(now, 0.03, 40)
    assert now >= 1.0 and core.probes == 1
    # requests admitted before the probe began do not count as probe samples
    core.record(now + 0.01, 0.5, 40)
    assert core.probing
    for _ in range(4):
        core.record(now + 0.02, 0.01, 10)
    assert core.min_rtt == 0.01 and not core.probing and core.probes == 2


def test_ignores_unusable_latencies() -> None:
    """A negative or infinite latency (a clock read wrong) changes nothing."""
    core = AdaptiveLimitCore(probe_samples=1)
    core.record(0.0, -1.0, 1)
    core.record(0.0, math.inf, 1)
    assert core.probing and core.min_rtt is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_limit": 0}, "min_limit"),
        ({"min_limit": 10, "max_limit": 5}, "max_limit"),
        ({"initial_limit": 5000}, "initial_limit"),
        ({"tolerance": -0.1}, "tolerance"),
        ({"headroom": -1}, "headroom"),
        ({"smoothing": 0}, "smoothing"),
        ({"interval": 0}, "interval"),
        ({"min_samples": 0}, "min_samples"),
        ({"percentile": 1.5}, "percentile"),
        ({"backoff": 0}, "backoff"),
        ({"probe_interval": math.inf}, "probe_interval"),
        ({"probe_ratio": 2}, "probe_ratio"),
        ({"probe_samples": True}, "probe_samples"),
    ],
)
def test_invalid_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    """Every invalid setting fails at construction with ConfigError naming it."""
    with pytest.raises(ConfigError) as raised:
        AdaptiveLimitCore(**kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field
