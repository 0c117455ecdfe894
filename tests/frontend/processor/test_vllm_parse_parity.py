"""Parity: recorded model outputs (`corpus.HERMES_OUTPUTS`, `corpus.HARMONY_OUTPUTS`) run
through stator's processor and vLLM's, token by token as an engine sends them, give the
same reasoning, content and tool calls, streamed and not. Each processor gets the engine
outputs its own stop conditions ask for (stator's engines hide EOS; the stop tokens
vLLM's processor asks for come back in the token ids). Runs where vLLM is installed."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (run .ci/vllm.sh)")

from stator.frontend.openai.requests import ChatCompletionRequest
from stator.frontend.processor import ChoicePlan, Processor
from stator.llm import Tokenizer
from stator.parsers import ParsedDelta
from stator.parsers.calls import assemble_calls
from stator.protocols import EngineOutput
from tests.frontend.processor.corpus import (
    HARMONY_OUTPUTS,
    HERMES_DIFFERENT,
    HERMES_OUTPUTS,
)


def engine_outputs(plan: ChoicePlan, script: list[int]) -> list[EngineOutput]:
    """What an engine sends for `script` under the plan's stop conditions: one token per
    output; the last token ends the choice (hidden: not sent, visible: sent)."""
    stop = plan.request.stop
    outputs = [EngineOutput(token_ids=[t]) for t in script[:-1]]
    last = script[-1]
    if last in stop.stop_token_ids_hidden:
        outputs.append(EngineOutput(token_ids=[], finish_reason="stop", stop_token_id=last))
    else:
        assert last in stop.stop_token_ids, "the script must end on a stop token"
        outputs.append(EngineOutput(token_ids=[last], finish_reason="stop", stop_token_id=last))
    return outputs


def run_choice(plan: ChoicePlan, script: list[int]) -> tuple[str, str, list, str]:
    """(reasoning, content, [(name, arguments)], finish reason) as the chat route reads
    them (`ChoiceStream` skips empty deltas, `parse_delta` feeds and finishes)."""
    parsed = ParsedDelta()
    finish = None
    for output in engine_outputs(plan, script):
        delta = plan.output.process(output)
        if not (delta.text or delta.finish_reason or (plan.keep_token_deltas and delta.token_ids)):
            continue
        if plan.parser is None:
            parsed = parsed + ParsedDelta(content=delta.text)
        else:
            parsed = parsed + plan.parser.feed(delta)
            if delta.finish_reason is not None:
                parsed = parsed + plan.parser.finish()
        finish = delta.finish_reason or finish
    calls = [(c.name, json.loads(c.arguments_json)) for c in assemble_calls(parsed.calls)]
    return parsed.reasoning, parsed.content, calls, finish


def compare(
    processors: tuple[Processor, Processor],
    tokenizer: Tokenizer,
    outputs,
    script_end: list[int],
    known_different: dict[str, str],
) -> None:
    """Every output parses alike, except exactly those in `known_different` (a new
    difference fails, and so does a listed one that went away: update the list and
    docs/vllm.md)."""
    stator, vllm = processors
    differ = []
    different = set()
    for name, text, tools in outputs:
        script = [*tokenizer.encode(text, add_special_tokens=False), *script_end]
        for stream in (True, False):
            body = {"messages": [{"role": "user", "content": "Hi"}], "stream": stream}
            if tools:
                body["tools"] = tools
            request = ChatCompletionRequest(model="m", **body)
            results = []
            for processor in (stator, vllm):
                (plan,) = asyncio.run(processor.chat(request, "parse")).choices
                results.append(run_choice(plan, script))
            ours, theirs = results
            if ours != theirs:
                different.add(name)
                if name not in known_different:
                    differ.append(f"{name} (stream={stream}):\n  stator: {ours}\n  vllm: {theirs}")
            # vLLM's parse is the reference: it finds every call the output makes.
            expected_calls = [n for n in ("get_weather", "get_time") if n in text]
            assert [c[0] for c in theirs[2]] == (expected_calls if tools else []), (name, theirs)
    assert not differ, "\n".join(differ)
    assert different == set(known_different), "the known differences changed"


def test_qwen3_reasoning_and_hermes_calls(tools_parity):
    card, *processors = tools_parity
    tokenizer = Tokenizer.from_dir(card.source_path)
    compare(processors, tokenizer, HERMES_OUTPUTS, [tokenizer.eos_token_ids[0]], HERMES_DIFFERENT)


def test_gpt_oss_harmony(harmony_parity):
    card, *processors = harmony_parity
    tokenizer = Tokenizer.from_dir(card.source_path)
    # Harmony outputs end on their own stop token (<|return|> or <|call|>).
    compare(processors, tokenizer, HARMONY_OUTPUTS, [], {})
