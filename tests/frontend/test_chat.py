"""/v1/chat/completions through the official openai SDK, sync and async."""

from __future__ import annotations

import json
import time

import pytest

from tests.frontend.conftest import ECHO, LOGPROBS, STORY, STORY_TEXT

MESSAGES = [{"role": "user", "content": "Say something nice."}]


def test_chat_non_streaming(client, engines):
    resp = client.chat.completions.create(model=STORY, messages=MESSAGES)
    assert resp.object == "chat.completion"
    assert resp.model == STORY
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == STORY_TEXT
    assert choice.finish_reason == "stop"
    assert choice.logprobs is None
    sent = engines[STORY].requests[-1]
    assert resp.usage.prompt_tokens == len(sent.token_ids)
    # Every text token plus the hidden EOS, as the engine counts them.
    assert resp.usage.completion_tokens == len(engines[STORY].script)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_prompt_is_the_rendered_template(client, engines, tokenizer):
    client.chat.completions.create(
        model=ECHO,
        messages=[
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
            },
        ],
        max_tokens=3,
    )
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert engines[ECHO].requests[-1].token_ids == tokenizer.encode(expected)


def test_chat_streaming_matches_openai_shape(client):
    chunks = list(
        client.chat.completions.create(
            model=STORY, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    first = chunks[0]
    assert first.choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == STORY_TEXT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and all(f is None for f in finishes[:-1])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_framing(http):
    body = {"model": STORY, "messages": MESSAGES, "stream": True, "max_tokens": 4}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        json.loads(event[len("data: ") :])


def test_no_usage_without_include_usage(http):
    body = {"model": STORY, "messages": MESSAGES, "stream": True, "max_tokens": 3}
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        raw = resp.read().decode()
    payloads = [json.loads(e[6:]) for e in raw.split("\n\n") if e.startswith("data: {")]
    assert all("usage" not in p for p in payloads)


async def test_async_chat_streaming_and_not(aclient):
    resp = await aclient.chat.completions.create(model=STORY, messages=MESSAGES)
    stream = await aclient.chat.completions.create(model=STORY, messages=MESSAGES, stream=True)
    text = ""
    async for chunk in stream:
        text += chunk.choices[0].delta.content or ""
    assert text == resp.choices[0].message.content == STORY_TEXT


def test_max_tokens_gives_length(client, engines):
    resp = client.chat.completions.create(model=STORY, messages=MESSAGES, max_tokens=3)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3
    assert engines[STORY].requests[-1].stop.max_tokens == 3


def test_max_completion_tokens_wins(client, engines):
    client.chat.completions.create(
        model=STORY, messages=MESSAGES, max_tokens=5, max_completion_tokens=2
    )
    assert engines[STORY].requests[-1].stop.max_tokens == 2


def test_default_max_tokens_is_the_rest_of_the_context(client, engines):
    client.chat.completions.create(model=STORY, messages=MESSAGES)
    sent = engines[STORY].requests[-1]
    assert sent.stop.max_tokens == 4096 - len(sent.token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_is_removed_and_reported(client, stream):
    kwargs = {"model": STORY, "messages": MESSAGES, "stop": ["✓"]}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        resp = client.chat.completions.create(**kwargs)
        text, finish = resp.choices[0].message.content, resp.choices[0].finish_reason
    assert text == STORY_TEXT[: STORY_TEXT.index("✓")]
    assert finish == "stop"


def test_stop_string_aborts_the_engine_stream(client, engines):
    resp = client.chat.completions.create(model=STORY, messages=MESSAGES, stop="Hello")
    assert resp.choices[0].message.content == ""
    sent = engines[STORY].requests[-1]
    # The abort reaches the engine on the server's loop, which may answer first.
    deadline = time.monotonic() + 10
    while sent.request_id not in engines[STORY].aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent.request_id in engines[STORY].aborted


def test_sampling_parameters_reach_the_engine(client, engines):
    client.chat.completions.create(
        model=STORY,
        messages=MESSAGES,
        temperature=0.3,
        top_p=0.9,
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"5": 2.0},
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "min_tokens": 2},
    )
    s = engines[STORY].requests[-1].sampling
    assert (s.temperature, s.top_p, s.seed, s.top_k, s.min_p) == (0.3, 0.9, 7, 5, 0.1)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -0.5, 1.1)
    assert s.logit_bias == {5: 2.0}
    assert engines[STORY].requests[-1].stop.min_tokens == 2


def test_generation_config_defaults_apply(client, engines):
    # The tiny model's generation_config.json sets temperature 0.7.
    client.chat.completions.create(model=STORY, messages=MESSAGES, max_tokens=1)
    assert engines[STORY].requests[-1].sampling.temperature == 0.7


def test_eos_is_a_hidden_stop_token(client, engines, eos_id):
    client.chat.completions.create(model=STORY, messages=MESSAGES, max_tokens=1)
    assert eos_id in engines[STORY].requests[-1].stop.stop_token_ids_hidden


def test_n_fans_out_with_distinct_seeds(client, engines):
    before = len(engines[STORY].requests)
    resp = client.chat.completions.create(model=STORY, messages=MESSAGES, n=3, seed=11)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert all(c.message.content == STORY_TEXT for c in resp.choices)
    sent = engines[STORY].requests[before:]
    assert len(sent) == 3
    assert len({r.request_id for r in sent}) == 3
    seeds = [r.sampling.seed for r in sent]
    assert seeds[0] == 11 and len(set(seeds)) == 3
    assert resp.usage.completion_tokens == 3 * len(engines[STORY].script)


def test_n_streaming_covers_every_choice(client):
    chunks = list(client.chat.completions.create(model=STORY, messages=MESSAGES, n=2, stream=True))
    texts = {0: "", 1: ""}
    roles = set()
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.add(c.index)
    assert texts == {0: STORY_TEXT, 1: STORY_TEXT}
    assert roles == {0, 1}


def test_logprobs(client, engines, tokenizer):
    resp = client.chat.completions.create(
        model=LOGPROBS, messages=MESSAGES, logprobs=True, top_logprobs=2, max_tokens=4
    )
    assert engines[LOGPROBS].requests[-1].sampling.logprobs == 2
    content = resp.choices[0].logprobs.content
    script = engines[LOGPROBS].script
    assert [e.token for e in content] == [tokenizer.decode([t]) for t in script[:4]]
    assert all(e.logprob == -0.5 for e in content)
    assert all(e.bytes == list(e.token.encode()) for e in content)
    assert [len(e.top_logprobs) for e in content] == [2, 2, 2, 2]
    assert content[0].top_logprobs[1].token == tokenizer.decode([script[0] + 1])


def test_logprobs_streamed(client):
    chunks = list(
        client.chat.completions.create(
            model=LOGPROBS, messages=MESSAGES, logprobs=True, max_tokens=5, stream=True
        )
    )
    entries = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(entries) == 5
    assert all(e.top_logprobs == [] for e in entries)


def test_no_logprobs_unless_asked(client, engines):
    resp = client.chat.completions.create(model=LOGPROBS, messages=MESSAGES, max_tokens=2)
    assert resp.choices[0].logprobs is None
    assert engines[LOGPROBS].requests[-1].sampling.logprobs is None


def test_request_id_is_echoed_or_generated(http):
    body = {"model": STORY, "messages": MESSAGES, "max_tokens": 1}
    resp = http.post("/v1/chat/completions", json=body, headers={"x-request-id": "abc-123"})
    assert resp.headers["x-request-id"] == "abc-123"
    assert resp.json()["id"] == "chatcmpl-abc-123"
    generated = http.post("/v1/chat/completions", json=body).headers["x-request-id"]
    assert len(generated) >= 16


def test_response_format_and_stop_tokens_reach_the_engine(client, engines, eos_id):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    client.chat.completions.create(
        model=STORY,
        messages=MESSAGES,
        max_tokens=2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        extra_body={"stop_token_ids": [7], "ignore_eos": True},
    )
    sent = engines[STORY].requests[-1]
    assert sent.sampling.guided_decoding is not None
    assert sent.sampling.guided_decoding.json_schema == schema
    assert sent.stop.stop_token_ids == [7]
    assert sent.stop.ignore_eos is True


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(client, tokenizer, skip):
    ids = tokenizer.encode("<|im_start|>hello")
    resp = client.completions.create(
        model=ECHO, prompt=ids, max_tokens=20, extra_body={"skip_special_tokens": skip}
    )
    assert resp.choices[0].text == ("hello" if skip else "<|im_start|>hello")
