"""`stator run` as a user runs it: one process, the openai SDK against it."""

from __future__ import annotations

import re

import openai
import pytest

from tests.e2e.fleet import Fleet, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def start_run(fleet: Fleet, *args: str):
    proc = fleet.start("run", "run", "--port", "0", *args)
    found = {}

    def ready() -> bool:
        m = re.search(r"at (http://\S+/v1)", proc.output())
        if m:
            found["url"] = m.group(1)
        return bool(m)

    wait_until(ready, 120, "stator run to print its URL", [proc])
    return proc, found["url"]


def test_default_run_serves_the_bundled_model_on_the_native_engine(fleet):
    proc, url = start_run(fleet)
    client = openai.OpenAI(base_url=url, api_key="none")
    assert [m.id for m in client.models.list()] == ["tiny-chat"]
    out = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "And God said"}],
        max_tokens=12,
        temperature=0,
    )
    text = out.choices[0].message.content
    assert out.usage.completion_tokens == 12 and text.strip()
    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "And God said"}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text  # greedy: the same answer streamed and not
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    proc.signal(2)
    assert proc.wait(30) == 0


def test_mocker_fleet_streams_and_reports_cached_tokens(fleet):
    _proc, url = start_run(
        fleet,
        "--engine",
        "mocker",
        "--workers",
        "2",
        "--speedup-ratio",
        "10",
        "--block-size",
        "16",
        "--router-mode",
        "round-robin",
    )
    client = openai.OpenAI(base_url=url, api_key="none")
    prompt = "In the beginning " * 40
    cached = []
    for _ in range(4):  # round-robin over 2 workers: each sees the prompt twice
        stream = client.chat.completions.create(
            model="tiny-chat",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 8
        usage = chunks[-1].usage
        assert usage.completion_tokens == 16
        cached.append(usage.prompt_tokens_details.cached_tokens)
    assert cached[:2] == [0, 0]
    assert all(c > 0 and c % 16 == 0 for c in cached[2:]), cached


def test_sigterm_lets_an_inflight_stream_finish_then_exits_0(fleet):
    # Speedup 0.2: 40 output tokens take seconds, so the stream is still going when the
    # signal arrives.
    proc, url = start_run(fleet, "--engine", "mocker", "--speedup-ratio", "0.2")
    client = openai.OpenAI(base_url=url, api_key="none")
    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "In the beginning"}],
        max_tokens=40,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            if len(pieces) == 2:
                proc.signal(15)  # SIGTERM: drain
        if chunk.choices and chunk.choices[0].finish_reason:
            assert chunk.choices[0].finish_reason == "length"
    assert len(pieces) >= 20  # the stream ran to its end after the signal
    assert proc.wait(60) == 0


def test_disagg_run_serves_through_prefill_and_decode_workers(fleet):
    import httpx

    proc, url = start_run(
        fleet,
        "--engine", "mocker", "--speedup-ratio", "0", "--disagg",
        "--prefill-workers", "1", "--decode-workers", "2", "--disagg-min-prefill-tokens", "8",
    )  # fmt: skip
    assert "1 prefill + 2 decode workers" in proc.output()
    client = openai.OpenAI(base_url=url, api_key="none")
    out = client.completions.create(
        model="tiny-chat", prompt="one two three four five six seven eight nine ten", max_tokens=6
    )
    assert out.usage.completion_tokens == 6
    metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert 'stator_router_disagg_requests_total{model="tiny-chat",path="remote"' in metrics
    proc.signal(2)
    assert proc.wait(30) == 0


def test_mocker_card_and_engine_agree_and_refusals_are_400(fleet):
    # Was: --context-length 8192 advertised 8192 while the mocker held 2048; a 1,280-token
    # prompt passed the frontend and came back as a 500 engine_error.
    proc, url = start_run(fleet, "--engine", "mocker", "--context-length", "8192")
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    (model,) = client.models.list().data
    assert model.max_model_len == 8192
    out = client.completions.create(model=model.id, prompt=[7] * 1280, max_tokens=3)
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="structured output"):
        client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_object"},
            max_tokens=3,
        )
    # The mocker gives logprobs of the right shape when asked.
    chat = client.chat.completions.create(
        model=model.id,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)
    proc.signal(2)
    assert proc.wait(30) == 0


def test_a_prompt_past_the_kv_cache_is_a_clear_400(fleet):
    # The native engine's card advertised max_model_len; a prompt that fit it but not the
    # KV cache reached the engine and came back as a 500.
    proc, url = start_run(fleet, "--kv-cache-memory", "256KiB", "--block-size", "16")
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    (model,) = client.models.list().data
    assert model.max_model_len < 1024  # what the cache holds, not max_position_embeddings
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model=model.id, prompt=[7] * (model.max_model_len + 10))
    proc.signal(2)
    assert proc.wait(30) == 0


def _core_process_pid(parent: int) -> int:
    """The pid of `parent`'s engine core process (`--engine-core-process on`)."""
    from pathlib import Path

    for task in Path(f"/proc/{parent}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"stator.engines.native.core_process" in cmdline:
                return int(child)
    raise AssertionError("no engine core process found")


def test_a_dead_engine_core_fails_its_streams_and_the_run_exits_1(fleet):
    import os
    import signal
    import threading

    proc, url = start_run(fleet, "--engine-core-process", "on", "--health-check-interval", "1")
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    out = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "And God said"}],
        max_tokens=4,
    )
    assert out.usage.completion_tokens == 4
    core = _core_process_pid(proc.proc.pid)
    # Stopped first, so that the stream cannot finish before the kill (the core runs on
    # its own: on a busy CPU it could outrun the test); killed while the request waits.
    # The request ends with the engine's error, or (once the worker has left, as a dead
    # worker does) a 503 naming the model: never a hang.
    os.kill(core, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (core, signal.SIGKILL)).start()
    with pytest.raises(openai.APIError, match=r"engine|No live worker serves model"):
        stream = client.chat.completions.create(
            model="tiny-chat",
            messages=[{"role": "user", "content": "In the beginning"}],
            max_tokens=200,
            stream=True,
            timeout=60,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason == "error":
                raise openai.APIError("engine error finish", request=None, body=None)
    assert proc.wait(60) == 1
    assert "engine core" in proc.output()


def test_api_server_count_serves_from_several_processes_and_stops_cleanly(fleet):
    proc, url = start_run(
        fleet, "--engine", "mocker", "--speedup-ratio", "10", "--api-server-count", "2"
    )
    assert "2 API server processes" in proc.output()
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    for i in range(4):  # new connections: the kernel spreads them over both processes
        out = openai.OpenAI(base_url=url, api_key="none").chat.completions.create(
            model="tiny-chat",
            messages=[{"role": "user", "content": f"hello {i}"}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert out.usage.completion_tokens == 5
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    proc.signal(15)
    assert proc.wait(60) == 0
