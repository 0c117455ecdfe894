"""The offline API, as vLLM users know it:

    from stator import LLM, SamplingParams
    llm = LLM("path/to/model", dtype="float32")
    for out in llm.generate(["Hello"], SamplingParams(max_tokens=32)):
        print(out.outputs[0].text)

It drives the synchronous engine core in the calling thread until every prompt finishes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.sampling_params import SamplingParams
from stator.protocols import EngineRequest, TokenLogprob

PromptInput = str | list[int] | dict[str, Any]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: list[TokenLogprob | None] | None = None
    num_cached_tokens: int = 0
    finished: bool = True


@dataclass
class _Pending:
    index: int
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    result: RequestOutput | None = None
    cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None


class LLM:
    def __init__(self, model: str | Path, **engine_args: Any) -> None:
        names = {f.name for f in dataclasses.fields(NativeConfig)}
        unknown = sorted(set(engine_args) - names)
        if unknown:
            raise TypeError(f"unknown engine arguments {unknown}; known: {sorted(names)}")
        model_dir = Path(model)
        if not model_dir.is_dir():
            raise ValueError(f"{model} is not a model directory")
        self.core = EngineCore(NativeConfig(**engine_args), model_dir)
        tokenizer_file = model_dir / "tokenizer.json"
        self.tokenizer = (
            Tokenizer.from_file(str(tokenizer_file)) if tokenizer_file.is_file() else None
        )
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel ranks, if any (they also exit with this process)."""
        self.core.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        items = self._normalize(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(items)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(items):
            raise ValueError(f"{len(items)} prompts but {len(params)} sampling params")
        pending: dict[str, _Pending] = {}
        try:
            for i, ((text, ids), sp) in enumerate(zip(items, params, strict=True)):
                rid = f"llm-{next(self._ids)}"
                if sp.stop_strings() and self.tokenizer is None:
                    raise ValueError("stop strings need a tokenizer.json in the model directory")
                sampling, stop = sp.to_wire()
                self.core.add_request(
                    EngineRequest(
                        request_id=rid, model="", token_ids=ids, sampling=sampling, stop=stop
                    )
                )
                pending[rid] = _Pending(i, text, ids, sp)
            while self.core.has_work():
                for rid, out in self.core.step():
                    p = pending[rid]
                    if out.cached_tokens is not None:
                        p.cached_tokens = out.cached_tokens
                    if out.prompt_logprobs is not None:
                        p.prompt_logprobs = out.prompt_logprobs
                    p.token_ids.extend(out.token_ids)
                    p.logprobs.extend(out.logprobs or [])
                    stop_text = self._stop_string_hit(p)
                    if stop_text is not None:
                        self.core.abort(rid)
                        p.result = self._finish(rid, p, "stop", stop_text)
                    elif out.finish_reason is not None:
                        p.result = self._finish(rid, p, out.finish_reason, out.stop_token_id)
        finally:
            for rid, p in pending.items():
                if p.result is None:
                    self.core.abort(rid)
        results = sorted(pending.values(), key=lambda p: p.index)
        return [p.result for p in results if p.result is not None]

    def _normalize(
        self, prompts: PromptInput | Sequence[PromptInput]
    ) -> list[tuple[str | None, list[int]]]:
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        out: list[tuple[str | None, list[int]]] = []
        for prompt in prompts:  # type: ignore[union-attr]
            if isinstance(prompt, dict):
                if "prompt_token_ids" in prompt:
                    out.append((prompt.get("prompt"), list(prompt["prompt_token_ids"])))
                    continue
                prompt = prompt["prompt"]
            if isinstance(prompt, str):
                out.append((prompt, self._encode(prompt)))
            else:
                out.append((None, list(prompt)))
        return out

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("text prompts need a tokenizer.json in the model directory")
        return self.tokenizer.encode(text).ids

    def _decode(self, ids: list[int], params: SamplingParams) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)

    def _stop_string_hit(self, p: _Pending) -> str | None:
        text = self._decode(p.token_ids, p.params) if p.params.stop_strings() else ""
        for stop in p.params.stop_strings():
            if stop and stop in text:
                return stop
        return None

    def _finish(
        self, rid: str, p: _Pending, reason: str, stop_reason: int | str | None
    ) -> RequestOutput:
        text = self._decode(p.token_ids, p.params)
        if isinstance(stop_reason, str):
            text = text[: text.index(stop_reason)]
        logprobs = p.logprobs if p.params.logprobs is not None else None
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=list(p.token_ids),
            finish_reason=reason,
            stop_reason=stop_reason,
            logprobs=logprobs,
            cumulative_logprob=sum(lp.logprob for lp in logprobs) if logprobs else None,
        )
        return RequestOutput(
            request_id=rid,
            prompt=p.prompt,
            prompt_token_ids=p.prompt_ids,
            outputs=[completion],
            prompt_logprobs=p.prompt_logprobs,
            num_cached_tokens=p.cached_tokens,
        )
