"""A choice's outputs through vLLM's classes: `VllmOutput` detokenizes with vLLM's
`IncrementalDetokenizer` (which also cuts at stop strings), `VllmChoiceParser` splits
reasoning, content and tool calls with vLLM's `Parser`: `parse_delta` per delta when the
request streams, `parse` of the whole output at the finish when it does not, as vLLM's
chat server does."""

from __future__ import annotations

import types
from typing import Any

from stator.llm.postprocess import Delta, LogprobEntry, TopLogprobEntry
from stator.parsers import ParsedDelta, ToolCallDelta
from stator.protocols import EngineOutput, FinishReason, TokenLogprob


class VllmOutput:
    def __init__(
        self,
        tokenizer: Any,
        params: Any,
        prompt_token_ids: list[int],
        request_id: str,
        request_stop_token_ids: list[int],
    ) -> None:
        from vllm.v1.engine.detokenizer import IncrementalDetokenizer

        # The detokenizer reads only these three of vLLM's EngineCoreRequest.
        view = types.SimpleNamespace(
            request_id=request_id, prompt_token_ids=prompt_token_ids, sampling_params=params
        )
        self._detok = IncrementalDetokenizer.from_new_request(tokenizer, view)
        self._tokenizer = tokenizer
        self._request_stops = frozenset(request_stop_token_ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: FinishReason | None = None

    def process(self, output: EngineOutput) -> Delta:
        if self.finish_reason is not None:
            return Delta("", [])
        ids = output.token_ids
        finish = output.finish_reason
        stop_token = output.stop_token_id if finish == "stop" else None
        if stop_token is not None and (not ids or ids[-1] != stop_token):
            # An engine that hides EOS did not send it; vLLM's outputs carry it.
            ids = [*ids, stop_token]
        self.completion_tokens += len(ids)
        if output.usage is not None and output.usage.completion_tokens > self.completion_tokens:
            self.completion_tokens = output.usage.completion_tokens
        if output.cached_tokens is not None:
            self.cached_tokens = output.cached_tokens
        stop_string = self._detok.update(ids, stop_token is not None)
        stop_reason: str | int | None = None
        if stop_string is not None:
            finish, stop_reason = "stop", stop_string
        elif stop_token is not None and stop_token in self._request_stops:
            stop_reason = stop_token  # a requested stop token; EOS reports None, as vLLM
        text = self._detok.get_next_output_text(finish is not None, True)
        logprobs = self._logprobs(output.logprobs) if output.logprobs else None
        if finish is not None:
            self.finish_reason = finish
        error = output.error if finish == "error" else None
        return Delta(text, ids, logprobs, finish, stop_reason, error)

    def _logprobs(self, entries: list[TokenLogprob]) -> list[LogprobEntry]:
        from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

        def text(token_id: int) -> tuple[str, list[int]]:
            (token,) = convert_ids_list_to_tokens(self._tokenizer, [token_id])
            return token, list(token.encode("utf-8", errors="replace"))

        out = []
        for entry in entries:
            token, raw = text(entry.token_id)
            top = [TopLogprobEntry(a.token_id, *text(a.token_id), a.logprob) for a in entry.top]
            out.append(LogprobEntry(entry.token_id, token, raw, entry.logprob, top))
        return out


def _call_deltas(calls: list[Any]) -> list[ToolCallDelta]:
    out = []
    for call in calls or ():
        function = call.function
        out.append(
            ToolCallDelta(
                index=call.index,
                id=call.id,
                name=function.name if function is not None else None,
                arguments_fragment=(function.arguments or "") if function is not None else "",
            )
        )
    return out


class VllmChoiceParser:
    """`request`: vLLM's own request model of this request (its parsers read the tools
    and tool choice off it)."""

    def __init__(
        self, parser: Any, request: Any, prompt_token_ids: list[int], stream: bool, auto: bool
    ) -> None:
        self._parser = parser
        self._request = request
        self._prompt_ids = prompt_token_ids
        self._stream = stream
        self._auto = auto
        self._text: list[str] = []
        self._ids: list[int] = []
        if not stream:
            parser.set_prompt_token_ids(prompt_token_ids)

    def feed(self, delta: Delta) -> ParsedDelta:
        if not self._stream:
            self._text.append(delta.text)
            self._ids += delta.token_ids
            return ParsedDelta()
        message = self._parser.parse_delta(
            delta_text=delta.text,
            delta_token_ids=list(delta.token_ids),
            request=self._request,
            prompt_token_ids=self._prompt_ids,
            finished=delta.finish_reason is not None,
        )
        if message is None:
            return ParsedDelta()
        return ParsedDelta(
            message.reasoning or "", message.content or "", _call_deltas(message.tool_calls)
        )

    def finish(self) -> ParsedDelta:
        if self._stream:
            return ParsedDelta()
        from vllm.renderers.chat_utils import make_tool_call_id

        reasoning, content, calls = self._parser.parse(
            "".join(self._text),
            self._request,
            enable_auto_tools=self._auto,
            model_output_token_ids=self._ids,
        )
        return ParsedDelta(
            reasoning or "",
            content or "",
            [
                ToolCallDelta(
                    index=i,
                    id=getattr(call, "id", None) or make_tool_call_id(),
                    name=call.name,
                    arguments_fragment=call.arguments,
                )
                for i, call in enumerate(calls or ())
            ],
        )
