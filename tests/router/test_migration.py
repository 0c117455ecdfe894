import pytest

from stator.protocols import EngineOutput, EngineRequest, GuidedDecoding, SamplingOptions
from stator.router import RouterConfig
from stator.router.migration import continuation, migrating
from stator.runtime import StreamDisconnected
from tests.router.fleet import collect, request, start_router


def tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


async def test_stream_survives_its_worker_dying_mid_stream():
    router, workers = await start_router(
        2, RouterConfig(router_mode="round-robin", migration_limit=1)
    )
    first = workers[0] if router.candidates()[0][0] == workers[0].id else workers[1]
    other = workers[1] if first is workers[0] else workers[0]
    first.die_after = 3
    outputs = await collect(router, request("r1", [10, 11, 12], max_tokens=8))
    assert tokens(outputs) == list(range(13, 21))  # 8 tokens, none lost or repeated
    assert outputs[-1].finish_reason == "length"
    assert outputs[-1].usage.prompt_tokens == 3 and outputs[-1].usage.completion_tokens == 8
    # The other worker got the prompt plus what was generated, and the rest of the budget.
    resumed = other.requests[-1]
    assert resumed.token_ids == [10, 11, 12, 13, 14, 15]
    assert resumed.stop.max_tokens == 5
    assert sum(o.cached_tokens is not None for o in outputs) == 1
    assert router.metrics.migrations.labels("m", "ongoing_request")._value.get() == 1
    await router.close()


async def test_limit_zero_propagates_the_failure():
    router, workers = await start_router(
        2, RouterConfig(router_mode="round-robin", migration_limit=0)
    )
    for w in workers:
        w.die_after = 2
    seen = []
    with pytest.raises(StreamDisconnected):
        async for out in router.generate(request("r1", [1], max_tokens=8)):
            seen.extend(out.token_ids)
    assert seen == [2, 3]
    # Nothing booked is left behind.
    assert router.load.bookings == {}
    await router.close()


async def test_limit_counts_migrations():
    router, workers = await start_router(
        3, RouterConfig(router_mode="round-robin", migration_limit=1)
    )
    for w in workers:
        w.die_after = 1
    with pytest.raises(StreamDisconnected):
        await collect(router, request("r1", [1], max_tokens=8))
    await router.close()


async def test_model_card_limit_applies_when_flag_unset():
    router, _workers = await start_router(
        2, RouterConfig(router_mode="round-robin"), migration_limit=2
    )
    assert router.migration_limit == 2
    await router.close()


def test_continuation():
    req = EngineRequest(
        request_id="r",
        model="m",
        token_ids=[1, 2],
        sampling=SamplingOptions(prompt_logprobs=1),
    )
    req.stop.max_tokens = 10
    req.stop.min_tokens = 3
    cont = continuation(req, [7, 8, 9, 10])
    assert cont.token_ids == [1, 2, 7, 8, 9, 10]
    assert cont.stop.max_tokens == 6 and cont.stop.min_tokens == 0
    assert cont.sampling.prompt_logprobs is None
    assert req.token_ids == [1, 2]  # the original is untouched


async def test_lost_final_chunk_after_the_last_token_finishes_cleanly():
    calls = []

    async def attempt(req, tried):
        calls.append(req)
        tried.add(len(calls))
        yield EngineOutput(token_ids=[5, 6])
        raise StreamDisconnected("gone")

    req = request("r", [1], max_tokens=2)
    outs = [o async for o in migrating(req, attempt, limit=3)]
    assert [o.token_ids for o in outs] == [[5, 6], []]
    assert outs[-1].finish_reason == "length" and outs[-1].usage.completion_tokens == 2
    assert len(calls) == 1


async def test_guided_decoding_is_not_migrated():
    async def attempt(req, tried):
        yield EngineOutput(token_ids=[5])
        raise StreamDisconnected("gone")

    req = request(
        "r", [1], max_tokens=4, sampling=SamplingOptions(guided_decoding=GuidedDecoding(regex="a+"))
    )
    with pytest.raises(StreamDisconnected):
        [o async for o in migrating(req, attempt, limit=3)]


async def test_prompt_embeddings_are_not_migrated():
    # A continuation would need the embeddings plus generated token ids as one prompt.
    calls = []

    async def attempt(req, tried):
        calls.append(req)
        yield EngineOutput(token_ids=[5])
        raise StreamDisconnected("gone")

    req = EngineRequest(
        request_id="r",
        model="m",
        prompt_embeds=bytes(16),
        prompt_embeds_shape=[2, 2],
        prompt_embeds_dtype="float32",
    )
    with pytest.raises(StreamDisconnected):
        [o async for o in migrating(req, attempt, limit=3)]
    assert len(calls) == 1


async def test_a_refused_connection_is_retried_elsewhere_even_without_migration():
    from stator.protocols import RoutingHints
    from stator.runtime.errors import ConnectionRefused

    calls = []

    async def attempt(req, tried):
        calls.append(set(tried))
        tried.add(len(calls))
        if len(calls) == 1:
            raise ConnectionRefused("nothing listens there")
        yield EngineOutput(token_ids=[1], finish_reason="stop")

    req = EngineRequest(request_id="r", model="m", token_ids=[1, 2])
    outs = [o async for o in migrating(req, attempt, limit=0)]
    assert [o.token_ids for o in outs] == [[1]] and calls == [set(), {1}]
    # A request pinned to the refusing worker fails instead.
    pinned = EngineRequest(
        request_id="p", model="m", token_ids=[1], routing=RoutingHints(target_worker_id=7)
    )
    calls.clear()
    with pytest.raises(ConnectionRefused):
        [o async for o in migrating(pinned, attempt, limit=3)]
