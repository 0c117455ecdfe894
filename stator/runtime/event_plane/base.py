"""Event plane: fire-and-forget publish/subscribe of bytes on dotted topics.

Topics are `namespace.what` (e.g. `stator.kv_events`, `stator.load`). A subscription
matches a topic prefix. Delivery is best effort and ordered per publisher; consumers that
need completeness (the KV index) detect gaps with per-publisher event ids.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator


class EventPlane(abc.ABC):
    async def start(self) -> None:
        """Connect / bind. Idempotent."""

    @abc.abstractmethod
    async def publish(self, topic: str, payload: bytes) -> None: ...

    @abc.abstractmethod
    def subscribe(self, topic_prefix: str) -> AsyncIterator[tuple[str, bytes]]:
        """Yield (topic, payload) for every message whose topic starts with the prefix,
        published after the subscription was made, until closed."""

    @abc.abstractmethod
    async def close(self) -> None: ...
