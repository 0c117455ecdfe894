"""/v1/completions: every prompt form, echo, logprobs, n, streaming."""

from __future__ import annotations

import pytest

from tests.frontend.conftest import ECHO, LOGPROBS, STORY, STORY_TEXT


def test_text_prompt(client, engines, tokenizer):
    resp = client.completions.create(model=ECHO, prompt="def main():", max_tokens=50)
    assert resp.object == "text_completion"
    assert resp.choices[0].text == "def main():"
    assert resp.choices[0].finish_reason == "stop"
    assert engines[ECHO].requests[-1].token_ids == tokenizer.encode("def main():", True)
    assert resp.usage.prompt_tokens == len(tokenizer.encode("def main():", True))


def test_token_id_prompt(client, engines, tokenizer):
    ids = tokenizer.encode("import os")
    resp = client.completions.create(model=ECHO, prompt=ids, max_tokens=50)
    assert resp.choices[0].text == "import os"
    assert engines[ECHO].requests[-1].token_ids == ids


def test_list_of_text_prompts_with_n(client):
    resp = client.completions.create(model=ECHO, prompt=["one", "two"], n=2, max_tokens=50)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert [c.text for c in resp.choices] == ["one", "one", "two", "two"]


def test_list_of_token_id_prompts(client, tokenizer):
    prompts = [tokenizer.encode("alpha"), tokenizer.encode("beta gamma")]
    resp = client.completions.create(model=ECHO, prompt=prompts, max_tokens=50)
    assert [c.text for c in resp.choices] == ["alpha", "beta gamma"]
    assert resp.usage.prompt_tokens == sum(map(len, prompts))
    assert resp.usage.completion_tokens == sum(map(len, prompts))


@pytest.mark.parametrize("stream", [False, True])
def test_echo(client, stream):
    kwargs = {"model": STORY, "prompt": "Once:", "echo": True, "max_tokens": 100}
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    else:
        text = client.completions.create(**kwargs).choices[0].text
    assert text == "Once:" + STORY_TEXT


def test_echo_of_token_ids_decodes_them(client, tokenizer):
    ids = tokenizer.encode("x = 1")
    resp = client.completions.create(model=STORY, prompt=ids, echo=True, max_tokens=1)
    assert resp.choices[0].text.startswith("x = 1")


def test_streaming_with_usage(client):
    chunks = list(
        client.completions.create(
            model=STORY, prompt="Go", stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == STORY_TEXT
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


async def test_async_completions(aclient):
    resp = await aclient.completions.create(model=STORY, prompt="Go", max_tokens=4)
    stream = await aclient.completions.create(model=STORY, prompt="Go", max_tokens=4, stream=True)
    text = "".join([c.choices[0].text async for c in stream])
    assert text == resp.choices[0].text
    assert resp.choices[0].finish_reason == "length"


def test_logprobs(client, tokenizer, engines):
    resp = client.completions.create(model=LOGPROBS, prompt="Go", logprobs=2, max_tokens=3)
    lp = resp.choices[0].logprobs
    script = engines[LOGPROBS].script
    assert lp.tokens == [tokenizer.decode([t]) for t in script[:3]]
    assert lp.token_logprobs == [-0.5, -0.5, -0.5]
    assert all(len(top) == 2 for top in lp.top_logprobs)
    offsets = [0]
    for token in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp.text_offset == offsets
