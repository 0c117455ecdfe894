"""`Batcher` (the decode agent's coalesced copies, pin checks and releases), with a fake
launch: items pending together go in one batch, in order; each item's result or error is
its own; a cancelled item leaves a batch not yet started, and waits for one that has."""

from __future__ import annotations

import asyncio

import pytest

from stator.kv.transfer.batching import Batcher


class FakeCopies:
    """`start` records the batch (as a launch would enqueue it), `finish` waits for the
    test to end it (as the device would)."""

    def __init__(self) -> None:
        self.batches: list[list] = []
        self.ends: list[asyncio.Future] = []
        self.fail_start: Exception | None = None
        self.ended: list[int] = []  # batch numbers, in the order they ended

    def start(self, items: list):
        if self.fail_start is not None:
            raise self.fail_start
        self.batches.append(list(items))
        end = asyncio.get_running_loop().create_future()
        self.ends.append(end)
        return len(self.batches) - 1, items, end

    async def finish(self, started):
        number, items, end = started
        outcome = await end
        self.ended.append(number)
        if isinstance(outcome, Exception):
            raise outcome
        return [outcome.get(item, f"copied {item}") for item in items]

    def end(self, number: int, outcome=None) -> None:
        self.ends[number].set_result(outcome if outcome is not None else {})


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_items_pending_together_go_in_one_batch_in_order_and_the_next_is_staged():
    fake = FakeCopies()
    batcher = Batcher(fake.start, fake.finish, depth=2)
    first = asyncio.ensure_future(batcher.submit("a"))
    await turns(1)
    assert fake.batches == [["a"]]  # nothing running: it starts at once, alone
    second = [asyncio.ensure_future(batcher.submit(x)) for x in "bcd"]
    await turns()
    # One batch in flight, depth 2: the three pending together are staged behind it.
    assert fake.batches == [["a"], ["b", "c", "d"]]
    later = [asyncio.ensure_future(batcher.submit(x)) for x in "ef"]
    await turns()
    assert len(fake.batches) == 2  # two in flight: e and f wait for one to end
    fake.end(0)
    await turns()
    assert fake.batches[2] == ["e", "f"]
    fake.end(1)
    fake.end(2)
    results = await asyncio.gather(first, *second, *later)
    assert [r for r, _ in results] == [f"copied {x}" for x in "abcdef"]
    assert [batch.size for _, batch in results] == [1, 3, 3, 3, 2, 2]
    assert (batcher.batches, batcher.items) == (3, 6)


async def busy(fake: FakeCopies, batcher: Batcher) -> asyncio.Future:
    """A first item that keeps the batcher busy (batch 0), so the next ones wait."""
    first = asyncio.ensure_future(batcher.submit("first"))
    await turns()
    assert fake.batches == [["first"]]
    return first


async def second_batch(items: str):
    """A batcher whose first item went alone (batch 0, now ended) while `items` waited:
    they go together as batch 1, launched and not yet ended."""
    fake = FakeCopies()
    batcher = Batcher(fake.start, fake.finish)
    first = await busy(fake, batcher)
    tasks = [asyncio.ensure_future(batcher.submit(x)) for x in items]
    await turns()
    fake.end(0)
    await turns()
    return fake, batcher, first, tasks


async def test_each_item_of_a_batch_gets_its_own_error():
    fake, _, first, tasks = await second_batch("abc")
    assert fake.batches[1] == ["a", "b", "c"] and (await first)[0] == "copied first"
    fake.end(1, {"b": ValueError("b's pin is gone")})
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0][0] == "copied a" and results[2][0] == "copied c"
    assert isinstance(results[1], ValueError) and "b's pin" in str(results[1])


async def test_a_failed_batch_fails_every_member_and_the_next_batch_still_runs():
    fake, batcher, first, tasks = await second_batch("ab")
    fake.end(1, RuntimeError("device fault"))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results) and len(fake.batches) == 2
    assert (await first)[0] == "copied first"
    # A launch that cannot start fails its members at once, and leaves the batcher usable.
    fake.fail_start = OSError("no launch")
    with pytest.raises(OSError, match="no launch"):
        await batcher.submit("c")
    fake.fail_start = None
    task = asyncio.ensure_future(batcher.submit("d"))
    await turns()
    fake.end(2)
    assert (await task)[0] == "copied d"


async def test_an_item_cancelled_before_its_batch_starts_leaves_it():
    fake = FakeCopies()
    batcher = Batcher(fake.start, fake.finish, depth=1)
    running = asyncio.ensure_future(batcher.submit("a"))
    await turns()
    waiting = {x: asyncio.ensure_future(batcher.submit(x)) for x in "bcd"}
    await turns()
    waiting["c"].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting["c"]
    fake.end(0)
    await turns()
    assert fake.batches == [["a"], ["b", "d"]]  # c's blocks are never copied
    fake.end(1)
    assert (await waiting["b"])[0] == "copied b" and (await waiting["d"])[0] == "copied d"
    assert (await running)[0] == "copied a"


async def test_an_item_cancelled_after_its_batch_started_raises_only_once_it_ended():
    """Its copy still writes its blocks and reads the prefill pool: the caller (which
    releases the pin next) must not go on before the copy is over; the batch's other
    items are not disturbed."""
    fake = FakeCopies()
    batcher = Batcher(fake.start, fake.finish, depth=2)
    first = await busy(fake, batcher)
    tasks = {x: asyncio.ensure_future(batcher.submit(x)) for x in "ab"}
    await turns()
    assert fake.batches[1] == ["a", "b"]
    tasks["a"].cancel()
    await turns(10)
    assert not tasks["a"].done()  # cancelled, but its copy runs on
    tasks["a"].cancel()  # a second cancel does not cut the wait short either
    await turns(10)
    assert not tasks["a"].done()
    fake.end(1)
    with pytest.raises(asyncio.CancelledError):
        await tasks["a"]
    assert fake.ended == [1]
    assert (await tasks["b"])[0] == "copied b"
    fake.end(0)
    assert (await first)[0] == "copied first"


async def test_off_every_item_starts_alone_at_once():
    fake = FakeCopies()
    batcher = Batcher(fake.start, fake.finish, enabled=False)
    tasks = [asyncio.ensure_future(batcher.submit(x)) for x in "abc"]
    await turns()
    assert fake.batches == [["a"], ["b"], ["c"]]
    for i in range(3):
        fake.end(i)
    assert [r[1].size for r in await asyncio.gather(*tasks)] == [1, 1, 1]
