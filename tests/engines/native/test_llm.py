"""The offline API (`stator.LLM`, `stator.SamplingParams`) and the engine's flags."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import stator
from stator.config import add_flags, from_args
from stator.engines.native.config import NativeConfig, parse_bytes
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of


def test_import_stator_does_not_import_torch():
    code = "import stator, sys; stator.SamplingParams; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture(scope="module")
def llm(llama):
    return stator.LLM(llama[0], device="cpu", kv_cache_memory="4MiB")


def test_generate_text_and_token_prompts(llm, llama):
    params = stator.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    ids = prompt(40, 12)
    outs = llm.generate(["def f(x):", {"prompt_token_ids": ids}], params)
    assert [o.prompt for o in outs] == ["def f(x):", None]
    assert outs[0].prompt_token_ids == llm.tokenizer.encode("def f(x):").ids
    for o in outs:
        c = o.outputs[0]
        assert len(c.token_ids) == 6 and c.finish_reason == "length"
        assert c.text == llm.tokenizer.decode(c.token_ids)
        assert len(c.logprobs) == 6 and c.cumulative_logprob < 0
    expected = tokens_of(run_all(core_for(llama[0]), [greedy_request("r", ids, 6)])["r"])
    assert outs[1].outputs[0].token_ids == expected


def test_per_prompt_params_and_stop_strings(llm):
    base = stator.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    full = llm.generate("import os", base)[0].outputs[0]
    stop_at = full.text[len(full.text) // 2 :][:3]
    assert stop_at
    cut = llm.generate(
        ["import os", "import os"],
        [
            base,
            stator.SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=stop_at),
        ],
    )
    assert cut[0].outputs[0].text == full.text
    stopped = cut[1].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_at
    assert stopped.text == full.text[: full.text.index(stop_at)]
    assert llm.core.blocks.num_used_blocks == 0


def test_bad_arguments(llama, llm):
    with pytest.raises(TypeError, match="unknown engine arguments"):
        stator.LLM(llama[0], not_a_flag=1)
    with pytest.raises(ValueError, match="prompts but"):
        llm.generate(["a", "b"], [stator.SamplingParams()])


def test_flags_and_sizes():
    parser = argparse.ArgumentParser()
    add_flags(parser, NativeConfig, env={"STATOR_BLOCK_SIZE": "32"})
    cfg = from_args(
        NativeConfig, parser.parse_args(["--kv-cache-memory", "2GiB", "--no-enable-prefix-caching"])
    )
    assert cfg.block_size == 32 and not cfg.enable_prefix_caching
    assert parse_bytes(cfg.kv_cache_memory) == 2 * 1024**3
    assert parse_bytes("512MB") == 512 * 10**6 and parse_bytes("4096") == 4096
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes("lots")
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "int8"])
