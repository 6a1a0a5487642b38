"""stormguard's pure decision core: no I/O, no clock reads, no sleeping.

Everything here takes ``now`` (and an RNG where it draws) as input, so the same
objects drive the real adapters and the simulator. The package re-exports the
outcome table (``_outcome``) and the retry policy (``_policy``): each module's
``__all__`` is the one list of its names.
"""

from __future__ import annotations

from . import _outcome, _policy
from ._outcome import *  # noqa: F403
from ._policy import *  # noqa: F403

__all__: list[str] = []
__all__ += _outcome.__all__
__all__ += _policy.__all__
