"""The checks a native engine makes before taking a request, wherever its core runs (in
this process, `NativeEngine`, or in its own, `CoreProcessEngine`): asleep engines and
duplicate ids are refused, and a request to an adapter's own model card names the adapter."""

from __future__ import annotations

from collections.abc import Container

import msgspec

from stator.engines.base import EngineError
from stator.protocols import EngineRequest


def admit(
    request: EngineRequest,
    sleep_level: int | None,
    adapters: Container[str],
    running: Container[str],
) -> EngineRequest:
    if sleep_level is not None:
        raise EngineError(f"the engine is asleep (sleep level {sleep_level}): wake it up first")
    if request.request_id in running:
        raise EngineError(f"request id {request.request_id!r} is already running")
    if not request.lora_name and request.model in adapters:
        # A request to an adapter's own model card names the adapter as its model.
        return msgspec.structs.replace(request, lora_name=request.model)
    return request
