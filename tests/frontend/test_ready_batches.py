"""`ready_batches`: items ready together come out together, nothing waits for later ones,
and cancellation reaches the wrapped iterator."""

import asyncio

import pytest

from stator.frontend.openai.ready_batches import ready_batches


class Source:
    """Yields the groups one after another; waits on `gates[i]` before group i > 0."""

    def __init__(self, groups: list[list[int]]) -> None:
        self.groups = groups
        self.gates = [asyncio.Event() for _ in groups]
        self.cleanup: list[str] = []

    async def items(self):
        try:
            for i, group in enumerate(self.groups):
                if i:
                    await self.gates[i].wait()
                for item in group:
                    yield item
        except asyncio.CancelledError:
            self.cleanup.append("cancelled")
            raise
        finally:
            self.cleanup.append("closed")


async def test_ready_items_come_out_together_and_at_once():
    src = Source([[1, 2, 3], [4], [5, 6]])
    batches = ready_batches(src.items())
    assert await anext(batches) == [1, 2, 3]  # handed out before the gate opens
    src.gates[1].set()
    assert await anext(batches) == [4]
    src.gates[2].set()
    assert await anext(batches) == [5, 6]
    with pytest.raises(StopAsyncIteration):
        await anext(batches)
    assert src.cleanup == ["closed"]


async def test_an_iterator_that_never_waits_still_streams():
    async def numbers():
        for i in range(10):
            yield i

    assert [b async for b in ready_batches(numbers(), max_items=4)] == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]
    ]  # fmt: skip


async def test_first_items_caps_the_first_batches_then_grows_4x():
    async def numbers():
        for i in range(50):
            yield i

    sizes = [len(b) async for b in ready_batches(numbers(), max_items=32, first_items=2)]
    assert sizes == [2, 8, 32, 8]
    # A wait still ends a batch early.
    src = Source([[1], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    batches = ready_batches(src.items(), first_items=2)
    assert await anext(batches) == [1]
    src.gates[1].set()
    assert await anext(batches) == list(range(2, 10))  # 8: the limit grew after [1]
    assert await anext(batches) == [10, 11, 12]


async def test_errors_pass_through_after_the_ready_items():
    async def failing():
        yield 1
        await asyncio.sleep(0)
        raise ValueError("engine failed")

    batches = ready_batches(failing())
    assert await anext(batches) == [1]
    with pytest.raises(ValueError, match="engine failed"):
        await anext(batches)


async def test_cancelling_the_consumer_cancels_the_iterator():
    src = Source([[1], [2]])

    async def consume(out: list) -> None:
        async for batch in ready_batches(src.items()):
            out.append(batch)

    got: list = []
    task = asyncio.create_task(consume(got))
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert got == [[1]]
    assert src.cleanup == ["cancelled", "closed"]


async def test_closing_with_a_step_in_flight_cancels_that_step():
    src = Source([[1], [2]])
    batches = ready_batches(src.items())
    assert await anext(batches) == [1]  # the step for item 2 is now waiting on gate 1
    await batches.aclose()
    assert src.cleanup == ["cancelled", "closed"]
