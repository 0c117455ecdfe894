"""Relay of vLLM's ZMQ KV event publisher as stator `KvEvent`s.

vLLM publishes `(topic, sequence u64 big-endian, msgpack KVEventBatch)` frames on a PUB
socket. Its block hashes are its own (sha256 by default); stator events carry them as
64-bit ints (the same truncation vLLM applies with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) so
that a later BlockRemoved names the same block, and they carry the token ids, from which
the router recomputes stator's hashes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import msgspec
import zmq
import zmq.asyncio

from stator.protocols import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventData

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1


def as_int_hash(value: bytes | int) -> int:
    if isinstance(value, int):
        return value & _MASK64
    return int.from_bytes(value, "big") & _MASK64


_MEDIA = {"GPU": "gpu", "CPU": "host", "DISK": "disk"}


def tier_of(event: object) -> str:
    """vLLM's `medium` (set by its offloading connector: "GPU", "CPU", ...) as our tier."""
    medium = getattr(event, "medium", None)
    return _MEDIA.get(str(medium).upper(), str(medium).lower()) if medium else "gpu"


def convert_event(event: object) -> KvEventData | None:
    """One vLLM event as stator event data (None for kinds stator has no use for)."""
    kind = type(event).__name__
    if kind == "BlockStored":
        parent = event.parent_block_hash  # type: ignore[attr-defined]
        return BlockStored(
            block_hashes=[as_int_hash(h) for h in event.block_hashes],  # type: ignore[attr-defined]
            parent_hash=None if parent is None else as_int_hash(parent),
            token_ids=list(event.token_ids),  # type: ignore[attr-defined]
            block_size=event.block_size,  # type: ignore[attr-defined]
            lora_name=event.lora_name,  # type: ignore[attr-defined]
            tier=tier_of(event),
        )
    if kind == "BlockRemoved":
        hashes = [as_int_hash(h) for h in event.block_hashes]  # type: ignore[attr-defined]
        return BlockRemoved(block_hashes=hashes, tier=tier_of(event))
    if kind == "AllBlocksCleared":
        return AllCleared()
    return None


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: its PUB socket binds wildcard and ipc/inproc endpoints and connects to
    any other (`tcp://host:port`)."""
    return "*" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventRelay:
    """Subscribes to vLLM's publisher and numbers the events for one worker.

    `KvEventRelay.on_loopback(...)` binds the SUB side to a free loopback port first and
    hands vLLM that address (vLLM's PUB then connects to it), so no port is ever guessed.
    For a publisher the user configured, the relay connects to or binds the opposite way.
    """

    def __init__(self, topic: str, batch_decoder: msgspec.msgpack.Decoder) -> None:
        self.topic = topic
        self.endpoint = ""
        self._decoder = batch_decoder
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt_string(zmq.SUBSCRIBE, topic)
        self._next_id = 0
        self._last_seq: int | None = None

    @classmethod
    def on_loopback(cls, topic: str, batch_decoder: msgspec.msgpack.Decoder) -> KvEventRelay:
        relay = cls(topic, batch_decoder)
        port = relay._sock.bind_to_random_port("tcp://127.0.0.1")
        relay.endpoint = f"tcp://127.0.0.1:{port}"
        return relay

    @classmethod
    def for_publisher(
        cls, endpoint: str, topic: str, batch_decoder: msgspec.msgpack.Decoder
    ) -> KvEventRelay:
        """A relay for a publisher vLLM set up from the user's `--kv-events-config`."""
        relay = cls(topic, batch_decoder)
        if is_bind_endpoint(endpoint):
            relay.endpoint = endpoint.replace("*", "127.0.0.1")
            relay._sock.connect(relay.endpoint)
        else:
            relay.endpoint = endpoint
            relay._sock.bind(endpoint)
        return relay

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()

    async def batches(self, worker_id: int) -> AsyncIterator[list[KvEvent]]:
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) != 3:
                log.warning("unexpected KV event frame count %d from vLLM", len(frames))
                continue
            _topic, seq_bytes, payload = frames
            seq = int.from_bytes(seq_bytes, "big")
            if self._last_seq is not None and seq != self._last_seq + 1:
                # Our own event ids stay contiguous; the router resyncs through kv_state
                # only on gaps it sees, so a lost vLLM batch is worth a warning.
                log.warning("vLLM KV events skipped from seq %d to %d", self._last_seq, seq)
            self._last_seq = seq
            batch = self._decoder.decode(payload)
            dp_rank = batch.data_parallel_rank or 0
            events = []
            for raw in batch.events:
                data = convert_event(raw)
                if data is None:
                    continue
                events.append(
                    KvEvent(worker_id=worker_id, event_id=self._next_id, data=data, dp_rank=dp_rank)
                )
                self._next_id += 1
            if events:
                yield events
