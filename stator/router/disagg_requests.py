"""The disaggregated request protocol, as pure functions on the wire types.

1. The router sends the prefill worker `prefill_request(request)`: the same prompt and
   sampling with max_tokens=1 and an empty `DisaggParams` (the mark that asks the worker
   to keep the prompt's KV for a decode worker).
2. The prefill worker answers with one output: the first token (its logprobs, the prompt
   tokens it found cached) and, when it finished with "length", `DisaggParams` saying where
   the prompt's KV is pinned. Finishing with "stop" (the first token ends generation)
   pins nothing: the request is complete.
3. The router sends a decode worker `decode_request(request, first, params)`: the request
   resumed after the first token (as a migration resumes it), carrying the params. The
   decode worker pulls the prompt blocks it does not already cache, computes the first
   token's KV and streams the rest.
4. The client sees one stream: `first_output` then `as_part_of_original` of each decode
   output (prompt and completion counts, cached tokens, as if one worker served it).
"""

from __future__ import annotations

import msgspec

from stator.protocols import DisaggParams, EngineOutput, EngineRequest, Usage
from stator.router.migration import continuation


def wants_remote_prefill(request: EngineRequest) -> str | None:
    """Why this request cannot be split (None: it can). Prompt logprobs and embeddings
    stay on one worker; so does a request of one token (the prefill is the request)."""
    if request.sampling.prompt_logprobs is not None:
        return "prompt_logprobs"
    if request.prompt_embeds is not None:
        return "prompt_embeds"
    if request.stop.max_tokens is not None and request.stop.max_tokens <= 1:
        return "one_token"
    if request.sampling.guided_decoding is not None:
        # The grammar's state after the first token lives in the prefill engine.
        return "guided_decoding"
    if request.disagg is not None:
        return "already_split"
    return None


def prefill_request(request: EngineRequest) -> EngineRequest:
    stop = msgspec.structs.replace(request.stop, max_tokens=1)
    routing = request.routing
    if routing is not None:
        # A named worker is a decode worker; `prefill_worker_id` names the prefill one.
        routing = msgspec.structs.replace(
            routing, target_worker_id=routing.prefill_worker_id, prefill_worker_id=None
        )
    return msgspec.structs.replace(request, stop=stop, routing=routing, disagg=DisaggParams())


def is_handoff(output: EngineOutput) -> bool:
    """The prefill worker's final output hands the request over to a decode worker."""
    return (
        output.finish_reason == "length"
        and output.disagg is not None
        and output.disagg.prefill_worker_id is not None
    )


def first_output(output: EngineOutput) -> EngineOutput:
    """The prefill worker's output as the client's first delta of a continuing stream."""
    return msgspec.structs.replace(output, finish_reason=None, disagg=None, usage=None)


def decode_request(
    request: EngineRequest, first: EngineOutput, params: DisaggParams
) -> EngineRequest:
    resumed = continuation(request, list(first.token_ids))
    routing = resumed.routing
    if routing is not None and routing.prefill_worker_id is not None:
        routing = msgspec.structs.replace(routing, prefill_worker_id=None)
    return msgspec.structs.replace(resumed, disagg=params, routing=routing)


def as_part_of_original(
    output: EngineOutput, request: EngineRequest, first: EngineOutput
) -> EngineOutput:
    """A decode output told as the original request's: its first output's cached count
    was already sent (the prefill's), its usage counts the prefill's token."""
    changes: dict = {}
    if output.cached_tokens is not None:
        changes["cached_tokens"] = None
    if output.prompt_logprobs is not None:
        changes["prompt_logprobs"] = None
    if output.disagg is not None:
        changes["disagg"] = None
    if output.usage is not None:
        changes["usage"] = Usage(
            prompt_tokens=len(request.token_ids),
            completion_tokens=len(first.token_ids) + output.usage.completion_tokens,
            cached_tokens=first.cached_tokens or 0,
        )
    return msgspec.structs.replace(output, **changes) if changes else output


def finished_at_prefill(output: EngineOutput, request: EngineRequest) -> EngineOutput:
    """The prefill worker's output when it ended the request (a stop token, or an error)."""
    usage = output.usage or Usage(
        prompt_tokens=len(request.token_ids),
        completion_tokens=len(output.token_ids),
        cached_tokens=output.cached_tokens or 0,
    )
    return msgspec.structs.replace(output, disagg=None, usage=usage)


__all__ = [
    "as_part_of_original",
    "decode_request",
    "finished_at_prefill",
    "first_output",
    "is_handoff",
    "prefill_request",
    "wants_remote_prefill",
]
