"""Discovery: a small key-value store with leases and watches.

Every key a `Discovery` object puts is bound to its lease: when the owner closes (or dies
and stops heartbeating), its keys disappear and watchers see deletes. Backends: `mem`
(one process), `file:DIR` (processes on one host), `etcd://host:port` (a cluster).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Literal

import msgspec


class WatchEvent(msgspec.Struct, frozen=True):
    kind: Literal["put", "delete"]
    key: str
    value: bytes = b""


class Discovery(abc.ABC):
    """One lease holder. `lease_id` is unique in the store and doubles as instance id."""

    lease_id: int

    async def start(self) -> None:
        """Connect and take the lease. Idempotent."""

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> None:
        """Create or replace `key`, bound to this object's lease."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove `key` (no error if it is absent)."""

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every live key under `prefix`."""

    @abc.abstractmethod
    def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        """Current keys under `prefix` as `put` events, then every change, until the
        iterator is closed or the discovery object is closed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Give up the lease: this object's keys are deleted."""
