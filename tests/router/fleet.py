"""An in-process fleet for router tests: worker runtimes (mem discovery, in-process
planes) serving a counting handler — NOT an engine: each output token is the previous
token + 1, so a stream continued elsewhere after a migration must go on with exactly the
next number. Each worker can publish KV events and load reports, serve the admin
`kv_state` op, and die mid-stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry

from stator.protocols import (
    AdminRequest,
    AdminResponse,
    BlockStored,
    EngineOutput,
    EngineRequest,
    KvEvent,
    KvEventBatch,
    LoadReport,
    ModelCard,
    Usage,
)
from stator.router import Router, RouterConfig
from stator.runtime import Runtime, RuntimeConfig

GENERATE = "stator.backend.generate"
ADMIN = "stator.backend.admin"
BS = 4


class FakeWorker:
    def __init__(self, runtime: Runtime, delay: float) -> None:
        self.runtime = runtime
        self.id = runtime.instance_id
        self.delay = delay
        self.requests: list[EngineRequest] = []
        self.state: list[KvEvent] = []  # what kv_state answers
        self.state_calls = 0
        # Tokens streamed (>= 1) before the worker "crashes" mid-stream.
        self.die_after: int | None = None
        self.event_id = 0
        self.release = asyncio.Event()
        self.release.set()

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.requests.append(request)
        await self.release.wait()
        last = request.token_ids[-1] if request.token_ids else 0  # 0 for embeddings
        n = request.stop.max_tokens or 4
        for i in range(n):
            if self.die_after is not None and i == self.die_after - 1:
                # Stop the request-plane server: this token still goes out, then the
                # caller sees StreamDisconnected.
                await self.runtime._server.stop()
            await asyncio.sleep(self.delay)
            final = i == n - 1
            yield EngineOutput(
                token_ids=[last + 1 + i],
                cached_tokens=0 if i == 0 else None,
                finish_reason="length" if final else None,
                usage=Usage(prompt_tokens=len(request.token_ids), completion_tokens=n)
                if final
                else None,
            )

    async def admin(self, request: AdminRequest) -> AsyncIterator[AdminResponse]:
        if request.op != "kv_state":
            yield AdminResponse(ok=False, error=f"unknown op {request.op}")
            return
        self.state_calls += 1
        yield AdminResponse(result=self.state)

    async def publish_stored(
        self, hashes: list[int], event_id: int | None = None, tier: str = "gpu"
    ) -> None:
        self.event_id = self.event_id + 1 if event_id is None else event_id
        event = KvEvent(
            worker_id=self.id,
            event_id=self.event_id,
            data=BlockStored(block_hashes=hashes, block_size=BS, tier=tier),
        )
        await self.runtime.publish("kv_events", KvEventBatch(events=[event]))

    async def report(self, **fields) -> None:
        await self.runtime.publish("load", LoadReport(worker_id=self.id, **fields))


async def start_worker(delay: float = 0.0, admin: bool = True) -> FakeWorker:
    runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
    worker = FakeWorker(runtime, delay)
    await runtime.serve(GENERATE, worker.generate, EngineRequest)
    if admin:
        await runtime.serve(ADMIN, worker.admin, AdminRequest)
    return worker


async def start_router(
    n_workers: int, config: RouterConfig, **card_fields
) -> tuple[Router, list[FakeWorker]]:
    workers = [await start_worker() for _ in range(n_workers)]
    frontend = await Runtime.create(RuntimeConfig(discovery="mem"))
    client = await frontend.client(GENERATE, EngineOutput)
    await client.wait_for_instances(n_workers, timeout=5)
    card = ModelCard(name="m", source_path="", kv_block_size=BS, total_kv_blocks=100, **card_fields)
    router = Router(frontend, client, card, config, registry=CollectorRegistry())
    await router.start()
    return router, workers


def request(rid: str, tokens: list[int], max_tokens: int = 4, **fields) -> EngineRequest:
    from stator.protocols import StopConditions

    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=tokens,
        stop=StopConditions(max_tokens=max_tokens),
        **fields,
    )


async def collect(router: Router, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in router.generate(req)]


async def until(predicate, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
