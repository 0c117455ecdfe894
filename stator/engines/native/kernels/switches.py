"""Kernel switches read from the environment at import (docs/native_kernels.md lists them).

They are not engine flags: they pick among kernels that compute the same thing, for
comparisons and for falling back when one misbehaves on a device. A value that is not one
of the switch's own is refused at import, so a typo stops the start-up with its name and
the values it takes instead of failing the first request that meets the kernel."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def flag(name: str, default: bool) -> bool:
    """`name`'s value as on (1, true, on, yes) or off (0, false, off, no; any case),
    `default` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() in _ON:
        return True
    if raw.lower() in _OFF:
        return False
    raise ValueError(f"{name} must be 1 or 0 (true/false, on/off), not {raw!r}")


def positive_int(name: str, default: int) -> int:
    """`name`'s value as an integer >= 1, `default` when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, not {raw!r}")
    return value


def choice(name: str, choices: tuple[str, ...]) -> str | None:
    """`name`'s value if it is one of `choices`; None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if raw not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def parsed(name: str, parse: Callable[[str], T]) -> T | None:
    """`name`'s value read by `parse` (which raises ValueError on text it does not take),
    the refusal prefixed with the switch's name; None when unset or empty."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return parse(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
