"""`stator run --model <gpt-oss dir>` on the native engine with no parser flags: a tiny
random GPT-OSS with the real o200k_harmony vocabulary. The card must select the Harmony
parsers by itself, and chat (plain and streamed) and /v1/responses must answer. Random
weights say nothing Harmony-shaped, so only the plumbing is checked here; the parsing of
real Harmony output is tests/frontend/test_harmony_frontend.py's."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from tests.parsers.harmony_vocab import VocabUnavailable, o200k_harmony_tokenizer_json
from tests.procs import free_port, stator_process, wait_healthy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    import transformers

    try:
        tokenizer_json = o200k_harmony_tokenizer_json()
    except VocabUnavailable as exc:
        pytest.skip(f"o200k_harmony vocabulary cannot be built offline: {exc}")
    path = tmp_path_factory.mktemp("gpt-oss") / "tiny-gpt-oss"
    config = transformers.GptOssConfig(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        vocab_size=201088,
        max_position_embeddings=4096,
        eos_token_id=200002,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    (path / "tokenizer.json").write_text(tokenizer_json.read_text())
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|return|>", "pad_token": "<|endoftext|>"})
    )
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [200002, 199999, 200012]})
    )
    return path


def test_stator_run_serves_gpt_oss_with_harmony_parsers_by_default(gpt_oss_dir):
    port = free_port()
    proc = stator_process(
        "run", "--engine", "native", "--model", str(gpt_oss_dir),
        "--served-model-name", "gpt-oss", "--host", "127.0.0.1", "--port", str(port),
        "--kv-cache-memory", "64MiB", "--max-model-len", "1024",
    )  # fmt: skip
    try:
        wait_healthy(proc, port, timeout=120)
        base = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Hi there"}]
        r = client.chat.completions.create(model="gpt-oss", messages=messages, max_tokens=6)
        assert r.usage.completion_tokens >= 1
        assert r.choices[0].finish_reason in ("stop", "length")
        chunks = list(
            client.chat.completions.create(
                model="gpt-oss", messages=messages, max_tokens=6, stream=True
            )
        )
        assert chunks and chunks[-1].choices[-1].finish_reason in ("stop", "length")
        resp = httpx.post(
            f"{base}/v1/responses",
            json={"model": "gpt-oss", "input": "Hi there", "max_output_tokens": 6},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] in ("completed", "incomplete")
        # Harmony rendering reached the engine: the prompt ends with the assistant's start.
        assert r.usage.prompt_tokens > 10
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:
            proc.kill()
            proc.wait()
