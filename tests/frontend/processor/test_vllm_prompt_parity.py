"""Parity: every request of the corpus (`corpus.chat_corpus`, 304 chat requests) rendered
and tokenized by stator's processor and by vLLM's (`--processor vllm`) gives the same
prompt ids, or the same refusal (a 400 from both), on the tests' tiny models and on
GPT-OSS's real o200k_harmony vocabulary. Runs where vLLM is installed (.ci/vllm.sh)."""

from __future__ import annotations

import asyncio
import copy

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here (run .ci/vllm.sh)")

from stator.frontend import errors
from stator.frontend.openai.requests import ChatCompletionRequest
from stator.frontend.processor import Processor
from stator.parsers.harmony.chat import conversation_start_date
from stator.protocols import ModelCard
from tests.frontend.processor.corpus import chat_corpus
from tests.frontend.processor.models import (
    CONTEXT,
    both_processors,
    chatml_model,
)

CORPUS = chat_corpus()


@pytest.fixture(autouse=True)
def same_start_date(monkeypatch):
    # vLLM writes today's date into GPT-OSS's system message, as stator does; pinned to
    # stator's today so that a run across midnight compares one date.
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", conversation_start_date())


def outcome(processor, body: dict) -> list[int] | str:
    """The prompt ids, or "400" when the processor refuses the request."""
    request = ChatCompletionRequest(model="m", **copy.deepcopy(body))
    try:
        prepared = asyncio.run(processor.chat(request, "parity"))
    except errors.ApiError as exc:
        assert exc.status == 400, exc
        return "400"
    return list(prepared.prompts[0])


def compare(processors: tuple[Processor, Processor], bodies: list[tuple[str, dict]]) -> None:
    stator, vllm = processors
    mismatches = []
    refused = 0
    for name, body in bodies:
        ours, theirs = outcome(stator, body), outcome(vllm, body)
        refused += ours == "400"
        if ours != theirs:
            show = [
                x if isinstance(x, str) else vllm.decode_prompt(x)[-300:] for x in (ours, theirs)
            ]
            mismatches.append(f"{name}:\n  stator: {show[0]!r}\n  vllm:   {show[1]!r}")
    assert not mismatches, f"{len(mismatches)} of {len(bodies)} differ:\n" + "\n".join(
        mismatches[:5]
    )
    # Most of the corpus renders: refusals are the exception that must match.
    assert refused < len(bodies) // 4, f"{refused} of {len(bodies)} refused by both"


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 200


def test_chatml_prompt_ids(tmp_path):
    """The tiny ChatML model: no tools in its template (vLLM refuses tools without a
    tool-call parser: stator's 400s must match), every other request."""
    model_dir = chatml_model(tmp_path / "chatml")
    card = ModelCard(name="m", source_path=str(model_dir), context_length=CONTEXT)
    compare(asyncio.run(both_processors(card)), [(n, b) for n, b in CORPUS if "tools" not in b])


def test_tools_template_prompt_ids(tools_parity):
    """The tool-aware template with Qwen3 reasoning and Hermes tool calls: every request."""
    compare(tools_parity[1:], CORPUS)


def test_gpt_oss_prompt_ids(harmony_parity):
    """GPT-OSS on o200k_harmony (Harmony rendering on both sides): every request."""
    # GPT-OSS knows low, medium and high effort: a 400 from both for anything else.
    minimal = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "minimal"}
    compare(harmony_parity[1:], [*CORPUS, ("minimal-effort-refused", minimal)])
