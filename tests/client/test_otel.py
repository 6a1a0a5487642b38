"""Issue 16 item 5: retries as span events, give-ups as the span's ERROR status."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from http_support import ScriptedServer, Step
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from stormguard import RetryPolicy
from stormguard.httpx import RetryTransport
from stormguard.testing import FakeClock


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider exporting to memory (not installed globally)."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield tracer_provider, exporter
    tracer_provider.shutdown()


def traced_get(url: str, provider: TracerProvider, exporter: InMemorySpanExporter) -> ReadableSpan:
    """One GET through RetryTransport inside a span; the finished span."""
    transport = RetryTransport(policy=RetryPolicy(attempts=5, deadline=30), clock=FakeClock())
    with (
        provider.get_tracer("test").start_as_current_span("call"),
        httpx.Client(transport=transport, timeout=10) as client,
    ):
        client.get(url)
    (span,) = exporter.get_finished_spans()
    return span


def test_each_retry_adds_one_event_with_the_resend_count(
    server: ScriptedServer, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Two 503s then 200: two events, resend counts 1 and 2, the status and the wait."""
    busy = Step(503, {"Retry-After": "1"})
    server.script(busy, busy, Step(200))
    span = traced_get(server.url, *provider)
    events = [event for event in span.events if event.name == "stormguard.retry"]
    assert [event.attributes["http.request.resend_count"] for event in events] == [1, 2]
    assert [event.attributes["http.response.status_code"] for event in events] == [503, 503]
    assert all(float(event.attributes["stormguard.retry.wait_s"]) >= 1.0 for event in events)
    assert span.status.status_code is StatusCode.UNSET


def test_a_give_up_sets_the_span_status_to_error(
    server: ScriptedServer, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A 429 asking for a day: no retry event, the span's status is ERROR with the reason."""
    server.script(Step(429, {"Retry-After": "86400"}))
    span = traced_get(server.url, *provider)
    assert not [event for event in span.events if event.name == "stormguard.retry"]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None and "hint too long" in span.status.description


def test_import_stormguard_does_not_import_opentelemetry() -> None:
    """`import stormguard` (and its HTTP adapter) leaves opentelemetry unimported."""
    code = (
        "import sys, stormguard, stormguard.httpx; "
        "sys.exit(any(name.startswith('opentelemetry') for name in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
