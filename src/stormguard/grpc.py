"""gRPC integration: retrying client interceptors (``pip install 'stormguard[grpc]'``)."""

from __future__ import annotations

from ._extras import require

require("grpc", "grpc")

from .client._grpc import AsyncRetryInterceptor, RetryInterceptor  # noqa: E402

__all__ = ["AsyncRetryInterceptor", "RetryInterceptor"]
