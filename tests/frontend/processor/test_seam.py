"""The processor seam without vLLM: choosing a processor (flag, env twin, a clear stop
where vLLM is missing), `n` fanned out, and vLLM's sampling fields mapped onto stator's
(on stand-ins for vLLM's `SamplingParams`: the mapping reads attributes only)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import types

import pytest

from stator.config import add_flags, from_args
from stator.frontend.config import FrontendConfig
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.processor import create_processor
from stator.frontend.processor.choices import fan_out
from stator.frontend.processor.vllm.processor import vllm_seed
from stator.frontend.processor.vllm.sampling import Unsupported, map_sampling
from stator.protocols import EngineRequest, GuidedDecoding, ModelCard, SamplingOptions
from tests.procs import repo_env


def test_processor_flag_and_env_twin():
    parser = argparse.ArgumentParser()
    add_flags(parser, FrontendConfig, env={"STATOR_PROCESSOR": "vllm"})
    assert from_args(FrontendConfig, parser.parse_args([])).processor == "vllm"
    assert from_args(FrontendConfig, parser.parse_args(["--processor", "stator"])).processor == (
        "stator"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--processor", "sglang"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
@pytest.mark.parametrize("command", ["frontend", "run"])
def test_vllm_processor_without_vllm_stops_at_start_naming_the_extra(command):
    done = subprocess.run(
        [sys.executable, "-m", "stator.cli.main", command, "--processor", "vllm"],
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "pip install 'stator[vllm]'" in done.stderr


def test_unknown_processor_is_refused():
    card = ModelCard(name="m", source_path="")
    with pytest.raises(ValueError, match="unknown processor"):
        asyncio.run(create_processor("sglang", card, FrontendMetrics()))


def test_fan_out_numbers_choices_and_seeds_them():
    request = EngineRequest(request_id="r", model="m", sampling=SamplingOptions(seed=7, n=3))
    ours = fan_out(request, "r", 1, 3)
    assert [r.request_id for r in ours] == ["r-3", "r-4", "r-5"]
    assert ours[0].sampling.seed == 7 and len({r.sampling.seed for r in ours}) == 3
    assert all(r.sampling.n == 1 for r in ours)
    theirs = fan_out(request, "r", 0, 3, vllm_seed)
    assert [r.request_id for r in theirs] == ["r", "r-1", "r-2"]
    assert [r.sampling.seed for r in theirs] == [7, 8, 9]  # vLLM's parallel sampling
    single = EngineRequest(request_id="r", model="m")
    assert fan_out(single, "r", 0, 1) == [single]


def params(**changes):
    """A stand-in for vLLM's SamplingParams as `to_sampling_params` fills it."""
    fields = dict(
        n=1, temperature=0.7, top_p=1.0, top_k=0, min_p=0.0, seed=None,
        presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, logit_bias=None,
        logprobs=None, prompt_logprobs=None, stop=[], stop_token_ids=[], ignore_eos=False,
        max_tokens=16, min_tokens=0, structured_outputs=None, bad_words=[],
        allowed_token_ids=None, thinking_token_budget=None, watermarking=None,
        logprob_token_ids=None, repetition_detection=None, extra_args=None,
    )  # fmt: skip
    return types.SimpleNamespace(**{**fields, **changes})


def test_sampling_maps_onto_stator_with_eos_as_visible_stops():
    sampling, stop = map_sampling(
        params(top_k=5, seed=3, logprobs=2, logit_bias={"11": 1.5}, stop_token_ids=[9]), [2, 4]
    )
    assert (sampling.top_k, sampling.seed, sampling.logprobs) == (5, 3, 2)
    assert sampling.logit_bias == {11: 1.5}
    # vLLM's outputs carry their stop token (its parsers read it): all stops are visible.
    assert stop.stop_token_ids == [9, 2, 4] and stop.stop_token_ids_hidden == []
    assert stop.max_tokens == 16
    _, ignoring = map_sampling(params(ignore_eos=True, stop_token_ids=[9]), [2])
    assert ignoring.stop_token_ids == [9] and ignoring.ignore_eos
    assert map_sampling(params(top_k=-1), [2])[0].top_k is None


def test_structured_output_maps_and_structural_tag_is_refused():
    spec = types.SimpleNamespace(
        json='{"type": "object"}', regex=None, choice=None, grammar=None, json_object=False,
        whitespace_pattern=None, structural_tag=None,
    )  # fmt: skip
    sampling, _ = map_sampling(params(structured_outputs=spec), [2])
    assert sampling.guided_decoding == GuidedDecoding(json_schema={"type": "object"})
    spec.structural_tag = '{"structures": []}'
    with pytest.raises(Unsupported) as refused:
        map_sampling(params(structured_outputs=spec), [2])
    assert refused.value.param == "structural_tag"


@pytest.mark.parametrize(
    "field, value",
    [
        ("bad_words", ["no"]),
        ("allowed_token_ids", [1, 2]),
        ("thinking_token_budget", 10),
        ("prompt_logprobs", 1),
        ("logprob_token_ids", [3]),
    ],
)
def test_what_no_engine_here_can_honour_is_refused_by_name(field, value):
    with pytest.raises(Unsupported) as refused:
        map_sampling(params(**{field: value}), [2])
    assert refused.value.param == field
    with pytest.raises(Unsupported, match="vllm_xargs"):
        map_sampling(params(extra_args={"x": 1}), [2])
