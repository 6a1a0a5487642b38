"""retry() and retrying() share one set of typed options: unknown keywords are a TypeError."""

from __future__ import annotations

from typing import Any

import pytest

from stormguard import ConfigError, retry, retrying


def _call(front: str, **options: Any) -> None:
    if front == "retry":
        retry(**options)
    else:
        retrying(**options)


@pytest.mark.parametrize("front", ["retry", "retrying"])
def test_unknown_keyword_is_a_type_error_naming_it(front: str) -> None:
    expected = rf"{front}\(\) got an unexpected keyword argument 'atempts'"
    with pytest.raises(TypeError, match=expected):
        _call(front, atempts=3)


@pytest.mark.parametrize("front", ["retry", "retrying"])
def test_policy_and_its_fields_together_is_a_config_error(front: str) -> None:
    from stormguard import RetryPolicy

    with pytest.raises(ConfigError, match="policy"):
        _call(front, policy=RetryPolicy(), attempts=2)


@pytest.mark.parametrize("front", ["retry", "retrying"])
def test_bad_field_value_fails_at_construction(front: str) -> None:
    with pytest.raises(ConfigError, match="attempts"):
        _call(front, attempts=0)
