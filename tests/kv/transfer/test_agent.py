"""`KvTransferAgent` between two CPU pools over TCP: the decode side keeps one connection
per prefill server, survives the server dropping it, and never reuses a connection cut
mid-exchange, and gives up on a server that goes quiet."""

from __future__ import annotations

import asyncio

import pytest
import torch

from stator.kv.block_copy import pool_shape
from stator.kv.transfer.agent import KvTransferAgent, TransferError
from stator.kv.transfer.config import TransferConfig
from stator.kv.transfer.peer import layout


@pytest.fixture
async def pair():
    pins = {"p1": [1, 2, 3]}
    released: list[str] = []

    async def release(pin: str) -> bool:
        released.append(pin)
        return pins.pop(pin, None) is not None

    src = torch.randn(pool_shape(2, 8, 4, 2, 8))
    prefill = KvTransferAgent(TransferConfig(kind="tcp"), src, pins=pins.get, release=release)
    await prefill.serve()
    decode = KvTransferAgent(TransferConfig(kind="tcp"), torch.zeros(pool_shape(2, 8, 4, 2, 8)))
    yield prefill, decode, released
    await decode.close()
    await prefill.close()


async def test_pulls_share_one_connection_and_reconnect_when_it_drops(pair):
    prefill, decode, released = pair
    transfer = prefill.describe()
    for _ in range(3):
        result = await decode.pull(transfer, "p1", [1, 2], [5, 6])
        assert result.kind == "tcp" and result.blocks == 2
        await decode._request(transfer, {"op": "acquire", "pin": "p1", "blocks": [3]})
    assert torch.equal(decode.pool[:, :, [5, 6]], prefill.pool[:, :, [1, 2]])
    assert len(decode._links) == 1 and len(prefill._clients) == 1
    link = next(iter(decode._links.values()))
    for client in list(prefill._clients):  # the server side drops it
        client.close()
    await asyncio.sleep(0.05)
    await decode._request(transfer, {"op": "acquire", "pin": "p1", "blocks": [3]})
    assert next(iter(decode._links.values())) is not link
    await decode.release(transfer, "p1")
    assert released == ["p1"]
    with pytest.raises(TransferError, match="nothing pinned"):
        await decode._request(transfer, {"op": "acquire", "pin": "p1", "blocks": [3]})


async def test_an_exchange_cut_by_a_cancel_drops_its_connection(pair):
    prefill, decode, _ = pair
    transfer = prefill.describe()
    await decode._request(transfer, {"op": "acquire", "pin": "p1", "blocks": [1]})
    gate = asyncio.Event()

    async def slow_release(pin: str) -> bool:
        await gate.wait()
        return True

    prefill.on_release = slow_release
    task = asyncio.ensure_future(decode._request(transfer, {"op": "release", "pin": "p1"}))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert decode._links == {}  # its late answer must not be read as the next one's
    gate.set()
    answer = await decode._request(transfer, {"op": "acquire", "pin": "p1", "blocks": [1]})
    assert answer == {"ok": True}


async def test_close_cuts_connected_decode_agents(pair):
    prefill, decode, _ = pair
    await decode._request(prefill.describe(), {"op": "acquire", "pin": "p1", "blocks": [1]})
    await asyncio.wait_for(prefill.close(), 5)
    assert prefill._clients == set()


async def test_concurrent_first_pulls_end_up_on_one_connection(pair):
    prefill, decode, _ = pair
    transfer = prefill.describe()
    message = {"op": "acquire", "pin": "p1", "blocks": [1]}
    answers = await asyncio.gather(*(decode._request(transfer, message) for _ in range(5)))
    assert answers == [{"ok": True}] * 5
    await asyncio.sleep(0.05)  # the extra connections' server sides see them close
    assert len(decode._links) == 1 and len(prefill._clients) == 1


async def test_a_prefill_server_that_goes_quiet_fails_the_pull_after_the_timeout():
    """A hung (not dead) prefill worker: the pull gives up after `timeout`, so the decode
    side computes the prompt and frees its blocks instead of holding them for good."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader, writer):  # reads requests, never answers
        accepted.append(writer)
        await reader.read()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = torch.zeros(pool_shape(2, 8, 4, 2, 8))
    decode = KvTransferAgent(TransferConfig(kind="tcp", timeout=0.3), pool)
    transfer = {"address": f"127.0.0.1:{port}", "layout": layout(pool)}
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(TransferError, match="TimeoutError"):
            await decode.pull(transfer, "p1", [1, 2], [3, 4])
        assert asyncio.get_running_loop().time() - started < 3
        with pytest.raises(TimeoutError):
            await decode._checked(transfer, "p1", [1])
    finally:
        await decode.close()
        for writer in accepted:
            writer.close()
        server.close()


async def test_a_pin_that_runs_out_while_its_blocks_are_read_fails_the_tcp_pull():
    """The prefill side checks the pin before the first chunk and again after the last:
    gone by then (its timeout passed mid-read), the blocks may have been reused, so the
    decode side discards what it got."""
    pins = {"p1": [1, 2, 3]}
    checks: list[str] = []

    def lookup(pin: str):
        checks.append(pin)
        return pins.pop(pin, None)  # pinned at the first check only: expires mid-read

    src = torch.randn(pool_shape(2, 8, 4, 2, 8))
    prefill = KvTransferAgent(TransferConfig(kind="tcp"), src, pins=lookup)
    await prefill.serve()
    decode = KvTransferAgent(TransferConfig(kind="tcp"), torch.zeros(pool_shape(2, 8, 4, 2, 8)))
    try:
        with pytest.raises(TransferError, match="unpinned while read"):
            await decode.pull(prefill.describe(), "p1", [1, 2], [5, 6])
        assert checks == ["p1", "p1"]
    finally:
        await decode.close()
        await prefill.close()


async def test_pin_checks_and_releases_pending_together_share_one_round_trip():
    """What an IPC or NIXL pull asks the prefill server, coalesced: each pin answered and
    claimed on its own (one bad pin fails only its pull), each release done."""
    pins = {"p1": [1, 2], "p2": [3], "p3": [4, 5]}
    claimed: list[str] = []
    released: list[str] = []

    async def release(pin: str) -> bool:
        released.append(pin)
        return pins.pop(pin, None) is not None

    src = torch.randn(pool_shape(2, 8, 4, 2, 8))
    prefill = KvTransferAgent(
        TransferConfig(kind="tcp"), src, pins=pins.get, release=release, claim=claimed.append
    )
    await prefill.serve()
    decode = KvTransferAgent(TransferConfig(kind="tcp"), torch.zeros(pool_shape(2, 8, 4, 2, 8)))
    sent = record_requests(decode)
    transfer = {**prefill.describe(), "agent": "in another process"}  # releases by wire
    try:
        checks = [("p1", [1, 2]), ("p2", [3, 6]), ("gone", [1]), ("p3", [5])]
        answers = await asyncio.gather(
            *(decode._checked(transfer, pin, blocks) for pin, blocks in checks),
            return_exceptions=True,
        )
        # The first finds no exchange running and goes alone, the other three wait for it
        # and go together.
        assert sent[0] == {"op": "acquire", "pin": "p1", "blocks": [1, 2]}
        assert len(sent) == 2 and [p for p, _ in sent[1]["pins"]] == ["p2", "gone", "p3"]
        assert answers[0] == {"ok": True} and answers[3] == {"ok": True}
        assert isinstance(answers[1], TransferError) and "not pinned" in str(answers[1])
        assert isinstance(answers[2], TransferError) and "nothing pinned" in str(answers[2])
        assert claimed == ["p1", "p3"]  # only pins found and whole
        await asyncio.gather(*(decode.release(transfer, pin) for pin in ("p1", "p2", "p3")))
        assert sent[2:] == [
            {"op": "release", "pin": "p1"},
            {"op": "release", "pins": ["p2", "p3"]},
        ]
        assert released == ["p1", "p2", "p3"] and pins == {}
        # Alone, a check keeps the plain message.
        with pytest.raises(TransferError, match="nothing pinned"):
            await decode._checked(transfer, "p1", [1])
        assert sent[-1] == {"op": "acquire", "pin": "p1", "blocks": [1]}
    finally:
        await decode.close()
        await prefill.close()


async def test_uncoalesced_checks_go_one_round_trip_each(pair):
    prefill, _, _ = pair
    decode = KvTransferAgent(
        TransferConfig(kind="tcp", coalesce=False), torch.zeros(pool_shape(2, 8, 4, 2, 8))
    )
    sent = record_requests(decode)
    try:
        transfer = prefill.describe()
        await asyncio.gather(*(decode._checked(transfer, "p1", [b]) for b in (1, 2, 3)))
        assert [m.get("blocks") for m in sent] == [[1], [2], [3]]
    finally:
        await decode.close()


def record_requests(agent: KvTransferAgent) -> list[dict]:
    """Every message `agent` sends its peer from now on, in order (sent as before)."""
    sent: list[dict] = []
    request = agent._request

    async def recorded(transfer, message):
        sent.append(message)
        return await request(transfer, message)

    agent._request = recorded
    return sent
