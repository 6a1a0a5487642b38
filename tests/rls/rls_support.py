"""Building real RateLimitRequest messages and reading RateLimitResponse ones."""

from __future__ import annotations

from typing import Any

from stormguard.gateway.rls._pb import ratelimit_pb2, ratelimit_unit_pb2, rls_pb2

Descriptor = ratelimit_pb2.RateLimitDescriptor
Request = rls_pb2.RateLimitRequest
Response = rls_pb2.RateLimitResponse
OK = Response.Code.OK
OVER_LIMIT = Response.Code.OVER_LIMIT
UNIT = Response.RateLimit.Unit
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
MAX_UINT32 = (1 << 32) - 1


def descriptor(
    *entries: tuple[str, str], hits: int | None = None, limit: tuple[int, str] | None = None
) -> Any:
    """A descriptor of ``(key, value)`` entries; ``hits`` sets its own hits_addend;
    ``limit`` = ``(requests_per_unit, "MINUTE")`` is a request-side override."""
    d = Descriptor(entries=[Descriptor.Entry(key=k, value=v) for k, v in entries])
    if hits is not None:
        d.hits_addend.value = hits
    if limit is not None:
        d.limit.requests_per_unit = limit[0]
        d.limit.unit = ratelimit_unit_pb2.RateLimitUnit.Value(limit[1])
    return d


def request(domain: str, *descriptors: Any, hits: int = 0) -> Any:
    """A RateLimitRequest; each descriptor is a Descriptor or a sequence of entries."""
    built = [d if isinstance(d, Descriptor) else descriptor(*d) for d in descriptors]
    return Request(domain=domain, descriptors=built, hits_addend=hits)


def codes(response: Any) -> list[str]:
    """The overall code followed by each descriptor's, as names."""
    names = Response.Code.Name
    return [names(response.overall_code), *(names(s.code) for s in response.statuses)]


def remaining(response: Any) -> list[int]:
    """Each descriptor's limit_remaining."""
    return [s.limit_remaining for s in response.statuses]


def headers(response: Any) -> dict[str, str]:
    """response_headers_to_add as a dict."""
    return {h.key: h.value for h in response.response_headers_to_add}
