"""stormguard's pure decision core: no I/O, no clock reads, no sleeping.

Everything here takes ``now`` (and an RNG where it draws) as input, so the same
objects drive the real adapters and the simulator.
"""

from __future__ import annotations

from ._outcome import (
    DEFAULT_RETRY_STATUSES,
    IDEMPOTENT_METHODS,
    Failure,
    Verdict,
    classify_error,
    classify_status,
    counts_against_server,
    is_idempotent,
)
from ._policy import GiveUp, GiveUpReason, Retry, RetryFailure, RetryPolicy, RetryState, decide

__all__ = [
    "DEFAULT_RETRY_STATUSES",
    "IDEMPOTENT_METHODS",
    "Failure",
    "GiveUp",
    "GiveUpReason",
    "Retry",
    "RetryFailure",
    "RetryPolicy",
    "RetryState",
    "Verdict",
    "classify_error",
    "classify_status",
    "counts_against_server",
    "decide",
    "is_idempotent",
]
