"""Disaggregated serving through `DisaggRouter` with mocker workers in one process:
which path each request takes, what each worker receives, what the caller sees."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from stator.engines.mocker import MockerConfig, create_engine
from stator.protocols import (
    AdminResponse,
    DisaggParams,
    EngineOutput,
    EngineRequest,
    SamplingOptions,
    StopConditions,
)
from stator.router import Router, RouterConfig
from stator.router.disagg import DisaggRouter
from stator.router.disagg_requests import (
    as_part_of_original,
    decode_request,
    is_handoff,
    prefill_request,
    wants_remote_prefill,
)
from stator.router.migration import continuation
from stator.runtime import NoInstances, Runtime, RuntimeConfig
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost

BS = 16


class Fleet:
    def __init__(self, model_dir) -> None:
        self.model_dir = model_dir
        self.hosts: list[WorkerHost] = []
        self.routers: list[DisaggRouter] = []

    async def worker(self, role: str, **mocker) -> WorkerHost:
        mocker.setdefault("block_size", BS)
        mocker.setdefault("speedup_ratio", 0.0)
        engine = create_engine(MockerConfig(role=role, **mocker), str(self.model_dir), "m")
        runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
        host = WorkerHost(
            runtime,
            engine,
            WorkerConfig(role=role, health_check_interval=0, load_report_interval=0),
            model_dir=self.model_dir,
        )
        await host.start()
        self.hosts.append(host)
        return host

    async def router(self, **config) -> DisaggRouter:
        config.setdefault("disagg_min_prefill_tokens", 64)
        config = RouterConfig(**config)
        frontend = await Runtime.create(RuntimeConfig(discovery="mem"))
        card = next(h.card for h in self.hosts if h.card.role != "prefill")
        registry = CollectorRegistry()
        decode_client = await frontend.client("stator.backend.generate", EngineOutput)
        prefill_client = await frontend.client("stator.prefill.generate", EngineOutput)
        admin = await frontend.client("stator.prefill.admin", AdminResponse)
        decode = Router(frontend, decode_client, card, config, registry=registry)
        prefill = Router(frontend, prefill_client, card, config, registry=registry)
        router = DisaggRouter(decode, prefill, config, prefill_admin=admin)
        await router.start()
        self.routers.append(router)
        return router

    async def close(self) -> None:
        for router in self.routers:
            await router.close()
        for host in self.hosts:
            await host.stop(grace=0)


@pytest.fixture
async def fleet(tiny_model_dir):
    f = Fleet(tiny_model_dir)
    yield f
    await f.close()


def request(rid: str, n: int = 200, max_tokens: int = 8, **fields) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=[(i * 7) % 50 + 3 for i in range(n)],
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
        **fields,
    )


async def collect(router: DisaggRouter, req: EngineRequest) -> list[EngineOutput]:
    return [out async for out in router.generate(req)]


def tokens(outs: list[EngineOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def paths(router: DisaggRouter) -> dict[tuple[str, str], float]:
    out = {}
    for metric in router.metrics.disagg_requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.value:
                out[(sample.labels["path"], sample.labels["reason"])] = sample.value
    return out


def test_protocol_round_trip():
    req = request("r", n=40, max_tokens=5, sampling=SamplingOptions(logprobs=1))
    pre = prefill_request(req)
    assert pre.stop.max_tokens == 1 and pre.disagg == DisaggParams()
    assert pre.token_ids == req.token_ids
    params = DisaggParams(prefill_worker_id=7, remote_block_ids=[3, 4, 5], num_prompt_tokens=40)
    final = EngineOutput(token_ids=[9], finish_reason="length", cached_tokens=16, disagg=params)
    assert is_handoff(final)
    dec = decode_request(req, final, params)
    assert dec.token_ids == [*req.token_ids, 9] and dec.stop.max_tokens == 4
    assert dec.disagg is params
    last = EngineOutput(finish_reason="length", usage=_usage(41, 4, 0))
    told = as_part_of_original(last, req, final)
    assert (told.usage.prompt_tokens, told.usage.completion_tokens) == (40, 5)
    assert told.usage.cached_tokens == 16
    # A migrated decode request computes its prompt where it lands: no stale KV pull.
    assert continuation(dec, [1, 2]).disagg is None
    assert continuation(pre, []).disagg == DisaggParams()


def _usage(p, c, k):
    from stator.protocols import Usage

    return Usage(prompt_tokens=p, completion_tokens=c, cached_tokens=k)


def test_requests_that_stay_on_one_worker():
    assert wants_remote_prefill(request("a")) is None
    assert wants_remote_prefill(request("a", max_tokens=1)) == "one_token"
    prompt_lp = request("a", sampling=SamplingOptions(prompt_logprobs=1))
    assert wants_remote_prefill(prompt_lp) == "prompt_logprobs"


async def test_long_prompts_prefill_remotely_and_stream_as_one(fleet):
    prefill = await fleet.worker("prefill")
    decode = await fleet.worker("decode")
    router = await fleet.router()
    await router.prefill.client.wait_for_instances(1)
    await router.decode.client.wait_for_instances(1)
    outs = await collect(router, request("r1", n=200, max_tokens=8))
    assert len(tokens(outs)) == 8
    assert [o.finish_reason for o in outs][-1] == "length"
    assert all(o.finish_reason is None for o in outs[:-1])
    usage = outs[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (200, 8)
    assert outs[0].cached_tokens is not None
    assert all(o.cached_tokens is None for o in outs[1:])
    assert prefill.engine.num_requests == 1 and decode.engine.num_requests == 1
    assert decode.engine.num_transfers == 1
    assert paths(router) == {("remote", "prefill"): 1}


async def test_short_prompts_and_missing_prefill_workers_stay_local(fleet):
    await fleet.worker("decode")
    router = await fleet.router()
    await router.decode.client.wait_for_instances(1)
    outs = await collect(router, request("r1", n=200))
    assert len(tokens(outs)) == 8
    assert paths(router) == {("local", "no_prefill_workers"): 1}
    prefill = await fleet.worker("prefill")
    await router.prefill.client.wait_for_instances(1)
    await collect(router, request("r2", n=20))
    assert paths(router)[("local", "short_prompt")] == 1
    assert prefill.engine.num_requests == 0


async def test_enforce_disagg_refuses_without_prefill_workers(fleet):
    await fleet.worker("decode")
    router = await fleet.router(enforce_disagg=True)
    await router.decode.client.wait_for_instances(1)
    with pytest.raises(NoInstances):
        await collect(router, request("r1"))
    assert paths(router) == {("rejected", "no_prefill_workers"): 1}


async def test_a_failed_prefill_worker_falls_back_to_local_prefill(fleet):
    prefill = await fleet.worker("prefill")
    await fleet.worker("decode")
    router = await fleet.router(migration_limit=0)
    await router.prefill.client.wait_for_instances(1)
    await router.decode.client.wait_for_instances(1)
    await prefill.runtime._server.stop()  # connections to it now fail
    outs = await collect(router, request("r1"))
    assert len(tokens(outs)) == 8
    assert paths(router) == {("local", "prefill_failed"): 1}


async def test_a_long_prefill_queue_keeps_prompts_local(fleet):
    await fleet.worker("prefill")
    await fleet.worker("decode")
    router = await fleet.router(disagg_max_prefill_queue=100)
    await router.prefill.client.wait_for_instances(1)
    await router.decode.client.wait_for_instances(1)
    wid = router.prefill.client.instance_ids()[0]
    router.prefill.load.add("other", (wid, 0), 500, 10, [])
    await collect(router, request("r1"))
    assert paths(router) == {("local", "prefill_queue"): 1}


async def test_a_stop_token_at_prefill_ends_the_request_there(fleet, monkeypatch):
    prefill = await fleet.worker("prefill", output_mode="echo")
    decode = await fleet.worker("decode")
    router = await fleet.router()
    await router.prefill.client.wait_for_instances(1)
    await router.decode.client.wait_for_instances(1)
    req = request("r1")
    # Echo mode answers the prompt's first token: make it a visible stop token.
    req.stop.stop_token_ids = [req.token_ids[0]]
    req.stop.ignore_eos = False
    outs = await collect(router, req)
    assert outs[-1].finish_reason == "stop" and outs[-1].usage.completion_tokens == 1
    assert prefill.engine.num_requests == 1 and decode.engine.num_requests == 0


async def test_a_client_leaving_between_the_halves_releases_the_prefill_kv(fleet):
    released = await leave_after(fleet, outputs=1)
    assert released == [("r1", False, False)]  # no decode worker has it: unpinned whatever


async def test_a_client_leaving_once_the_decode_request_is_sent_releases_unless_claimed(fleet):
    """On its way to (or at) the decode worker: the router asks the prefill worker to
    unpin now, unless a decode worker has begun reading the blocks (it releases them
    itself after its copy). Not left to the prefill side's timeout."""
    released = await leave_after(fleet, outputs=2)
    assert released == [("r1", True, False)]


async def leave_after(fleet, outputs: int) -> list[tuple[str, bool, bool]]:
    router, released = await recording_releases(fleet)
    stream = router.generate(request("r1", max_tokens=50))
    for _ in range(outputs):
        out = await anext(stream)
        assert out.finish_reason is None
    await stream.aclose()
    return await soon(released)


async def recording_releases(fleet, answer: bool = True):
    """A prefill and a decode worker and their router; the prefill engine's `release_kv`
    calls recorded as (id, unless_claimed, later), each answered `answer`."""
    prefill = await fleet.worker("prefill")
    await fleet.worker("decode")
    router = await fleet.router()
    await router.prefill.client.wait_for_instances(1)
    await router.decode.client.wait_for_instances(1)
    released: list[tuple[str, bool, bool]] = []

    async def release_kv(rid, unless_claimed=False, later=False):
        released.append((rid, unless_claimed, later))
        return answer

    prefill.engine.release_kv = release_kv
    return router, released


async def leave_when(stream, event: asyncio.Event) -> None:
    """The client waits for the stream's first output and leaves once `event` is set."""
    task = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(event.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await stream.aclose()


async def soon(released: list) -> list:
    """`released` once something is in it (the release goes out as a task), or empty
    after a second."""
    for _ in range(100):
        if released:
            break
        await asyncio.sleep(0.01)
    return released


async def test_a_client_leaving_after_the_prefill_answer_before_its_stream_ends_releases(fleet):
    """The prefill worker's answer (where the KV is pinned) is in, its stream not yet over,
    when the client leaves: nobody will pull that KV, so the router unpins it now."""
    router, released = await recording_releases(fleet)
    real = router.prefill.generate
    answered = asyncio.Event()

    async def answer_then_hang(req):
        async for out in real(req):
            yield out
        answered.set()
        await asyncio.Event().wait()  # the stream's end never comes

    router.prefill.generate = answer_then_hang
    await leave_when(router.generate(request("r1", max_tokens=50)), answered)
    assert await soon(released) == [("r1", False, False)]


async def test_a_client_leaving_before_the_prefill_answer_asks_prefill_workers_to_unpin(fleet):
    """The answer may be on its way (the KV pinned under the request's id) as the client
    leaves: every prefill worker is asked to unpin that id unless a reader claimed it."""
    router, released = await recording_releases(fleet, answer=False)
    await router.prefill_admin.wait_for_instances(1)
    asked = asyncio.Event()

    async def never_answers(req):
        asked.set()
        await asyncio.Event().wait()
        yield  # an async generator that never yields

    router.prefill.generate = never_answers
    await leave_when(router.generate(request("r1", max_tokens=50)), asked)
    assert await soon(released) == [("r1", True, True)]
