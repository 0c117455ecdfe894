"""Pure mappings of the vLLM engine (no engine started): sampling in, outputs out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from vllm.sampling_params import RequestOutputKind

from stator.engines.base import EngineError
from stator.engines.vllm.lora import local_adapter_dir, lora_id
from stator.engines.vllm.outputs import OutputConverter
from stator.engines.vllm.sampling import sampling_params
from stator.protocols import EngineRequest, GuidedDecoding, SamplingOptions, StopConditions


def request(**kw) -> EngineRequest:
    sampling = kw.pop("sampling", SamplingOptions())
    stop = kw.pop("stop", StopConditions())
    return EngineRequest(
        request_id="r", model="m", token_ids=[1, 2, 3], sampling=sampling, stop=stop, **kw
    )


def test_sampling_fields_map_one_to_one():
    options = SamplingOptions(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        repetition_penalty=1.1,
        logit_bias={5: -2.0},
        logprobs=3,
        prompt_logprobs=1,
    )
    stop = StopConditions(
        max_tokens=9, min_tokens=2, stop_token_ids=[11], stop_token_ids_hidden=[4]
    )
    params = sampling_params(request(sampling=options, stop=stop), 3, 100)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.5, 0.9, 40, 0.05)
    assert (params.seed, params.presence_penalty, params.frequency_penalty) == (7, 0.1, 0.2)
    assert params.repetition_penalty == 1.1 and params.logit_bias == {5: -2.0}
    assert (params.logprobs, params.prompt_logprobs) == (3, 1)
    assert (params.max_tokens, params.min_tokens) == (9, 2)
    assert params.stop_token_ids == [11, 4]
    assert params.detokenize is False and params.output_kind == RequestOutputKind.DELTA


def test_missing_max_tokens_fills_the_context_and_ignore_eos_drops_hidden_stops():
    params = sampling_params(
        request(stop=StopConditions(stop_token_ids_hidden=[4], ignore_eos=True)), 30, 100
    )
    assert params.max_tokens == 70
    assert params.stop_token_ids == [] and params.ignore_eos


@pytest.mark.parametrize(
    ("guided", "field", "value"),
    [
        (GuidedDecoding(json_schema={"type": "object"}), "json", {"type": "object"}),
        (GuidedDecoding(regex="[ab]+"), "regex", "[ab]+"),
        (GuidedDecoding(choice=["x", "y"]), "choice", ["x", "y"]),
        (GuidedDecoding(json_object=True), "json_object", True),
        (GuidedDecoding(grammar="root ::= 'a'"), "grammar", "root ::= 'a'"),
    ],
)
def test_guided_decoding_becomes_structured_outputs(guided, field, value):
    params = sampling_params(request(sampling=SamplingOptions(guided_decoding=guided)), 3, 100)
    assert getattr(params.structured_outputs, field) == value


def test_invalid_sampling_is_an_engine_error():
    with pytest.raises(EngineError, match="one constraint"):
        sampling_params(
            request(
                sampling=SamplingOptions(guided_decoding=GuidedDecoding(regex="a", choice=["a"]))
            ),
            3,
            100,
        )
    with pytest.raises(EngineError, match="needs one of"):
        sampling_params(request(sampling=SamplingOptions(guided_decoding=GuidedDecoding())), 3, 100)
    with pytest.raises(EngineError, match="temperature"):
        sampling_params(request(sampling=SamplingOptions(temperature=-1.0)), 3, 100)


def lp(logprob: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank)


def ro(token_ids, finish=None, stop_reason=None, logprobs=None, cached=0, prompt_logprobs=None):
    completion = SimpleNamespace(
        token_ids=token_ids, finish_reason=finish, stop_reason=stop_reason, logprobs=logprobs
    )
    return SimpleNamespace(
        outputs=[completion], num_cached_tokens=cached, prompt_logprobs=prompt_logprobs
    )


def test_eos_is_hidden_visible_stop_kept_and_usage_counted():
    conv = OutputConverter([1, 2], 2, logprobs=1, prompt_logprobs=None, hidden_stop_ids={9})
    first = conv.convert(ro([5], logprobs=[{5: lp(-0.1, 1), 6: lp(-2.0, 2)}], cached=16))
    assert first.cached_tokens == 16 and first.token_ids == [5]
    assert first.logprobs[0].token_id == 5 and [t.token_id for t in first.logprobs[0].top] == [5]
    last = conv.convert(
        ro([7, 9], finish="stop", stop_reason=None, logprobs=[{7: lp(-1.0, 1)}, {9: lp(-0.5, 1)}])
    )
    assert last.token_ids == [7] and last.stop_token_id == 9 and last.finish_reason == "stop"
    assert [e.token_id for e in last.logprobs] == [7]
    assert last.usage.completion_tokens == 3 and last.usage.cached_tokens == 16
    assert last.usage.prompt_tokens == 2

    visible = OutputConverter([1], 1, logprobs=None, prompt_logprobs=None, hidden_stop_ids=set())
    out = visible.convert(ro([3, 11], finish="stop", stop_reason=11))
    assert out.token_ids == [3, 11] and out.stop_token_id == 11


def test_chosen_token_outside_top_k_keeps_its_logprob():
    conv = OutputConverter([1], 1, logprobs=1, prompt_logprobs=None, hidden_stop_ids=set())
    out = conv.convert(ro([8], logprobs=[{3: lp(-0.2, 1), 8: lp(-3.0, 4)}]))
    (entry,) = out.logprobs
    assert entry.token_id == 8 and entry.logprob == -3.0
    assert [t.token_id for t in entry.top] == [3]


def test_lora_ids_and_sources(tmp_path):
    assert lora_id("a") == lora_id("a") != lora_id("b") and lora_id("a") > 0
    (tmp_path / "adapter_config.json").write_text("{}")
    assert local_adapter_dir(f"file://{tmp_path}") == tmp_path.resolve()
    assert local_adapter_dir(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(EngineError, match="PEFT"):
        local_adapter_dir(str(tmp_path / "missing"))
