"""`Router`: one per model in a frontend. Picks a live worker for each request and
streams its outputs back."""

from __future__ import annotations

from collections.abc import AsyncIterator

from stator.protocols import EngineOutput, EngineRequest, ModelCard
from stator.router.config import RouterConfig
from stator.router.policies import make_policy
from stator.runtime import Client, NoInstances, Runtime


class Router:
    """`runtime` gives access to the event plane (KV events, load reports); `client`
    tracks the model's live workers; `card` gives the block size and KV capacity."""

    def __init__(
        self, runtime: Runtime, client: Client, card: ModelCard, config: RouterConfig
    ) -> None:
        self.runtime = runtime
        self.client = client
        self.card = card
        self.config = config
        self.policy = make_policy(config.router_mode)

    def workers(self) -> list[int]:
        return sorted(self.client.instance_ids())

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        workers = self.workers()
        if not workers:
            raise NoInstances(f"no live worker serves {request.model}")
        target = request.routing.target_worker_id if request.routing else None
        worker = target if target in workers else self.policy.select(workers)
        stream = self.client.generate(worker, request)
        try:
            async for output in stream:
                yield output
        finally:
            await stream.aclose()

    async def start(self) -> None:
        """Start background tasks (none for the load-blind policies)."""

    async def close(self) -> None:
        """Release background tasks (none for the load-blind policies)."""
