"""Test doubles. NOT an engine for users: `ScriptedEngine` replays a fixed script so that
tests of the worker host, frontend and router can assert exact outputs. The simulated GPU
engine users run is the mocker (`stator.engines.mocker`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from stator.engines.base import Engine, EngineError
from stator.protocols import EngineOutput, EngineRequest, LoadReport, ModelCard, Usage


class ScriptedEngine(Engine):
    """Streams `script` (or, when None, echoes the prompt tokens), one token per output,
    sleeping `delay` seconds between tokens. Records aborts."""

    def __init__(
        self,
        name: str = "scripted",
        *,
        script: list[int] | None = None,
        delay: float = 0.0,
        source_path: str = "",
        eos_token_id: int | None = None,
        block_size: int = 16,
        structured_output: bool = True,
    ) -> None:
        self.name = name
        # Claims the capability so constrained requests reach it (it ignores them).
        self.structured_output = structured_output
        self.script = script
        self.delay = delay
        self.source_path = source_path
        self.eos_token_id = eos_token_id
        self.block_size = block_size
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self.requests: list[EngineRequest] = []

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if not request.token_ids:
            raise EngineError("empty prompt")
        self.requests.append(request)
        self.running.add(request.request_id)
        tokens = list(self.script if self.script is not None else request.token_ids)
        limit = request.stop.max_tokens
        try:
            for i, tok in enumerate(tokens):
                produced = i
                if limit is not None and produced >= limit:
                    yield EngineOutput(finish_reason="length", usage=self._usage(request, produced))
                    return
                if self.delay:
                    await asyncio.sleep(self.delay)
                produced = i + 1
                hidden = tok in request.stop.stop_token_ids_hidden and not request.stop.ignore_eos
                if hidden or tok in request.stop.stop_token_ids:
                    out = [] if hidden else [tok]
                    yield EngineOutput(
                        token_ids=out,
                        finish_reason="stop",
                        stop_token_id=tok,
                        usage=self._usage(request, produced),
                        cached_tokens=0 if i == 0 else None,
                    )
                    return
                last = i == len(tokens) - 1 or (limit is not None and produced >= limit)
                yield EngineOutput(
                    token_ids=[tok],
                    cached_tokens=0 if i == 0 else None,
                    finish_reason=("length" if limit is not None and produced >= limit else "stop")
                    if last
                    else None,
                    usage=self._usage(request, produced) if last else None,
                )
                if last:
                    return
        finally:
            self.running.discard(request.request_id)

    @staticmethod
    def _usage(request: EngineRequest, produced: int) -> Usage:
        return Usage(prompt_tokens=len(request.token_ids), completion_tokens=produced)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def model_card(self) -> ModelCard:
        return ModelCard(
            name=self.name,
            source_path=self.source_path,
            kv_block_size=self.block_size,
            total_kv_blocks=1024,
            eos_token_ids=[] if self.eos_token_id is None else [self.eos_token_id],
            engine="scripted",
            structured_output=self.structured_output,
        )

    def load(self) -> list[LoadReport]:
        return [LoadReport(worker_id=self.worker_id, num_running=len(self.running))]
