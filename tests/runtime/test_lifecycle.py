import asyncio
import os
import signal

from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.lifecycle import EXIT_FATAL, EXIT_OK, Lifecycle


async def serving_runtime(grace: float = 5.0):
    runtime = await Runtime.create(RuntimeConfig(discovery="mem", graceful_shutdown_timeout=grace))
    started = asyncio.Event()

    async def handler(n):
        started.set()
        for i in range(n):
            await asyncio.sleep(0.02)
            yield i

    await runtime.serve("stator.backend.generate", handler)
    client = await runtime.client("stator.backend.generate")
    await client.wait_for_instances(1, timeout=5)
    return runtime, client, started


async def test_sigterm_drains_then_exits_zero():
    runtime, client, started = await serving_runtime()
    lifecycle = Lifecycle(runtime)
    stopped = []
    lifecycle.on_stop(lambda: asyncio.sleep(0, stopped.append(True)))
    stream = asyncio.create_task(_collect(client.generate(runtime.instance_id, 10)))

    async def send_sigterm():
        await started.wait()
        await asyncio.sleep(0.1)  # let lifecycle.run install its handlers
        os.kill(os.getpid(), signal.SIGTERM)

    signaller = asyncio.create_task(send_sigterm())
    assert await asyncio.wait_for(lifecycle.run(asyncio.Event().wait()), 10) == EXIT_OK
    await signaller
    assert await stream == list(range(10))  # the in-flight stream finished
    assert stopped == [True]
    assert client.instance_ids() == []


async def test_second_stop_request_cuts_the_grace_period():
    runtime, client, started = await serving_runtime(grace=60)
    lifecycle = Lifecycle(runtime)
    stream = asyncio.create_task(_collect(client.generate(runtime.instance_id, 100000)))

    async def stop_twice():
        await started.wait()
        lifecycle.request_stop("first")
        await asyncio.sleep(0.1)
        lifecycle.request_stop("second")

    stopper = asyncio.create_task(stop_twice())
    assert await asyncio.wait_for(lifecycle.run(asyncio.Event().wait()), 10) == EXIT_OK
    await stopper
    stream.cancel()


async def test_fatal_unregisters_and_exits_nonzero():
    runtime, client, _ = await serving_runtime()
    lifecycle = Lifecycle(runtime)
    asyncio.get_running_loop().call_later(0.05, lifecycle.fatal, "engine died")
    assert await asyncio.wait_for(lifecycle.run(asyncio.Event().wait()), 10) == EXIT_FATAL
    assert client.instance_ids() == []


async def test_a_crashing_serving_task_exits_nonzero():
    runtime, _, _ = await serving_runtime()

    async def crash():
        raise RuntimeError("boom")

    assert await asyncio.wait_for(Lifecycle(runtime).run(crash()), 10) == EXIT_FATAL


async def _collect(stream):
    return [x async for x in stream]
