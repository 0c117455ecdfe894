"""`ApproxKvIndex`: for engines that publish no KV events (`--no-router-kv-events`), the
router assumes a worker holds the blocks of every prompt it sent there, for `ttl`
seconds after the last time it sent them (reuse refreshes them).

The assumption is kept in a `KvIndex`, so lookups cost the same as with events. An
insertion-ordered dict of (worker, block) -> expiry doubles as the expiry queue: the TTL
is the same for every block, so the least recently refreshed entry always expires first.
When the index holds more than `max_blocks` entries it is pruned to 80% of that, oldest
first, so a burst of unique prompts cannot grow it without bound.

Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from stator.router.kv_index import KvIndex, WorkerKey

_PRUNE_TO = 0.8


class ApproxKvIndex:
    def __init__(self, block_size: int, ttl: float, max_blocks: int) -> None:
        if ttl <= 0 or max_blocks <= 0:
            raise ValueError("ttl and max_blocks must be positive")
        self.index = KvIndex(block_size)
        self.ttl = ttl
        self.max_blocks = max_blocks
        self._expiry: dict[tuple[WorkerKey, int], float] = {}

    def __len__(self) -> int:
        return len(self._expiry)

    def record(self, key: WorkerKey, hashes: Sequence[int], now: float) -> None:
        """The router sent a prompt with these block hashes to `key`."""
        self.expire(now)
        expiry = self._expiry
        until = now + self.ttl
        for h in hashes:
            entry = (key, h)
            # pop + insert moves the entry to the back of the expiry order
            expiry.pop(entry, None)
            expiry[entry] = until
        self.index.store(key, hashes)
        if len(expiry) > self.max_blocks:
            self._drop_oldest(len(expiry) - int(self.max_blocks * _PRUNE_TO))

    def expire(self, now: float) -> int:
        """Forget blocks whose TTL has passed; how many were dropped."""
        count = 0
        for (_key, _h), until in self._expiry.items():
            if until > now:
                break
            count += 1
        if count:
            self._drop_oldest(count)
        return count

    def _drop_oldest(self, count: int) -> None:
        expiry = self._expiry
        by_key: dict[WorkerKey, list[int]] = {}
        for entry in list(islice(expiry, count)):
            del expiry[entry]
            by_key.setdefault(entry[0], []).append(entry[1])
        for key, hashes in by_key.items():
            self.index.remove(key, hashes)

    def find_matches(self, hashes: Sequence[int], now: float) -> dict[WorkerKey, int]:
        self.expire(now)
        return self.index.find_matches(hashes)

    def tree_size(self, key: WorkerKey) -> int:
        return self.index.tree_size(key)

    def remove_worker(self, worker_id: int) -> None:
        self._expiry = {e: t for e, t in self._expiry.items() if e[0][0] != worker_id}
        self.index.remove_worker(worker_id)
