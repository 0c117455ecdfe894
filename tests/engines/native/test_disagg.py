"""Native engines in the prefill and decode roles, in one process: the decode engine pulls
the prompt's KV (local, TCP and NIXL transports) and continues exactly as one engine would."""

from __future__ import annotations

import asyncio
import time

import pytest

from stator.engines.native import NativeConfig
from stator.engines.registry import create_engine
from stator.kv.transfer import TransferConfig
from stator.protocols import EngineRequest, SamplingOptions, StopConditions
from stator.router.disagg_requests import (
    as_part_of_original,
    decode_request,
    first_output,
    is_handoff,
    prefill_request,
)
from tests.engines.native.models import prompt
from tests.kv.transfer.nixl_required import needs_nixl

TIMEOUT = 60
NIXL = pytest.param("nixl", marks=needs_nixl)


async def make(model_dir, role: str, kind: str = "auto", timeout: float = 30.0, **config):
    values = {"device": "cpu", "dtype": "float32", "kv_cache_memory": "4MiB"} | config
    eng = create_engine("native", NativeConfig(**values), str(model_dir), "tiny")
    eng.role = role
    eng.kv_transfer = TransferConfig(kind=kind, timeout=timeout)
    await eng.start()
    return eng


@pytest.fixture
async def engines(llama):
    model_dir, _ = llama
    made = []

    async def factory(role, kind="auto", **kw):
        eng = await make(model_dir, role, kind, **kw)
        made.append(eng)
        return eng

    yield factory
    for eng in made:
        await eng.shutdown()


def request(rid: str, tokens: list[int], max_tokens: int, logprobs: int | None = 2):
    return EngineRequest(
        request_id=rid,
        model="tiny",
        token_ids=tokens,
        sampling=SamplingOptions(temperature=0.0, logprobs=logprobs),
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
    )


async def collect(eng, req):
    return await asyncio.wait_for(_collect(eng, req), TIMEOUT)


async def _collect(eng, req):
    return [out async for out in eng.generate(req)]


async def disaggregated(prefill, decode, req):
    """What the router does, without the router: both halves, told as one stream."""
    pre = await collect(prefill, prefill_request(req))
    final = pre[-1]
    assert is_handoff(final), final
    outs = [first_output(final)]
    dec = decode_request(req, final, final.disagg)
    outs += [as_part_of_original(o, req, final) for o in await collect(decode, dec)]
    return outs, final


def flat(outs):
    return [t for o in outs for t in o.token_ids]


def logprobs(outs):
    return [lp.logprob for o in outs for lp in (o.logprobs or [])]


def used(eng) -> int:
    return eng.core.blocks.num_used_blocks


async def until_idle(prefill, decode, seconds: float = 20.0) -> None:
    """Wait for both pools to be idle and no pull in flight, at most `seconds` (a box at
    load stretches a pull; a leak still fails the caller's assertions)."""
    for _ in range(int(seconds / 0.02)):
        if used(decode) == 0 and used(prefill) == 0 and not decode.core.importing:
            return
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("kind", ["local", "tcp", NIXL])
async def test_disaggregated_output_is_the_aggregated_output(engines, kind):
    agg = await engines("aggregated")
    prefill = await engines("prefill", kind)
    decode = await engines("decode", kind)
    for i, (n, max_tokens) in enumerate([(45, 8), (16, 5), (70, 12)]):
        req = request(f"r{i}", prompt(3 + i, n), max_tokens)
        expected = await collect(agg, req)
        outs, final = await disaggregated(prefill, decode, req)
        assert flat(outs) == flat(expected)
        assert logprobs(outs) == pytest.approx(logprobs(expected), abs=1e-5)
        assert outs[-1].usage == expected[-1].usage
        assert len(final.disagg.remote_block_ids) == -(-n // 16)
    # Every pin was released by the decode side; nothing held on either side.
    for _ in range(50):
        if used(prefill) == 0:
            break
        await asyncio.sleep(0.02)
    assert used(prefill) == 0 and used(decode) == 0
    assert decode.transfers.by_kind == {kind: 3}
    assert decode.metrics()["kv_transfer_bytes_total"] > 0


async def test_decode_side_pulls_only_blocks_it_does_not_cache(engines):
    prefill = await engines("prefill", "tcp")
    decode = await engines("decode", "tcp")
    tokens = prompt(9, 64)
    await disaggregated(prefill, decode, request("a", tokens, 3))
    blocks_before = decode.transfers.blocks
    # Same 64-token prefix plus 20 more: the decode side caches the first 4 blocks.
    await disaggregated(prefill, decode, request("b", tokens + prompt(10, 20), 3))
    assert decode.transfers.blocks - blocks_before == 2  # blocks 4 and 5 (partial)


async def test_unpulled_pins_expire_and_release_frees_at_once(engines):
    prefill = await engines("prefill", "tcp", timeout=0.3)
    pre = await collect(prefill, prefill_request(request("x", prompt(1, 40), 4)))
    assert used(prefill) == 3 and prefill.core.pinned("x") == pre[-1].disagg.remote_block_ids
    await asyncio.sleep(0.5)
    assert used(prefill) == 0 and prefill.core.exports.num_expired == 1
    await collect(prefill, prefill_request(request("y", prompt(2, 40), 4)))
    assert used(prefill) == 3
    assert await prefill.release_kv("y") is True
    assert used(prefill) == 0 and await prefill.release_kv("y") is False


async def test_a_release_that_comes_before_the_pin_drops_the_pin_as_it_is_made(engines):
    """The router's caller left while the prefill ran: its release (`later`) reached the
    prefill worker before the prefill pinned anything. The pin that follows goes at once,
    not at its timeout; one without `later` is left to its reader."""
    prefill = await engines("prefill", "tcp", timeout=60)
    assert await prefill.release_kv("z", unless_claimed=True, later=True) is False
    final = (await collect(prefill, prefill_request(request("z", prompt(3, 40), 4))))[-1]
    assert is_handoff(final)  # the answer still says where (a reader finds nothing)
    assert used(prefill) == 0 and prefill.core.pinned("z") is None
    gauges = prefill.metrics()
    assert gauges["kv_exports_released_at_pin_total"] == 1
    assert gauges["kv_exports_pinned"] == 0 and gauges["kv_exports_expired_total"] == 0
    assert await prefill.release_kv("w", unless_claimed=True) is False
    await collect(prefill, prefill_request(request("w", prompt(4, 40), 4)))
    assert used(prefill) == 3 and prefill.core.pinned("w") is not None


async def test_the_kv_release_admin_op_passes_later_and_refuses_a_flag_that_is_not_bool(
    engines,
):
    from stator.protocols import AdminRequest
    from stator.worker.admin import AdminOps

    prefill = await engines("prefill", "tcp", timeout=60)
    ops = AdminOps(prefill)
    bad = await ops.handle(AdminRequest(op="kv_release", args={"id": "v", "later": "yes"}))
    assert not bad.ok and "'later' must be true or false" in bad.error
    args = {"id": "v", "unless_claimed": True, "later": True}
    answer = await ops.handle(AdminRequest(op="kv_release", args=args))
    assert answer.ok and answer.result is False  # nothing pinned yet
    await collect(prefill, prefill_request(request("v", prompt(5, 40), 4)))
    assert used(prefill) == 0 and prefill.core.exports.num_released_at_pin == 1


@pytest.mark.parametrize("kind", ["tcp", NIXL])
async def test_a_failed_pull_computes_the_prompt_on_the_decode_side(engines, kind):
    agg = await engines("aggregated")
    prefill = await engines("prefill", kind)
    decode = await engines("decode", kind)
    req = request("r", prompt(4, 50), 6)
    expected = await collect(agg, req)
    pre = await collect(prefill, prefill_request(req))
    final = pre[-1]
    await prefill.release_kv(final.disagg.prefill_request_id)  # gone before the pull
    outs = [first_output(final)]
    dec = decode_request(req, final, final.disagg)
    outs += await collect(decode, dec)
    assert flat(outs) == flat(expected)
    assert decode.transfers.fallbacks == 1 and used(decode) == 0


@pytest.mark.parametrize("kind", ["tcp", NIXL])
async def test_an_abort_during_the_pull_frees_blocks_when_it_ends(engines, kind):
    prefill = await engines("prefill", kind)
    decode = await engines("decode", kind)
    req = request("r", prompt(5, 60), 50)
    final = (await collect(prefill, prefill_request(req)))[-1]
    stream = decode.generate(decode_request(req, final, final.disagg))
    task = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await stream.aclose()
    await until_idle(prefill, decode)  # the pull goes on (NIXL: its agent starts first)
    assert used(decode) == 0 and used(prefill) == 0


async def cancel_as_admission_answers(eng, req) -> None:
    """Cancel `eng.generate(req)` at the worst moment: while a step runs (the admission is
    deferred), the step ends and runs it, and the client's cancel lands before the
    generator resumes with the answer (asyncio then raises CancelledError in its place)."""
    stream = eng.generate(req)
    eng._stepping = True  # as if a step were running: changes to the core wait for it
    task = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert len(eng._deferred) == 1
    eng._run_deferred()  # the step ends: the request is admitted, its answer set...
    task.cancel()  # ...and cancelled before generate() can see it
    eng._stepping = False
    await asyncio.gather(task, return_exceptions=True)
    await stream.aclose()


async def test_a_cancel_racing_the_import_admission_leaks_nothing(engines):
    prefill = await engines("prefill", "tcp")
    decode = await engines("decode", "tcp")
    req = request("r", prompt(6, 60), 50)
    final = (await collect(prefill, prefill_request(req)))[-1]
    await cancel_as_admission_answers(decode, decode_request(req, final, final.disagg))
    await until_idle(prefill, decode)
    # Not left to the prefill side's 30 s timeout: the decode side released the pin.
    assert used(decode) == 0 and not decode.core.importing and not decode.core.seqs
    assert used(prefill) == 0


async def test_a_cancel_racing_the_admission_aborts_the_request(engines):
    agg = await engines("aggregated")
    await cancel_as_admission_answers(agg, request("r", prompt(7, 30), 400))
    for _ in range(50):
        if not agg.core.seqs and used(agg) == 0:
            break
        await asyncio.sleep(0.02)
    assert not agg.core.seqs and used(agg) == 0  # not decoded to its 400th token first


async def test_a_claimed_pin_is_released_early_only_by_its_reader(engines):
    """The router's release after the hand-over (`unless_claimed`) leaves a pin that a
    decode agent has checked (it may be copying the blocks right now): that agent's own
    release, after its copy, unpins it. An unclaimed pin goes at once."""
    prefill = await engines("prefill", "tcp")
    decode = await engines("decode", "tcp")
    final = (await collect(prefill, prefill_request(request("c", prompt(8, 40), 4))))[-1]
    pin, blocks = final.disagg.prefill_request_id, final.disagg.remote_block_ids
    transfer = {**final.disagg.transfer, "agent": "in another process"}
    await decode.agent._checked(transfer, pin, blocks)  # the pull's pin check: a claim
    assert await prefill.release_kv(pin, unless_claimed=True) is False
    assert used(prefill) == 3
    await decode.agent.release(transfer, pin)
    assert used(prefill) == 0 and prefill.core.exports.num_released == 1
    final = (await collect(prefill, prefill_request(request("d", prompt(9, 40), 4))))[-1]
    assert await prefill.release_kv(final.disagg.prefill_request_id, unless_claimed=True)
    assert used(prefill) == 0


async def test_a_decode_request_cancelled_before_admission_unpins_at_once(engines):
    """Cancelled while its admission waits for the step to end (never in the core): the
    decode side tells the prefill side at once; both pools idle long before the 30 s pin
    timeout."""
    prefill = await engines("prefill", "tcp")
    decode = await engines("decode", "tcp")
    req = request("r", prompt(10, 60), 50)
    final = (await collect(prefill, prefill_request(req)))[-1]
    assert used(prefill) == 4
    stream = decode.generate(decode_request(req, final, final.disagg))
    decode._stepping = True  # a step runs: the admission is deferred
    task = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert len(decode._deferred) == 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    decode._stepping = False
    decode._run_deferred()  # the step ends: the cancelled admission is skipped
    await stream.aclose()
    await until_idle(prefill, decode, 5.0)
    assert used(prefill) == 0 and used(decode) == 0 and not decode.core.seqs
    assert prefill.core.exports.num_released == 1 and prefill.core.exports.num_expired == 0


async def test_a_pull_cancelled_mid_copy_unpins_only_after_the_copy_ended(engines):
    """The release of the prefill pin must come after the copy that reads it, even when
    the pull is cancelled (engine shutdown) while its copy runs in a thread."""
    prefill = await engines("prefill", "local")
    decode = await engines("decode", "local")
    events: list[str] = []
    copy = decode.agent._copy_from
    copying = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_copy(*args):
        loop.call_soon_threadsafe(copying.set)
        time.sleep(0.4)
        events.append("copy ended")
        return copy(*args)

    decode.agent._copy_from = slow_copy
    release = prefill.agent.on_release

    async def recorded_release(pin: str) -> bool:
        events.append("released")
        return await release(pin)

    prefill.agent.on_release = recorded_release
    req = request("r", prompt(11, 60), 50)
    final = (await collect(prefill, prefill_request(req)))[-1]
    stream = decode.generate(decode_request(req, final, final.disagg))
    first = asyncio.ensure_future(anext(stream))
    await asyncio.wait_for(copying.wait(), TIMEOUT)
    for task in list(decode._side_tasks):  # the pull (`_import`), as a shutdown cancels it
        task.cancel()
    await until_idle(prefill, decode)
    assert events == ["copy ended", "released"]
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await stream.aclose()
    await until_idle(prefill, decode)
    assert used(prefill) == 0 and used(decode) == 0


async def test_a_prefill_request_whose_caller_leaves_as_it_ends_unpins_at_once(engines):
    """The prefill ends (its KV pinned, the answer queued) as the caller's cancel comes:
    the answer never reaches the caller, so no decode worker will pull the KV; the prefill
    engine unpins it at once, not at its 30 s timeout."""
    prefill = await engines("prefill", "tcp")
    stream = prefill.generate(prefill_request(request("p", prompt(12, 60), 8)))
    consumer = asyncio.ensure_future(anext(stream))
    finish = prefill._finish_stream

    def finish_then_cancel(rid, out):
        finish(rid, out)  # the answer is queued for the caller...
        consumer.cancel()  # ...who is cancelled before it reads it

    prefill._finish_stream = finish_then_cancel
    await asyncio.gather(consumer, return_exceptions=True)
    assert consumer.cancelled()
    await stream.aclose()
    for _ in range(100):
        if used(prefill) == 0:
            break
        await asyncio.sleep(0.02)
    assert used(prefill) == 0 and prefill.core.exports.num_released == 1
    assert prefill.core.exports.num_expired == 0
