# Validation of numeric settings, shared by the overload-control cores: each
# returns the normalised value or raises ConfigError naming the field.
from __future__ import annotations

import math

from .._errors import ConfigError

__all__ = ["check_count", "check_fraction", "check_number", "check_seconds"]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_fraction(value: object, field: str, *, low_open: bool = False) -> float:
    """``value`` as a float in [0, 1] ((0, 1] with ``low_open``)."""
    bounds = "(0, 1]" if low_open else "[0, 1]"
    if not _number(value):
        raise ConfigError(field, f"must be a number in {bounds}, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not (0.0 < number <= 1.0 if low_open else 0.0 <= number <= 1.0):
        raise ConfigError(field, f"must be in {bounds}, got {value!r}")
    return number


def check_seconds(value: object, field: str) -> float:
    """``value`` as a positive finite number of seconds."""
    if not _number(value) or not 0 < value < math.inf:  # type: ignore[operator]
        raise ConfigError(field, f"must be > 0 seconds and finite, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_number(value: object, field: str, *, least: float = 0.0) -> float:
    """``value`` as a finite float >= ``least``."""
    if not _number(value) or not least <= value < math.inf:  # type: ignore[operator]
        raise ConfigError(field, f"must be a finite number >= {least:g}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_count(value: object, field: str, *, least: int = 1) -> int:
    """``value`` as an integer >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(field, f"must be an integer >= {least}, got {value!r}")
    return value
