"""`SamplingParams`: the offline API's per-request options, named as vLLM users know them.
No torch here, so `stator.SamplingParams` imports fast."""

from __future__ import annotations

from dataclasses import dataclass, field

from stator.protocols import GuidedDecoding, SamplingOptions, StopConditions


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None  # stop strings, applied to the decoded text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    # Structured output (vLLM's `structured_outputs`): JSON schema, regex, choice, grammar.
    guided_decoding: GuidedDecoding | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_wire(self) -> tuple[SamplingOptions, StopConditions]:
        if self.n != 1:
            raise ValueError("only n=1 is supported")
        sampling = SamplingOptions(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=self.logit_bias,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            guided_decoding=self.guided_decoding,
        )
        stop = StopConditions(
            max_tokens=self.max_tokens,
            min_tokens=self.min_tokens,
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
        )
        return sampling, stop
