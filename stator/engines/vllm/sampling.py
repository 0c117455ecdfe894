"""Stator's sampling and stop conditions as vLLM `SamplingParams`, one field to one field.

Stop *strings* never reach vLLM: the frontend enforces them on text. Hidden stop tokens
(EOS) join vLLM's `stop_token_ids` like the visible ones; `outputs.py` hides them again.
"""

from __future__ import annotations

from typing import Any

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

from stator.engines.base import EngineError
from stator.protocols import EngineRequest, GuidedDecoding

# SamplingOptions fields copied to the SamplingParams field of the same name when set.
_SAME_NAME = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "prompt_logprobs",
)


def structured_outputs(guided: GuidedDecoding) -> StructuredOutputsParams:
    fields: dict[str, Any] = {}
    if guided.json_schema is not None:
        fields["json"] = guided.json_schema
    if guided.json_object:
        fields["json_object"] = True
    for name in ("regex", "choice", "grammar"):
        value = getattr(guided, name)
        if value is not None:
            fields[name] = value
    if not fields:
        raise EngineError(
            "guided_decoding needs one of json_schema, json_object, regex, choice, grammar"
        )
    if len(fields) > 1:
        raise EngineError(f"guided_decoding takes one constraint, got {sorted(fields)}")
    if guided.whitespace_pattern is not None:
        fields["whitespace_pattern"] = guided.whitespace_pattern
    return StructuredOutputsParams(**fields)


def max_tokens_for(request: EngineRequest, prompt_len: int, max_model_len: int) -> int:
    """The request's max_tokens, or whatever room the context leaves after the prompt."""
    if request.stop.max_tokens is not None:
        return request.stop.max_tokens
    return max(1, max_model_len - prompt_len)


def sampling_params(request: EngineRequest, prompt_len: int, max_model_len: int) -> SamplingParams:
    """vLLM's SamplingParams for `request`: token deltas, no detokenization."""
    options, stop = request.sampling, request.stop
    if options.n != 1:
        raise EngineError(f"n={options.n} is not supported: one stream per request (n=1)")
    kwargs: dict[str, Any] = {
        name: getattr(options, name) for name in _SAME_NAME if getattr(options, name) is not None
    }
    if options.logit_bias:
        kwargs["logit_bias"] = dict(options.logit_bias)
    if options.guided_decoding is not None:
        kwargs["structured_outputs"] = structured_outputs(options.guided_decoding)
    stop_ids = list(stop.stop_token_ids)
    if not stop.ignore_eos:
        stop_ids += [t for t in stop.stop_token_ids_hidden if t not in stop_ids]
    try:
        return SamplingParams(
            **kwargs,
            max_tokens=max_tokens_for(request, prompt_len, max_model_len),
            min_tokens=stop.min_tokens,
            stop_token_ids=stop_ids,
            ignore_eos=stop.ignore_eos,
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
        )
    except (
        ValueError,
        VLLMValidationError,
    ) as exc:  # vLLM validates ranges (temperature < 0, top_p > 1, ...)
        raise EngineError(f"invalid sampling parameters: {exc}") from exc
