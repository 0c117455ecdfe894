"""Helpers shared by the vLLM engine tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from stator.protocols import EngineOutput, EngineRequest, SamplingOptions, StopConditions

# Engine arguments for fast, small test engines.
TEST_ENGINE_ARGS = {"enforce_eager": True, "max_model_len": 1024, "dtype": "float32"}


def greedy_request(
    request_id: str, token_ids: list[int], max_tokens: int = 8, **sampling
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        model="tiny",
        token_ids=token_ids,
        sampling=SamplingOptions(temperature=0.0, **sampling),
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
    )


async def collect(stream) -> list[EngineOutput]:
    return [out async for out in stream]


def tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


OFFLINE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import EmbedsPrompt, TokensPrompt

    def main():
        model, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
        embeds = any(isinstance(p, str) for p in prompts)
        llm = LLM(model=model, enforce_eager=True, max_model_len=1024, dtype=sys.argv[4],
                  enable_prefix_caching=False, enable_prompt_embeds=embeds)
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        inputs = [
            EmbedsPrompt(prompt_embeds=torch.load(p, weights_only=True)) if isinstance(p, str)
            else TokensPrompt(prompt_token_ids=p)
            for p in prompts
        ]
        out = llm.generate(inputs, params)
        print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in out]), flush=True)

    if __name__ == "__main__":
        main()
    """
)


def offline_greedy_many(
    model_dir: Path,
    prompts: list[list[int] | Path],
    max_tokens: int,
    tmp_path: Path,
    dtype: str = "float32",
) -> list[list[int]]:
    """vLLM's own offline `LLM.generate`, in a child process (vLLM's spawn wants a main).
    A prompt is token ids, or the path of a `torch.save`d embeddings tensor."""
    script = tmp_path / "offline_generate.py"
    script.write_text(OFFLINE_SCRIPT)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    wire = [str(p) if isinstance(p, Path) else p for p in prompts]
    proc = subprocess.run(
        [sys.executable, str(script), str(model_dir), json.dumps(wire), str(max_tokens), dtype],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise AssertionError(f"offline vLLM failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def offline_greedy(
    model_dir: Path, prompt: list[int], max_tokens: int, tmp_path: Path, dtype: str = "float32"
) -> list[int]:
    return offline_greedy_many(model_dir, [prompt], max_tokens, tmp_path, dtype)[0]
