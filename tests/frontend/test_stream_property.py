"""Property: for the same engine output, the streamed text concatenated equals the
non-streamed text, whatever the text (multi-byte characters split across tokens), however
the engine splits its tokens into outputs, and wherever stop strings fall."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stator.protocols import EngineOutput, EngineRequest
from tests.fakes import ScriptedEngine

MODEL = "test/property"


class ChunkedEngine(ScriptedEngine):
    """Test double: streams `script` in outputs of `chunk_sizes` tokens (cycled)."""

    chunk_sizes: list[int] = [1]

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.requests.append(request)
        tokens, sizes = list(self.script or []), self.chunk_sizes
        i = k = 0
        while i < len(tokens):
            chunk = tokens[i : i + sizes[k % len(sizes)]]
            i, k = i + len(chunk), k + 1
            yield EngineOutput(token_ids=chunk, finish_reason="stop" if i >= len(tokens) else None)


@pytest.fixture(scope="module")
def chunked(stack) -> ChunkedEngine:
    engine = ChunkedEngine(MODEL, script=[])
    stack.add_worker(engine, "stator.property.generate", wait_model=MODEL)
    return engine


TEXT = st.text(alphabet="ab é日本🚀\nxyz.", min_size=1, max_size=40)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    text=TEXT,
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    stops=st.lists(st.text(alphabet="ab é日🚀.", min_size=1, max_size=3), max_size=2),
    chat=st.booleans(),
)
def test_streamed_text_equals_non_streamed_text(
    client, chunked, tokenizer, text, sizes, stops, chat
):
    chunked.script = tokenizer.encode(text)
    chunked.chunk_sizes = sizes
    assert tokenizer.decode(chunked.script) == text
    if chat:
        kwargs = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": stops}
        whole = client.chat.completions.create(**kwargs).choices[0].message.content
        parts = [
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(stream=True, **kwargs)
        ]
    else:
        kwargs = {"model": MODEL, "prompt": "x", "stop": stops}
        whole = client.completions.create(**kwargs).choices[0].text
        parts = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)]
    assert "".join(parts) == whole
    assert all("\ufffd" not in p for p in parts)  # never half a character
    if len(stops) == 1:
        cut = text.find(stops[0])
        assert whole == (text if cut < 0 else text[:cut])
    elif not stops:
        assert whole == text
