"""requests integration: :class:`RetryAdapter` (``pip install 'stormguard[requests]'``)."""

from __future__ import annotations

from ._extras import require

require("requests", "requests")

from .client._requests import RetryAdapter  # noqa: E402

__all__ = ["RetryAdapter"]
