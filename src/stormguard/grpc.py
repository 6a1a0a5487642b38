"""gRPC integration: retrying client interceptors (``pip install 'stormguard[grpc]'``)."""

from __future__ import annotations

from ._extras import require

require("grpc", "grpc")

from .client._grpc import AsyncRetryInterceptor, RetryInterceptor  # noqa: E402
from .client._grpc_config import channel_options  # noqa: E402
from .client._grpc_hedge import AsyncHedgingInterceptor, HedgingInterceptor  # noqa: E402

# Server side (stormguard.server): rate limits, concurrency and idempotency.
from .server._grpc import (  # noqa: E402
    AsyncRateLimitServerInterceptor,
    RateLimitServerInterceptor,
)

__all__ = [
    "AsyncHedgingInterceptor",
    "AsyncRateLimitServerInterceptor",
    "AsyncRetryInterceptor",
    "HedgingInterceptor",
    "RateLimitServerInterceptor",
    "RetryInterceptor",
    "channel_options",
]
