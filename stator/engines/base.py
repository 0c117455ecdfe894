"""`Engine`: the one interface every backend (native, mocker, vllm) implements.

The worker host (`stator.worker`) serves an engine's `generate` on the request plane,
publishes its model card, KV events and load reports, and health-checks it. An engine never
touches the runtime itself.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Any

from stator.kv.transfer import TransferConfig
from stator.protocols import (
    EngineOutput,
    EngineRequest,
    KvEvent,
    LoadReport,
    LoraInfo,
    ModelCard,
    Role,
)


class EngineError(Exception):
    """A request the engine cannot serve (bad input); reported to the caller."""


class EngineDead(Exception):
    """The engine failed for good; the worker must unregister and exit non-zero."""


class Unsupported(EngineError):
    """The engine does not offer this operation (e.g. sleep on a CPU build)."""


class Engine(abc.ABC):
    """An LLM engine behind stator's worker host.

    `generate` streams deltas for one request; its last `EngineOutput` has a finish_reason.
    When the caller stops iterating (client went away), the engine must free the request's
    resources: the worker host calls `abort(request_id)` in that case as well.
    """

    #: Set by the worker host before `start()`: the instance id events are stamped with.
    worker_id: int = 0
    #: Set by the worker host before `start()`: which half of disaggregated serving this
    #: engine does. A prefill engine computes the prompt, answers with one token and
    #: `DisaggParams` on its final output, and keeps the prompt's KV for the decode side;
    #: a decode engine takes requests whose `disagg` says where to pull that KV from.
    role: Role = "aggregated"
    #: Set by the worker host before `start()`: how KV moves to or from the other role.
    kv_transfer: TransferConfig = TransferConfig()

    async def start(self) -> None:
        """Load weights, allocate the KV cache, start background loops."""

    @abc.abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks at once. Unknown ids are ignored."""

    @abc.abstractmethod
    def model_card(self) -> ModelCard:
        """The card to publish (valid after `start`)."""

    @abc.abstractmethod
    def load(self) -> list[LoadReport]:
        """Current load, one report per data-parallel rank."""

    async def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        """Batches of KV events as the cache changes. Engines without events yield none."""
        return
        yield  # pragma: no cover - makes this an async generator

    def kv_state(self) -> list[KvEvent]:
        """The whole cache as `BlockStored` events (for a router that missed events)."""
        return []

    async def health_check(self) -> None:
        """Raise if the engine is unhealthy. The worker host also sends a one-token request
        periodically; this hook adds engine-specific checks (default: none)."""

    async def release_kv(
        self, prefill_request_id: str, unless_claimed: bool = False, later: bool = False
    ) -> bool:
        """Prefill role: unpin the KV kept for a decode side that will not pull it (the
        client went away). False when nothing was pinned under that id, or with
        `unless_claimed` when a decode side has begun reading it (it releases the pin
        itself once its copy is over). `later`: if nothing is pinned under that id yet
        (the prefill still runs), a pin made under it within the pin timeout goes at
        once."""
        return False

    async def clear_kv(self) -> None:
        raise Unsupported(f"{type(self).__name__} cannot clear its KV cache")

    async def load_lora(self, name: str, path: str) -> LoraInfo:
        raise Unsupported(f"{type(self).__name__} does not support LoRA adapters")

    async def unload_lora(self, name: str) -> None:
        raise Unsupported(f"{type(self).__name__} does not support LoRA adapters")

    def list_loras(self) -> list[LoraInfo]:
        return []

    async def sleep(self, level: int = 1) -> None:
        raise Unsupported(f"{type(self).__name__} does not support sleep mode")

    async def wake(self, tags: list[str] | None = None) -> None:
        raise Unsupported(f"{type(self).__name__} does not support sleep mode")

    def is_sleeping(self) -> bool:
        """Whether `sleep` left the engine asleep (a partial `wake` keeps it so)."""
        return False

    async def shutdown(self) -> None:
        """Stop background loops and free resources."""

    def metrics(self) -> dict[str, Any]:
        """Engine-specific gauges for the worker's /metrics (name -> value)."""
        return {}
