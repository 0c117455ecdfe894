"""End to end: `stator frontend` + two `stator worker --engine vllm` processes (file
discovery, ZMQ event plane, KV router), driven with the openai SDK; at the end one
worker's vLLM engine is killed: that worker exits non-zero and the other serves on."""

from __future__ import annotations

import base64
import os
import signal
from pathlib import Path

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import openai
import psutil
import torch
from tokenizers import Tokenizer

from tests.e2e.fleet import live_instances, wait_until
from tests.engines.vllm.models import HIDDEN

pytestmark = pytest.mark.integration

VLLM_FLAGS = ("--enforce-eager", "--max-model-len", "1024", "--dtype", "float32")


def random_embeds(path: Path, rows: int, hidden: int) -> Path:
    """A float32 [rows, hidden] tensor saved with torch.save (fixed seed)."""
    generator = torch.Generator().manual_seed(rows * 1000 + hidden)
    torch.save(torch.randn(rows, hidden, generator=generator), path)
    return path


def b64_of(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_openai_sdk_through_frontend_and_vllm_workers(fleet, llama_dir, offline_vllm, tmp_path):
    discovery = f"file:{tmp_path / 'discovery'}"
    frontend, url = fleet.frontend(discovery, "zmq", "--router-mode", "kv")
    worker_args = [
        "worker", "--engine", "vllm", "--model", str(llama_dir), "--served-model-name", "tiny",
        "--discovery", discovery, "--event-plane", "zmq", "--discovery-ttl", "5", *VLLM_FLAGS,
        "--enable-prompt-embeds", "--engine-monitor-interval", "0.5",
    ]  # fmt: skip
    workers = [fleet.start("worker", *worker_args) for _ in range(2)]
    procs = [frontend, *workers]
    wait_until(lambda: len(live_instances(url, "tiny")) == 2, 600, "two vLLM workers", procs)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=120)
    assert "tiny" in [m.id for m in client.models.list().data]

    # Chat, streamed, with usage.
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 8
    assert any(c.choices and c.choices[0].delta.content for c in chunks)

    # Completions, greedy: the same text vLLM's own offline LLM.generate produces, from
    # token ids and from prompt embeddings (vLLM's base64 `torch.save` format).
    tokenizer = Tokenizer.from_file(str(llama_dir / "tokenizer.json"))
    prompt = "def hello(name):\n    return"
    completion = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=8, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    embeds = random_embeds(tmp_path / "embeds.pt", rows=7, hidden=HIDDEN)
    from_embeds = client.completions.create(
        model="tiny", prompt="", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True, "prompt_embeds": b64_of(embeds)},
    )  # fmt: skip
    expected_ids, expected_from_embeds = offline_vllm.greedy_many(
        llama_dir, [tokenizer.encode(prompt).ids, embeds], 8
    )
    assert completion.choices[0].text == tokenizer.decode(expected_ids)
    assert len(completion.choices[0].logprobs.tokens) == 8
    assert all(len(top) == 2 for top in completion.choices[0].logprobs.top_logprobs)
    assert len(from_embeds.choices) == 1
    assert from_embeds.choices[0].text == tokenizer.decode(expected_from_embeds)
    assert from_embeds.usage.prompt_tokens == 7 and from_embeds.usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError, match=f"hidden size {HIDDEN}"):
        client.completions.create(
            model="tiny", prompt="", max_tokens=2,
            extra_body={"prompt_embeds": b64_of(random_embeds(tmp_path / "w.pt", 3, HIDDEN + 1))},
        )  # fmt: skip

    # KV events reach the router: it sends a repeated long prefix to the worker that holds
    # it, so every repeat reports cached prompt tokens (vLLM's CPU block size is 128).
    long_prompt = "".join(f"value_{i} = compute({i}, key='k{i}')\n" for i in range(25))
    cached = []
    for i in range(4):
        stream = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": long_prompt + f"# request {i}"}],
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usage = list(stream)[-1].usage
        assert usage.prompt_tokens > 300
        cached.append(usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0, cached
    assert all(c >= 256 for c in cached[1:]), cached

    # Streaming cancel: closing the stream early leaves the workers serving.
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=500, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    for n, _ in enumerate(stream):
        if n == 2:
            break
    stream.close()
    after = client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0)
    assert after.usage.completion_tokens == 2

    # A worker whose vLLM engine dies exits non-zero (its engine monitor notices), and
    # the frontend, once it is gone from discovery, serves from the other.
    dying, survivor = workers
    engine_procs = psutil.Process(dying.proc.pid).children(recursive=True)
    assert engine_procs, "the worker started no vLLM engine process"
    for child in engine_procs:
        os.kill(child.pid, signal.SIGKILL)
    rc = dying.wait(120)
    assert rc != 0, dying.output()[-3000:]
    assert "engine died" in dying.output()
    wait_until(
        lambda: len(live_instances(url, "tiny")) == 1, 60, "the dead worker gone", [survivor]
    )
    after = client.completions.create(model="tiny", prompt="y", max_tokens=2, temperature=0)
    assert after.usage.completion_tokens == 2
