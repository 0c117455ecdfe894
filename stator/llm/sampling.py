"""Map an OpenAI request body (chat or completions) to the engine's `SamplingOptions` and
`StopConditions`, plus the stop strings the postprocessor enforces.

Ranges follow OpenAI's API where it sets one and vLLM's extensions elsewhere (top_k, min_p,
repetition_penalty, min_tokens, ignore_eos, stop_token_ids, guided_*). A field the request
omits (or sends as null) takes the model's `generation_config.json` value, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from stator.llm.guided import guided_decoding
from stator.llm.stop_strings import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from stator.llm.validate import InvalidParam, as_bool, as_int, as_number, present
from stator.protocols import SamplingOptions, StopConditions

# generation_config.json keys applied as defaults (the HF name where it differs).
_GENERATION_DEFAULTS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
MAX_N = 128
_SEED_RANGE = (-(2**63), 2**64 - 1)

Api = Literal["chat", "completions"]


class SamplingPlan(NamedTuple):
    sampling: SamplingOptions
    stop: StopConditions
    stop_strings: list[str]


def build_sampling(
    body: Mapping[str, Any],
    *,
    generation_config: Mapping[str, Any] | None = None,
    eos_token_ids: Sequence[int] = (),
    vocab_size: int | None = None,
    prompt_tokens: int | None = None,
    context_length: int | None = None,
    api: Api | None = None,
) -> SamplingPlan:
    """Validate and map `body`. Raises `InvalidParam(message, param)` on bad input.

    With `prompt_tokens` and `context_length`, max_tokens defaults to what is left of the
    context and a request that does not fit is refused; without them that is left to the
    caller (max_tokens stays as requested, or None)."""
    if api is None:
        api = "chat" if "messages" in body else "completions"
    defaults = {k: v for k, v in (generation_config or {}).items() if v is not None}

    def pick(name: str) -> Any:
        value = body.get(name)
        return value if value is not None else defaults.get(name)

    temperature = as_number(pick("temperature"), "temperature", low=0.0)
    top_p = as_number(pick("top_p"), "top_p", low=0.0, high=1.0, low_open=True)
    top_k = as_int(pick("top_k"), "top_k", low=-1)
    if top_k is not None and top_k <= 0:
        top_k = None  # -1 and 0 both mean "no top-k" (vLLM)
    min_p = as_number(pick("min_p"), "min_p", low=0.0, high=1.0)
    presence = as_number(pick("presence_penalty"), "presence_penalty", low=-2.0, high=2.0)
    frequency = as_number(pick("frequency_penalty"), "frequency_penalty", low=-2.0, high=2.0)
    repetition = as_number(pick("repetition_penalty"), "repetition_penalty", low=0.0, low_open=True)
    seed = as_int(body.get("seed"), "seed", low=_SEED_RANGE[0], high=_SEED_RANGE[1])
    n = as_int(body.get("n"), "n", low=1, high=MAX_N)

    sampling = SamplingOptions(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
        logit_bias=_logit_bias(body.get("logit_bias"), vocab_size),
        logprobs=_logprobs(body, api),
        prompt_logprobs=as_int(body.get("prompt_logprobs"), "prompt_logprobs", low=0, high=20),
        n=1 if n is None else n,
        guided_decoding=guided_decoding(body),
    )

    max_tokens = _max_tokens(body, defaults, prompt_tokens, context_length)
    min_tokens = as_int(body.get("min_tokens"), "min_tokens", low=0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise InvalidParam(
            f"min_tokens ({min_tokens}) must be at most max_tokens ({max_tokens}).", "min_tokens"
        )
    stop = StopConditions(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_token_ids=_token_ids(body.get("stop_token_ids"), "stop_token_ids", vocab_size),
        stop_token_ids_hidden=list(dict.fromkeys(eos_token_ids)),
        ignore_eos=as_bool(body.get("ignore_eos"), "ignore_eos") or False,
    )
    return SamplingPlan(sampling, stop, _stop_strings(body.get("stop")))


def _max_tokens(
    body: Mapping[str, Any],
    defaults: Mapping[str, Any],
    prompt_tokens: int | None,
    context_length: int | None,
) -> int | None:
    # max_completion_tokens is the newer name; when both are sent it wins (vLLM).
    param = "max_completion_tokens" if present(body, "max_completion_tokens") else "max_tokens"
    requested = as_int(body.get(param), param, low=1)
    if prompt_tokens is None or context_length is None:
        return requested
    room = context_length - prompt_tokens
    if requested is None:
        if room <= 0:
            raise InvalidParam(
                f"This model's maximum context length is {context_length} tokens, but the "
                f"prompt has {prompt_tokens} tokens, which leaves no room for a completion. "
                "Please shorten the prompt.",
                "messages" if "messages" in body else "prompt",
            )
        default = defaults.get("max_new_tokens")
        if isinstance(default, int) and not isinstance(default, bool) and default > 0:
            return min(default, room)
        return room
    if requested > room:
        raise InvalidParam(
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, "
            f"{requested} for the completion). Please reduce the prompt or {param}.",
            param,
        )
    return requested


def _logprobs(body: Mapping[str, Any], api: Api) -> int | None:
    value = body.get("logprobs")
    top = body.get("top_logprobs")
    if api == "chat":
        wanted = as_bool(value, "logprobs") or False
        top_n = as_int(top, "top_logprobs", low=0, high=MAX_CHAT_TOP_LOGPROBS)
        if top_n is not None and top_n > 0 and not wanted:
            raise InvalidParam("top_logprobs requires logprobs to be true.", "top_logprobs")
        return (top_n or 0) if wanted else None
    return as_int(value, "logprobs", low=0, high=MAX_COMPLETION_LOGPROBS)


def _logit_bias(value: Any, vocab_size: int | None) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidParam("logit_bias must be an object of token id to bias.", "logit_bias")
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            raise InvalidParam(
                f"logit_bias keys must be token ids; got {key!r}.", "logit_bias"
            ) from None
        _check_token_id(token_id, vocab_size, "logit_bias")
        out[token_id] = as_number(bias, "logit_bias", low=-100.0, high=100.0)  # type: ignore[assignment]
    return out or None


def _token_ids(value: Any, param: str, vocab_size: int | None) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidParam(f"{param} must be a list of token ids.", param)
    ids = [as_int(v, param) for v in value]
    for token_id in ids:
        _check_token_id(token_id, vocab_size, param)  # type: ignore[arg-type]
    return list(dict.fromkeys(ids))  # type: ignore[arg-type]


def _check_token_id(token_id: int, vocab_size: int | None, param: str) -> None:
    if token_id < 0 or (vocab_size is not None and token_id >= vocab_size):
        upper = f"0..{vocab_size - 1}" if vocab_size is not None else "non-negative"
        raise InvalidParam(
            f"Token id {token_id} in {param} is out of the vocabulary ({upper}).", param
        )


def _stop_strings(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidParam("stop must be a string or a list of strings.", "stop")
    if any(s == "" for s in stops):
        raise InvalidParam("stop strings must not be empty.", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidParam(f"At most {MAX_STOP_STRINGS} stop strings are allowed.", "stop")
    if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
        raise InvalidParam(
            f"A stop string may have at most {MAX_STOP_STRING_CHARS} characters.", "stop"
        )
    return list(dict.fromkeys(stops))


__all__ = ["InvalidParam", "SamplingPlan", "build_sampling"]
