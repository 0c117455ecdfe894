"""Tensor parallelism for real: rank 0 here, the other ranks in subprocesses, over gloo on
the CPU (NCCL in the GPU tests at the end). TP=N must produce TP=1's greedy tokens and
logprobs; bad sizes fail at start; ranks never outlive the engine."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stator.engines.native import NativeConfig, create_engine
from stator.protocols import EngineOutput
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of
from tests.procs import repo_env

pytestmark = pytest.mark.integration

CPU = {"device": "cpu", "dtype": "float32", "kv_cache_memory": "4MiB", "cpu_threads": 1}
TIMEOUT = 60


def _requests():
    """Mixed lengths, a repeated prompt (prefix-cache hit) and top logprobs to compare."""
    return [
        greedy_request("a", prompt(1, 9), 8, logprobs=5),
        greedy_request("b", prompt(2, 40), 8, logprobs=5),
        greedy_request("c", prompt(3, 23), 8, logprobs=5),
        greedy_request("d", prompt(2, 40), 4, logprobs=5),
    ]


def _assert_same(
    expected: dict[str, list[EngineOutput]], got: dict[str, list[EngineOutput]], tol: float = 1e-4
) -> None:
    for rid, outs in expected.items():
        assert tokens_of(got[rid]) == tokens_of(outs), rid
        want = [lp for o in outs for lp in o.logprobs or []]
        have = [lp for o in got[rid] for lp in o.logprobs or []]
        assert len(have) == len(want) > 0
        for w, h in zip(want, have, strict=True):
            assert h.logprob == pytest.approx(w.logprob, abs=tol)
            assert [t.token_id for t in h.top] == [t.token_id for t in w.top]
            for wt, ht in zip(w.top, h.top, strict=True):
                assert ht.logprob == pytest.approx(wt.logprob, abs=tol)


def _run_tp(model_dir: Path, size: int, **config) -> dict[str, list[EngineOutput]]:
    core = core_for(model_dir, tensor_parallel_size=size, **config)
    try:
        return run_all(core, _requests())
    finally:
        core.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("name", ["llama3", "qwen3", "qwen2", "llama_tied", "gpt_oss_ep"])
def test_tp2_matches_tp1(checkpoints, name):
    model_dir, _ = checkpoints(name)
    # A small step budget: prompts are chunked and mixed with decodes.
    config = {**CPU, "max_num_batched_tokens": 24}
    expected = run_all(core_for(model_dir, **config), _requests())
    _assert_same(expected, _run_tp(model_dir, 2, **config))


def test_tp2_steps_larger_than_one_message_match_tp1(checkpoints):
    """A 400-token prompt in one step: its payload (3 x 400 int64s and more) exceeds the
    header's message (`step_channel.INLINE`) and goes in a second broadcast."""
    from stator.engines.native.step_channel import INLINE

    model_dir, _ = checkpoints("llama3")
    assert INLINE < 3 * 400
    reqs = [greedy_request("long", prompt(7, 400), 4, logprobs=5), *_requests()[:1]]
    expected = run_all(core_for(model_dir, **CPU), reqs)
    core = core_for(model_dir, tensor_parallel_size=2, **CPU)
    try:
        _assert_same(expected, run_all(core, reqs))
    finally:
        core.close()


def test_tp4_with_replicated_kv_heads_matches_tp1(checkpoints):
    """4 ranks, 2 KV heads: each KV head is held by two ranks."""
    model_dir, _ = checkpoints("llama3")
    expected = run_all(core_for(model_dir, **CPU), _requests())
    _assert_same(expected, _run_tp(model_dir, 4, **CPU))


def test_a_size_that_does_not_divide_the_heads_fails_at_start(checkpoints):
    model_dir, _ = checkpoints("llama3")
    with pytest.raises(ValueError, match="--tensor-parallel-size 3 does not divide"):
        core_for(model_dir, tensor_parallel_size=3, **CPU)


def test_close_stops_every_rank(checkpoints):
    model_dir, _ = checkpoints("llama3")
    core = core_for(model_dir, tensor_parallel_size=2, **CPU)
    procs = list(core.runner.group.procs)
    run_all(core, [greedy_request("a", prompt(1, 9), 3)])
    core.close()
    assert [p.poll() for p in procs] == [0]


def test_a_rank_that_dies_fails_the_next_step_instead_of_hanging(checkpoints):
    model_dir, _ = checkpoints("llama3")
    core = core_for(model_dir, tensor_parallel_size=2, **CPU)
    try:
        run_all(core, [greedy_request("a", prompt(1, 9), 2)])
        proc = core.runner.group.procs[0]
        proc.kill()
        proc.wait()
        time.sleep(1.5)  # the watcher polls every 0.5 s
        with pytest.raises(RuntimeError, match="rank 1 exited"):
            run_all(core, [greedy_request("b", prompt(2, 9), 2)])
    finally:
        core.close()


def test_the_offline_llm_closes_its_ranks_on_exit(checkpoints):
    import stator

    model_dir, _ = checkpoints("llama3")
    ids = prompt(5, 12)
    expected = tokens_of(run_all(core_for(model_dir, **CPU), [greedy_request("r", ids, 6)])["r"])
    params = stator.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with stator.LLM(model_dir, tensor_parallel_size=2, **CPU) as llm:
        procs = list(llm.core.runner.group.procs)
        [out] = llm.generate([ids], params)
    assert out.outputs[0].token_ids == expected
    assert [p.poll() for p in procs] == [0]


_KILLED_WORKER = """
import sys, time
from tests.engines.native.models import core_for
core = core_for(sys.argv[1], device="cpu", dtype="float32", kv_cache_memory="4MiB",
                tensor_parallel_size=2)
print(core.runner.group.procs[0].pid, flush=True)
time.sleep(600)
"""


def test_ranks_exit_when_the_worker_is_killed(checkpoints):
    model_dir, _ = checkpoints("llama3")
    repo = Path(__file__).resolve().parents[3]
    worker = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WORKER, str(model_dir)],
        stdout=subprocess.PIPE,
        env=repo_env(),
        cwd=repo,
    )
    try:
        assert worker.stdout is not None
        rank_pid = int(worker.stdout.readline())
        assert _alive(rank_pid)
        os.kill(worker.pid, signal.SIGKILL)  # no cleanup code of the worker runs
        worker.wait()
        assert _wait_gone(rank_pid), "rank 1 outlived its killed worker"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


async def test_the_async_engine_serves_and_shutdown_stops_the_ranks(checkpoints):
    model_dir, _ = checkpoints("qwen3")
    expected = run_all(core_for(model_dir, **CPU), _requests()[:2])
    engine = create_engine(NativeConfig(tensor_parallel_size=2, **CPU), str(model_dir), "tiny")
    await engine.start()
    procs = list(engine.core.runner.group.procs)
    try:
        for request in _requests()[:2]:
            got = [o async for o in engine.generate(request)]
            assert tokens_of(got) == tokens_of(expected[request.request_id])
    finally:
        await asyncio.wait_for(engine.shutdown(), TIMEOUT)
    assert [p.poll() for p in procs] == [0]


# -- on GPUs (the device): NCCL collectives, decode CUDA graphs holding them ------------------

two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)


def _in_own_process(case, *args) -> None:
    """Run `case(*args)` in a fresh interpreter. A second tensor-parallel group made in one
    process (after the first was destroyed) waited forever in torch's symmetric-memory
    rendezvous on the device (the first case passed, the next hung; each passes alone):
    torch keeps rendezvous state per process that a fresh peer does not share. A serving
    process makes one group, so each GPU case gets a process of its own."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=case, args=args)
    proc.start()
    proc.join(600)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail(f"{case.__name__} did not finish in 600 s")
    assert proc.exitcode == 0, f"{case.__name__} failed (its traceback is above)"


def _float32_case(model_dir: Path, eager: bool) -> None:
    config = {"device": "cuda", "dtype": "float32", "max_num_batched_tokens": 24}
    expected = run_all(core_for(model_dir, **config), _requests())
    core = core_for(model_dir, tensor_parallel_size=2, enforce_eager=eager, **config)
    try:
        # Decode steps replay CUDA graphs holding the all-reduces unless told not to.
        assert (core.runner.graphs is None) == eager
        # Splitting the matmuls changes cuBLAS's kernels and the sum order (and the Triton
        # attention's float32 dots round through tf32): close, not bit-equal.
        _assert_same(expected, run_all(core, _requests()), tol=2e-3)
    finally:
        core.close()


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize(("name", "eager"), [("llama3", False), ("qwen3", False), ("llama3", True)])
def test_cuda_tp2_matches_tp1_in_float32(checkpoints, name, eager):
    model_dir, _ = checkpoints(name)
    _in_own_process(_float32_case, model_dir, eager)


# bfloat16 keeps 8 bits of mantissa: summing the halves of a matmul over two GPUs rounds
# differently from the unsplit one, by about this much in a logprob of the tiny model.
BF16_LOGPROB_TOL = 0.15


def assert_same_until_a_near_tie(
    expected: list[EngineOutput], got: list[EngineOutput], tol: float
) -> int:
    """Greedy outputs of the same model computed two ways in low precision: equal tokens
    with close logprobs until they first differ, and there the other run's token must be
    one of the reference's top tokens, within `tol` of its best (a near-tie the rounding
    may break either way). After it the two continue from different text: not comparable.
    Returns how many tokens matched before the tie (all of them when none)."""
    want = [lp for o in expected for lp in o.logprobs or []]
    have = [lp for o in got for lp in o.logprobs or []]
    assert len(want) == len(have) > 0
    for i, (w, h) in enumerate(zip(want, have, strict=True)):
        if h.token_id != w.token_id:
            top = {t.token_id: t.logprob for t in w.top}
            assert h.token_id in top, f"step {i}: not among the reference's top tokens"
            assert w.logprob - top[h.token_id] <= tol, f"step {i}: not a near-tie"
            return i
        assert h.logprob == pytest.approx(w.logprob, abs=tol), f"step {i}"
        # The runner-up's logprob too, by value (tied runners-up may swap places) and a
        # relative bound (an unlikely token's logit is larger, so is its rounding).
        runner_up = pytest.approx(w.top[1].logprob, abs=tol, rel=0.05)
        assert h.top[1].logprob == runner_up, f"step {i}"
    return len(want)


def _bfloat16_case(model_dir: Path) -> None:
    reqs = [greedy_request(f"r{i}", prompt(i, 10 + 13 * i), 16, logprobs=5) for i in range(4)]
    expected = run_all(core_for(model_dir, device="cuda", dtype="bfloat16"), reqs)
    core = core_for(model_dir, device="cuda", dtype="bfloat16", tensor_parallel_size=2)
    try:
        assert core.runner.graphs is not None
        got = run_all(core, reqs)
    finally:
        core.close()
    matched = [
        assert_same_until_a_near_tie(expected[r.request_id], got[r.request_id], BF16_LOGPROB_TOL)
        for r in reqs
    ]
    # Ties are rare: most requests' first tokens (the prompt's pass) must agree.
    assert sum(m > 0 for m in matched) >= len(reqs) - 1, matched


@pytest.mark.gpu
@two_gpus
def test_cuda_tp2_bfloat16_follows_tp1_up_to_near_ties(checkpoints):
    model_dir, _ = checkpoints("llama3")
    _in_own_process(_bfloat16_case, model_dir)


def _rank_pids(marker: str) -> list[int]:
    """Rank processes whose arguments mention `marker` (the model directory)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "stator.engines.native.rank_worker" in cmdline and marker in cmdline:
            pids.append(int(proc.name))
    return [p for p in pids if _alive(p)]


def test_stator_run_serves_with_tensor_parallelism_and_stops_its_ranks(checkpoints):
    import httpx

    from tests.procs import free_port, stator_process, wait_healthy

    model_dir, _ = checkpoints("llama3")
    port = free_port()
    proc = stator_process(
        "run",
        "--engine", "native",
        "--model", str(model_dir),
        "--served-model-name", "tiny-tp",
        "--device", "cpu", "--dtype", "float32", "--kv-cache-memory", "4MiB",
        "--cpu-threads", "1",
        "--tensor-parallel-size", "2",
        "--host", "127.0.0.1",
        "--port", str(port),
    )  # fmt: skip
    try:
        wait_healthy(proc, port, timeout=120)
        assert len(_rank_pids(str(model_dir))) == 1
        body = {
            "model": "tiny-tp",
            "prompt": "hello there",
            "max_tokens": 5,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 30
    while _rank_pids(str(model_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rank_pids(str(model_dir)) == []


@pytest.mark.gpu
@two_gpus
def test_cuda_more_ranks_than_gpus_is_a_clear_error(checkpoints):
    model_dir, _ = checkpoints("llama3")
    count = torch.cuda.device_count()
    if count != 2:
        pytest.skip("4 ranks must divide the tiny model's heads: written for 2 GPUs")
    with pytest.raises(ValueError, match=f"{count} visible"):
        core_for(model_dir, device="cuda", tensor_parallel_size=2 * count)
