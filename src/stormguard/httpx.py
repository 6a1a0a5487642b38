"""httpx integration: :class:`RetryTransport` (``pip install 'stormguard[httpx]'``)."""

from __future__ import annotations

from ._extras import require

require("httpx", "httpx")

from .client._hedge_httpx import HedgingTransport  # noqa: E402
from .client._httpx import RetryTransport  # noqa: E402

__all__ = ["HedgingTransport", "RetryTransport"]
