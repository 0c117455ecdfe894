"""The messages between the worker host and an engine core in its own process.

Both directions carry *batches*: the host sends every request added or aborted in one
event-loop turn as one `CoreInputs` frame, and the core sends one `StepOutputs` frame per
step with every request's new tokens, the step's KV events and the load after it. At 256
running requests that is one msgpack frame per step each way, not 256 messages, so the
boundary costs the core ~0.1 ms a step (the encode), not a share of its loop.

Anything else the host asks of the core (LoRA, sleep, clearing the cache, its KV state)
is a `Call` by name, answered by a `CallResult` between two steps. Prefill/decode roles
and tensor parallelism need nothing more here: the ranks of a TP group are the core
process's own children (`tp_runner`), and a role's KV transfer is a `Call`-sized change.
"""

from __future__ import annotations

from typing import Any

import msgspec

from stator.engines.native.native_card import CoreInfo
from stator.protocols import EngineOutput, EngineRequest, KvEvent, LoadReport


class AddRequest(msgspec.Struct, tag="add"):
    request: EngineRequest


class AbortRequest(msgspec.Struct, tag="abort"):
    request_id: str


class Call(msgspec.Struct, tag="call"):
    call_id: int
    method: str
    args: list[Any] = msgspec.field(default_factory=list)


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


CoreInput = AddRequest | AbortRequest | Call | Shutdown


class CoreInputs(msgspec.Struct, tag="inputs"):
    """Host -> core: what happened since the last frame, in order."""

    items: list[CoreInput]


class StepOutputs(msgspec.Struct, tag="step", omit_defaults=True):
    """Core -> host, once per step (or after inputs that changed the load)."""

    outputs: list[tuple[str, EngineOutput]] = msgspec.field(default_factory=list)
    kv_events: list[KvEvent] = msgspec.field(default_factory=list)
    load: LoadReport | None = None
    # The core's gauges (`core_metrics`), at most about once a second.
    metrics: dict[str, Any] | None = None


class CallResult(msgspec.Struct, tag="result", omit_defaults=True):
    call_id: int
    value: Any = None
    # Set when the call raised: "engine" (the caller's input: EngineError), "unsupported",
    # or "internal".
    error: str | None = None
    error_kind: str | None = None


class CoreReady(msgspec.Struct, tag="ready"):
    info: CoreInfo
    loras: list[tuple[str, str]]  # adapters loaded at start: (name, path)


class CoreFailed(msgspec.Struct, tag="failed"):
    """The core cannot go on (it failed to start, or a step raised); it exits next."""

    reason: str


CoreOutput = StepOutputs | CallResult | CoreReady | CoreFailed

ENCODER = msgspec.msgpack.Encoder()
INPUT_DECODER = msgspec.msgpack.Decoder(CoreInputs)
OUTPUT_DECODER = msgspec.msgpack.Decoder(CoreOutput)
