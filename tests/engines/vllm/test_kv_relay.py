"""The KV event relay against a ZMQ publisher that speaks vLLM's wire format (no engine)."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import msgspec
import zmq
import zmq.asyncio
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

from stator.engines.vllm.kv_events import KvEventRelay, as_int_hash
from stator.protocols import AllCleared
from stator.protocols import BlockRemoved as StatorRemoved
from stator.protocols import BlockStored as StatorStored


def stored(hashes: list[bytes], parent: bytes | None, tokens: list[int]) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


async def test_relay_converts_and_numbers_vllm_batches():
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    relay = KvEventRelay.on_loopback("kv", decoder)
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.connect(relay.endpoint)  # what vLLM does with a tcp://host:port endpoint
    encoder = msgspec.msgpack.Encoder()
    h1, h2 = b"\x01" * 32, b"\x02" * 32
    batches = [
        KVEventBatch(ts=1.0, events=[stored([h1, h2], None, [5, 6, 7, 8])]),
        KVEventBatch(ts=2.0, events=[BlockRemoved(block_hashes=[h2], medium="GPU")]),
        KVEventBatch(ts=3.0, events=[AllBlocksCleared()], data_parallel_rank=1),
    ]
    seen: list = []

    async def consume():
        async for batch in relay.batches(worker_id=3):
            seen.extend(batch)

    consumer = asyncio.create_task(consume())
    try:
        # A connecting PUB drops what it sends before the connection is up: publish a
        # warm-up batch until the relay sees one.
        warmup = encoder.encode(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
        for _ in range(300):
            await pub.send_multipart([b"kv", (0).to_bytes(8, "big"), warmup])
            await asyncio.sleep(0.1)
            if seen:
                break
        await asyncio.sleep(0.5)  # warm-up copies still in flight land first
        skip = len(seen)
        for seq, batch in enumerate(batches, start=1):
            await pub.send_multipart([b"kv", seq.to_bytes(8, "big"), encoder.encode(batch)])
        for _ in range(200):
            if len(seen) >= skip + 3:
                break
            await asyncio.sleep(0.05)
    finally:
        consumer.cancel()
        pub.close(0)
        ctx.term()
        relay.close()
    received = seen[skip:]
    first_id = skip
    assert [e.event_id for e in received] == [first_id, first_id + 1, first_id + 2]
    assert all(e.worker_id == 3 for e in received)
    first = received[0].data
    assert isinstance(first, StatorStored)
    assert first.block_hashes == [as_int_hash(h1), as_int_hash(h2)]
    assert first.token_ids == [5, 6, 7, 8] and first.block_size == 2 and first.parent_hash is None
    assert isinstance(received[1].data, StatorRemoved)
    assert received[1].data.block_hashes == [as_int_hash(h2)]
    assert isinstance(received[2].data, AllCleared) and received[2].dp_rank == 1


def test_int_hashes_fit_64_bits():
    assert as_int_hash(b"\xff" * 32) == (1 << 64) - 1
    assert as_int_hash(7) == 7
