"""From a wire `EngineRequest` to the engine's `SamplingSpec`: defaults filled in (the
model's generation_config.json, then the OpenAI defaults), bad values rejected."""

from __future__ import annotations

from stator.engines.base import EngineError
from stator.engines.native.config import ModelSpec
from stator.engines.native.request import SamplingSpec
from stator.protocols import EngineRequest

MAX_LOGPROBS = 20


def resolve_sampling(
    request: EngineRequest, spec: ModelSpec, max_total_tokens: int
) -> SamplingSpec:
    s, stop = request.sampling, request.stop
    defaults = spec.generation_defaults
    vocab = spec.vocab_size

    def pick(value: float | int | None, key: str, fallback: float | int) -> float | int:
        if value is not None:
            return value
        return defaults.get(key, fallback)

    temperature = float(pick(s.temperature, "temperature", 1.0))
    top_p = float(pick(s.top_p, "top_p", 1.0))
    top_k = int(pick(s.top_k, "top_k", 0))
    min_p = float(pick(s.min_p, "min_p", 0.0))
    repetition = float(pick(s.repetition_penalty, "repetition_penalty", 1.0))
    _check(temperature >= 0.0, f"temperature must be >= 0, got {temperature}")
    _check(0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}")
    _check(top_k >= -1, f"top_k must be -1, 0 (off) or positive, got {top_k}")
    _check(0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}")
    _check(repetition > 0.0, f"repetition_penalty must be > 0, got {repetition}")
    for name, value in (
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ):
        _check(value is None or -2.0 <= value <= 2.0, f"{name} must be in [-2, 2], got {value}")
    for name, value in (("logprobs", s.logprobs), ("prompt_logprobs", s.prompt_logprobs)):
        _check(
            value is None or 0 <= value <= MAX_LOGPROBS,
            f"{name} must be between 0 and {MAX_LOGPROBS}, got {value}",
        )
    bias = {int(k): float(v) for k, v in (s.logit_bias or {}).items()}
    bad = [k for k in bias if not 0 <= k < vocab]
    _check(not bad, f"logit_bias names token ids outside the vocabulary (size {vocab}): {bad[:5]}")

    room = max_total_tokens - prompt_length(request)
    max_tokens = room if stop.max_tokens is None else stop.max_tokens
    _check(max_tokens >= 1, f"max_tokens must be at least 1, got {max_tokens}")
    _check(stop.min_tokens >= 0, f"min_tokens must be >= 0, got {stop.min_tokens}")

    hidden = set() if stop.ignore_eos else {*stop.stop_token_ids_hidden, *spec.eos_token_ids}
    return SamplingSpec(
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        min_p=min_p,
        seed=s.seed,
        presence_penalty=float(s.presence_penalty or 0.0),
        frequency_penalty=float(s.frequency_penalty or 0.0),
        repetition_penalty=repetition,
        logit_bias=bias,
        logprobs=s.logprobs,
        prompt_logprobs=s.prompt_logprobs,
        max_tokens=max_tokens,
        min_tokens=stop.min_tokens,
        # Ids outside the vocabulary can never be sampled; dropping them keeps masks valid.
        stop_token_ids=frozenset(t for t in stop.stop_token_ids if 0 <= t < vocab),
        hidden_stop_token_ids=frozenset(t for t in hidden if 0 <= t < vocab),
    )


def validate_request(request: EngineRequest, spec: ModelSpec, max_total_tokens: int) -> None:
    """Checks of a token-id prompt; prompt embeddings are checked where they are decoded
    (`EngineCore.add_request`), LoRA adapters where they are looked up."""
    _check(request.sampling.n == 1, "the native engine samples one sequence per request (n=1)")
    if request.prompt_embeds is not None:
        _check(
            request.sampling.prompt_logprobs is None,
            "prompt_logprobs cannot be given with prompt_embeds (the prompt has no token ids)",
        )
        return
    _check(bool(request.token_ids), "the prompt is empty")
    n = len(request.token_ids)
    _check(
        n < max_total_tokens,
        f"the prompt has {n} tokens; this model's context is {max_total_tokens} tokens",
    )
    bad = [t for t in request.token_ids if not 0 <= t < spec.vocab_size]
    _check(not bad, f"prompt token ids outside the vocabulary (size {spec.vocab_size}): {bad[:5]}")


def prompt_length(request: EngineRequest) -> int:
    shape = request.prompt_embeds_shape
    if request.prompt_embeds is not None and shape:
        return int(shape[0])
    return len(request.token_ids)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise EngineError(message)
