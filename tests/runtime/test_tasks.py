import asyncio

from stator.runtime.tasks import cancel_and_wait


async def test_cancels_running_tasks_skips_none_and_drops_their_errors():
    async def forever() -> None:
        await asyncio.Event().wait()

    async def fails_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("broke while stopping") from None

    running = asyncio.create_task(forever())
    failing = asyncio.create_task(fails_when_cancelled())
    finished = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await cancel_and_wait([running, None, failing, finished])
    assert running.cancelled()
    assert failing.done() and isinstance(failing.exception(), RuntimeError)
    assert finished.done() and not finished.cancelled()
