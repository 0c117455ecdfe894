"""The wire types: what crosses the request plane and the event plane.

Every type here is a `msgspec.Struct`, encoded as msgpack on the wire (see `encode` /
`decoder`). This is the one typed idiom below the HTTP edge: a field added to a wire type
is added here and nowhere else. Nothing in this module imports anything of ours.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# -- sampling and stopping ---------------------------------------------------------------


class GuidedDecoding(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A structured-output constraint; exactly one of the fields is set."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    whitespace_pattern: str | None = None


class SamplingOptions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick the next token. None means "the engine's default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    # Number of top alternatives to return per generated token; 0 = only the chosen
    # token's logprob; None = no logprobs at all.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    guided_decoding: GuidedDecoding | None = None


class StopConditions(msgspec.Struct, kw_only=True, omit_defaults=True):
    """When to stop. Stop *strings* are enforced by the frontend, never by the engine."""

    max_tokens: int | None = None
    min_tokens: int = 0
    # Visible stop tokens: the token is emitted, then generation stops.
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    # Hidden stop tokens (EOS): generation stops and the token is not shown to the user.
    stop_token_ids_hidden: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False


class DisaggParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a decode worker needs to pull a prompt's KV from the prefill worker.

    A prefill worker puts it on its final output; the router copies it onto the decode
    request (see `stator.router.disagg_requests`). `remote_block_ids` are the prefill
    side's block ids holding the prompt, in order (the last one may be partly filled);
    they stay pinned there until the decode side releases them or `expires_in` passes.
    `transfer` says how to reach them: the transport's kind and its address or handles.
    """

    prefill_worker_id: int | None = None
    remote_block_ids: list[int] = msgspec.field(default_factory=list)
    remote_address: str | None = None
    num_prompt_tokens: int = 0
    transfer: dict[str, Any] = msgspec.field(default_factory=dict)
    # The prefill worker's id for the pinned blocks (what a release names).
    prefill_request_id: str | None = None
    block_size: int = 0
    # Seconds after the prefill output the blocks stay pinned without a release.
    expires_in: float = 0.0


class RoutingHints(msgspec.Struct, kw_only=True, omit_defaults=True):
    target_worker_id: int | None = None
    prefill_worker_id: int | None = None
    dp_rank: int | None = None
    # Per-request override of the router's prefill weight `w` in the cost function.
    overlap_weight: float | None = None
    # The request's latency targets in ms (header or `nvext`); the global router picks a
    # pool from them.
    ttft_target_ms: float | None = None
    itl_target_ms: float | None = None


class EngineRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    request_id: str
    model: str
    token_ids: list[int] = msgspec.field(default_factory=list)
    # Raw bytes of a float tensor [num_tokens, hidden] (see `prompt_embeds_shape`), used
    # instead of token_ids by engines that accept embeddings.
    prompt_embeds: bytes | None = None
    prompt_embeds_shape: list[int] | None = None
    prompt_embeds_dtype: str | None = None
    sampling: SamplingOptions = msgspec.field(default_factory=SamplingOptions)
    stop: StopConditions = msgspec.field(default_factory=StopConditions)
    lora_name: str | None = None
    priority: int = 0
    routing: RoutingHints | None = None
    disagg: DisaggParams | None = None
    # Free-form tags that travel with the request (tracing ids, client hints).
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


# -- outputs -----------------------------------------------------------------------------

FinishReason = Literal["stop", "length", "abort", "error"]


class TopLogprob(msgspec.Struct, array_like=True):
    token_id: int
    logprob: float


class TokenLogprob(msgspec.Struct, kw_only=True, omit_defaults=True):
    token_id: int
    logprob: float
    top: list[TopLogprob] = msgspec.field(default_factory=list)


class Usage(msgspec.Struct, kw_only=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


# `EngineOutput.error_code` of a request the engine refused (an HTTP 400 at the edge).
INVALID_REQUEST = "invalid_request"


class EngineOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One delta of a generation stream. The last one carries `finish_reason`."""

    token_ids: list[int] = msgspec.field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    # Per prompt position (first entry None), only on the first output when requested.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: FinishReason | None = None
    # The stop token that ended generation (visible or hidden), when one did.
    stop_token_id: int | None = None
    error: str | None = None
    # With finish_reason "error": why, for the HTTP status. "invalid_request": the engine
    # refused the request (its fault: 400); anything else, or none: the engine failed (500).
    error_code: str | None = None
    # Prompt tokens served from the prefix cache; set on the first output.
    cached_tokens: int | None = None
    disagg: DisaggParams | None = None
    usage: Usage | None = None


# -- model card --------------------------------------------------------------------------

Role = Literal["aggregated", "prefill", "decode"]


class LoraInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    path: str
    base_model: str | None = None


class ModelCard(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a worker tells the fleet about the model it serves.

    The frontend builds its pipeline (tokenizer, chat template, parsers) from this; the
    router takes its block size from here, never from its own flags.
    """

    name: str
    source_path: str
    # Tokenizer and template files the frontend should read. When the frontend cannot see
    # `source_path` (another host), `files` carries their contents inline.
    tokenizer_files: list[str] = msgspec.field(default_factory=list)
    files: dict[str, bytes] = msgspec.field(default_factory=dict)
    chat_template: str | None = None
    context_length: int = 4096
    kv_block_size: int = 16
    total_kv_blocks: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    role: Role = "aggregated"
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    loras: list[LoraInfo] = msgspec.field(default_factory=list)
    # This card describes a LoRA adapter served under its own name on top of `base_model`.
    base_model: str | None = None
    # How the engine wants input: token ids (the frontend tokenizes) or text.
    input: Literal["tokens", "text"] = "tokens"
    eos_token_ids: list[int] = msgspec.field(default_factory=list)
    # Width of the prompt embeddings the engine accepts in place of token ids
    # (`EngineRequest.prompt_embeds`); 0 = it takes none.
    prompt_embeds_hidden_size: int = 0
    # The engine can dump its KV cache as events (admin op `kv_state`), so a router that
    # missed some of its events can resync. vLLM cannot: its routers bridge such gaps.
    kv_state_available: bool = True
    migration_limit: int = 0
    data_parallel_size: int = 1
    engine: str = ""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


# -- KV events ---------------------------------------------------------------------------


class BlockStored(msgspec.Struct, tag="stored", kw_only=True, omit_defaults=True):
    block_hashes: list[int]
    parent_hash: int | None = None
    # The tokens of the stored blocks, block after block, so a router can index engines
    # whose block hashes differ from ours.
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 16
    lora_name: str | None = None
    # Where the blocks now are: "gpu" (the engine's own cache), or a lower tier the engine
    # can load them back from: "host" (pinned memory), "disk". A block may be in several.
    tier: str = "gpu"


class BlockRemoved(msgspec.Struct, tag="removed", kw_only=True, omit_defaults=True):
    block_hashes: list[int]
    tier: str = "gpu"  # the tier the blocks left (they may still be in another)


class AllCleared(msgspec.Struct, tag="cleared", kw_only=True):
    """Every block of the worker is gone, in every tier."""


KvEventData = BlockStored | BlockRemoved | AllCleared


class KvEvent(msgspec.Struct, kw_only=True):
    """One KV cache change. `event_id` increases by one per event per (worker, dp_rank),
    so a consumer that sees a jump knows it missed events and must resync."""

    worker_id: int
    event_id: int
    data: KvEventData
    dp_rank: int = 0


class KvEventBatch(msgspec.Struct, kw_only=True):
    events: list[KvEvent]


class LoadReport(msgspec.Struct, kw_only=True, omit_defaults=True):
    worker_id: int
    dp_rank: int = 0
    active_kv_blocks: int = 0
    total_kv_blocks: int = 0
    num_waiting: int = 0
    num_running: int = 0
    queued_prefill_tokens: int = 0


# -- admin and health --------------------------------------------------------------------


class AdminRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A request to a worker's admin endpoint: `clear_kv`, `load_lora`, `unload_lora`,
    `list_loras`, `sleep`, `wake`, `kv_state` (full KV state dump for router resync)."""

    op: str
    args: dict[str, Any] = msgspec.field(default_factory=dict)


class AdminResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    ok: bool = True
    error: str | None = None
    result: Any = None


# -- encoding ----------------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()


def encode(obj: Any) -> bytes:
    """Encode any wire type (or plain msgpack-able value) to msgpack bytes."""
    return _encoder.encode(obj)


_decoders: dict[Any, msgspec.msgpack.Decoder] = {}


def decoder(kind: Any) -> msgspec.msgpack.Decoder:
    """A cached msgpack decoder for `kind` (a Struct type, a union, or `Any`)."""
    dec = _decoders.get(kind)
    if dec is None:
        dec = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    return dec


def decode(data: bytes, kind: Any) -> Any:
    return decoder(kind).decode(data)


__all__ = [
    "AdminRequest",
    "AdminResponse",
    "AllCleared",
    "BlockRemoved",
    "BlockStored",
    "DisaggParams",
    "EngineOutput",
    "EngineRequest",
    "FinishReason",
    "GuidedDecoding",
    "KvEvent",
    "KvEventBatch",
    "KvEventData",
    "LoadReport",
    "LoraInfo",
    "ModelCard",
    "Role",
    "RoutingHints",
    "SamplingOptions",
    "StopConditions",
    "TokenLogprob",
    "TopLogprob",
    "Usage",
    "decode",
    "decoder",
    "encode",
]
