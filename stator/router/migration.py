"""Migration: a stream whose worker died or shut down is continued on another worker.

The continuation is the same request with the tokens generated so far appended to the
prompt and the token budget reduced by as many, so the caller sees one stream with no
token lost or repeated. Only failures of the worker (`stator.runtime.errors.Migratable`)
are migrated, at most `limit` times per request. Guided decoding is not migrated: its
grammar state lives in the dead engine. Nor is a prompt given as embeddings: the
continuation's prompt would mix embedding rows and token ids, which no engine takes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import msgspec

from stator.protocols import EngineOutput, EngineRequest, Usage
from stator.runtime.errors import ConnectionRefused, Migratable

log = logging.getLogger(__name__)

# Workers whose connection was refused that one request skips before it gives up.
MAX_REFUSED = 8

# Opens one attempt: streams `request` from a worker it picks, never one in `tried`, and
# adds the worker it picked to `tried` before streaming.
Attempt = Callable[[EngineRequest, set[int]], AsyncIterator[EngineOutput]]


def continuation(request: EngineRequest, generated: list[int]) -> EngineRequest:
    """`request` resumed after `generated` tokens."""
    stop = request.stop
    new_stop = msgspec.structs.replace(
        stop,
        max_tokens=None if stop.max_tokens is None else stop.max_tokens - len(generated),
        min_tokens=max(0, stop.min_tokens - len(generated)),
    )
    sampling = msgspec.structs.replace(request.sampling, prompt_logprobs=None)
    routing = request.routing
    if routing is not None and routing.target_worker_id is not None:
        # The named worker is the one that failed.
        routing = msgspec.structs.replace(routing, target_worker_id=None)
    disagg = request.disagg
    if disagg is not None and disagg.prefill_worker_id is not None:
        # A decode request's KV was pulled (and released) by the worker that failed:
        # the continuation computes its prompt where it lands.
        disagg = None
    return msgspec.structs.replace(
        request,
        token_ids=list(request.token_ids) + generated,
        stop=new_stop,
        sampling=sampling,
        routing=routing,
        disagg=disagg,
    )


async def migrating(
    request: EngineRequest,
    attempt: Attempt,
    limit: int,
    on_migrate: Callable[[bool], None] = lambda ongoing: None,
) -> AsyncIterator[EngineOutput]:
    """Stream `request`, migrating it up to `limit` times. `on_migrate(ongoing)` is called
    per migration (`ongoing`: tokens had already been streamed)."""
    generated: list[int] = []
    tried: set[int] = set()
    current = request
    migrations = 0
    refused = 0
    resumed_after = 0  # tokens generated before the current attempt
    migratable = request.sampling.guided_decoding is None and request.prompt_embeds is None
    while True:
        stream = attempt(current, tried)
        try:
            async for output in stream:
                if migrations:
                    output = _as_part_of_original(output, request, resumed_after)
                generated.extend(output.token_ids)
                yield output
            return
        except ConnectionRefused:
            # Nothing reached the worker (its address refused the connection: it is gone),
            # so another may take the request whatever the migration limit. A request
            # pinned to that worker fails.
            refused += 1
            pinned = current.routing is not None and current.routing.target_worker_id
            if refused > MAX_REFUSED or pinned or (generated and not migratable):
                raise
            if not generated:
                log.info(
                    "request %s: a worker refused the connection; retrying", request.request_id
                )
                continue
            if migrations >= limit:
                raise
            migrations += 1
            on_migrate(True)
        except Migratable as exc:
            if migrations >= limit or not migratable:
                raise
            migrations += 1
            log.warning(
                "request %s: worker failed after %d tokens (%s); migrating (%d of %d)",
                request.request_id,
                len(generated),
                exc,
                migrations,
                limit,
            )
            on_migrate(bool(generated))
        finally:
            await stream.aclose()
        max_tokens = request.stop.max_tokens
        if max_tokens is not None and len(generated) >= max_tokens:
            # Every token was out; only the final chunk was lost.
            yield EngineOutput(finish_reason="length", usage=_usage(request, len(generated)))
            return
        resumed_after = len(generated)
        current = continuation(request, generated)


def _usage(request: EngineRequest, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=len(request.token_ids), completion_tokens=completion_tokens)


def _as_part_of_original(
    output: EngineOutput, request: EngineRequest, resumed_after: int
) -> EngineOutput:
    """A continuation's output, told as the original request's: its prompt is the
    original prompt, its completion counts the tokens before the migration too."""
    changes: dict = {}
    if output.cached_tokens is not None:
        changes["cached_tokens"] = None  # the caller already had the first output's
    if output.prompt_logprobs is not None:
        changes["prompt_logprobs"] = None
    if output.usage is not None:
        changes["usage"] = msgspec.structs.replace(
            output.usage,
            prompt_tokens=len(request.token_ids),
            completion_tokens=resumed_after + output.usage.completion_tokens,
        )
    return msgspec.structs.replace(output, **changes) if changes else output
