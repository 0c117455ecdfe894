"""Checks for request parameters: each returns the value (None when absent) or raises
`InvalidParam` naming the parameter, which the frontend turns into a 400."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class InvalidParam(ValueError):
    """A request parameter is wrong. `param` names it, as OpenAI's error object does."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def present(body: Mapping[str, Any], name: str) -> bool:
    return body.get(name) is not None


def as_number(
    value: Any,
    param: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParam(f"{param} must be a number; got {value!r}.", param)
    value = float(value)
    if not math.isfinite(value):
        raise InvalidParam(f"{param} must be a finite number.", param)
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        raise InvalidParam(f"{param} must be in {_range(low, high, low_open)}; got {value}.", param)
    return value


def as_int(
    value: Any, param: str, *, low: int | None = None, high: int | None = None
) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON clients sometimes send 16.0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParam(f"{param} must be an integer; got {value!r}.", param)
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidParam(f"{param} must be in {_range(low, high)}; got {value}.", param)
    return value


def as_bool(value: Any, param: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidParam(f"{param} must be a boolean; got {value!r}.", param)
    return value


def _range(low: float | None, high: float | None, low_open: bool = False) -> str:
    left = "(" if low_open else "["
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{left}{lo}, {hi}]"
