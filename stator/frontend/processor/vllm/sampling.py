"""vLLM's `SamplingParams` (as its server builds them from a request) into stator's
`SamplingOptions` and `StopConditions`.

Everything stator's engines enforce maps across. Stop strings, `skip_special_tokens`,
`spaces_between_special_tokens` and `include_stop_str_in_output` stay in the frontend:
vLLM's detokenizer applies them (`outputs.py`). What no stator engine can do is refused
with a 400 naming the field, never dropped.

EOS and the request's stop token ids are all *visible* stop tokens here: vLLM's outputs
carry the stop token in their token ids (its parsers, Harmony's above all, read it), and
its detokenizer leaves the token out of the text.
"""

from __future__ import annotations

import json
from typing import Any

from stator.protocols import GuidedDecoding, SamplingOptions, StopConditions


class Unsupported(ValueError):
    """A vLLM sampling field that stator's engines cannot honour."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# SamplingParams fields the engines behind stator cannot honour: (field, default).
_REFUSED = (
    ("bad_words", None),
    ("allowed_token_ids", None),
    ("thinking_token_budget", None),
    ("watermarking", None),
    ("prompt_logprobs", None),
    ("logprob_token_ids", None),
    ("repetition_detection", None),
)


def _refuse_unsupported(params: Any) -> None:
    for name, default in _REFUSED:
        value = getattr(params, name, default)
        if value is not default and value != default and value not in ([], {}):
            raise Unsupported(
                f"{name} is not supported by this frontend's engines (--processor vllm).",
                param=name,
            )
    if params.extra_args:
        names = ", ".join(sorted(params.extra_args))
        raise Unsupported(f"vllm_xargs ({names}) are not supported here.", param="vllm_xargs")


def guided_decoding(params: Any) -> GuidedDecoding | None:
    spec = params.structured_outputs
    if spec is None:
        return None
    if spec.structural_tag is not None:
        raise Unsupported("structural_tag is not supported here.", param="structural_tag")
    schema = spec.json
    if isinstance(schema, str):
        schema = json.loads(schema)
    guided = GuidedDecoding(
        json_schema=schema,
        json_object=bool(spec.json_object),
        regex=spec.regex,
        choice=list(spec.choice) if spec.choice else None,
        grammar=spec.grammar,
        whitespace_pattern=spec.whitespace_pattern,
    )
    return None if guided == GuidedDecoding() else guided


def map_sampling(params: Any, eos_token_ids: list[int]) -> tuple[SamplingOptions, StopConditions]:
    """(sampling, stop) of one choice (`n` is fanned out by the caller: `n=1` here)."""
    _refuse_unsupported(params)
    top_k = params.top_k
    sampling = SamplingOptions(
        temperature=params.temperature,
        top_p=params.top_p,
        # vLLM's 0 (and -1) mean "all tokens".
        top_k=top_k if top_k and top_k > 0 else None,
        min_p=params.min_p or None,
        seed=params.seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        logit_bias={int(k): float(v) for k, v in params.logit_bias.items()}
        if params.logit_bias
        else None,
        logprobs=params.logprobs,
        n=1,
        guided_decoding=guided_decoding(params),
    )
    request_stops = list(params.stop_token_ids or ())
    stops = request_stops if params.ignore_eos else [*request_stops, *eos_token_ids]
    stop = StopConditions(
        max_tokens=params.max_tokens,
        min_tokens=params.min_tokens,
        stop_token_ids=list(dict.fromkeys(stops)),
        stop_token_ids_hidden=[],
        ignore_eos=params.ignore_eos,
    )
    return sampling, stop
