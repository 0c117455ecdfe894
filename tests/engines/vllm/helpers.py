"""Helpers shared by the vLLM engine tests."""

from __future__ import annotations

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
