"""Fixtures: one frontend stack per test module with three models served by
`ScriptedEngine` workers (see harness.py), and sync / async `openai` clients for it."""

from __future__ import annotations

import httpx
import openai
import pytest

from stator.llm import Tokenizer
from stator.protocols import TokenLogprob, TopLogprob
from tests.fakes import ScriptedEngine
from tests.frontend.harness import Stack

ECHO = "test/echo"  # repeats the prompt's tokens
STORY = "test/story"  # a fixed multilingual text, then EOS
SLOW = "test/slow"  # a long script, one token every 20 ms
LOGPROBS = "test/logprobs"  # the story, with made-up logprobs when asked
STORY_TEXT = "Hello wörld — ünïcode ✓ 日本語 text, emoji 🚀 and more. The end."


class LogprobEngine(ScriptedEngine):
    """Test double: the scripted story, each token with logprob -0.5 and, as its top
    alternatives, itself and the next token id (logprob -1.5)."""

    async def generate(self, request):
        async for output in super().generate(request):
            if request.sampling.logprobs is not None and output.token_ids:
                output.logprobs = [
                    TokenLogprob(
                        token_id=t,
                        logprob=-0.5,
                        top=[TopLogprob(t, -0.5), TopLogprob(t + 1, -1.5)][
                            : request.sampling.logprobs
                        ],
                    )
                    for t in output.token_ids
                ]
            yield output


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="session")
def eos_id(tokenizer) -> int:
    return tokenizer.eos_token_ids[0]


@pytest.fixture(scope="module")
def engines(tokenizer, eos_id) -> dict[str, ScriptedEngine]:
    story = [*tokenizer.encode(STORY_TEXT), eos_id]
    return {
        ECHO: ScriptedEngine(ECHO),
        STORY: ScriptedEngine(STORY, script=story, eos_token_id=eos_id),
        SLOW: ScriptedEngine(SLOW, script=tokenizer.encode("tick " * 400), delay=0.02),
        LOGPROBS: LogprobEngine(LOGPROBS, script=story, eos_token_id=eos_id),
    }


@pytest.fixture(scope="module")
def stack(tiny_model_dir, engines):
    stack = Stack(tiny_model_dir).start()
    try:
        for i, (name, engine) in enumerate(engines.items()):
            stack.add_worker(engine, f"stator.model{i}.generate", wait_model=name)
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def client(stack) -> openai.OpenAI:
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture
async def aclient(stack):
    async with openai.AsyncOpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture
def http(stack):
    with httpx.Client(base_url=stack.base_url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def parser_stack(tmp_path_factory):
    """The scripted reasoning / tool-call models of parser_stack.py, served."""
    from tests.frontend.parser_stack import start_parser_stack

    stack, engines = start_parser_stack(tmp_path_factory.mktemp("parsers") / "model")
    try:
        yield stack, engines
    finally:
        stack.stop()


@pytest.fixture
def parser_client(parser_stack) -> openai.OpenAI:
    stack, _ = parser_stack
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
        yield c
