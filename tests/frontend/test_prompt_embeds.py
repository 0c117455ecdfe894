"""/v1/completions with `prompt_embeds`: decoded at the edge, sent to the engine as
embeddings, counted as prompt tokens; every bad payload is a 400 naming it."""

from __future__ import annotations

import base64
import io
import pickle

import msgspec
import pytest
import torch

from stator.llm.prompt_embeds import embeds_tensor
from tests.fakes import ScriptedEngine
from tests.frontend.conftest import ECHO, STORY_TEXT

EMBEDS = "test/embeds"  # a worker whose card says it takes embeddings of width HIDDEN
HIDDEN = 8
CONTEXT = 256  # the embeddings worker's context length, from its card


class EmbedsEngine(ScriptedEngine):
    """Test double: takes prompt embeddings as the card says, answers with the story;
    records each embeddings request as it arrived."""

    def __init__(self, name: str, script: list[int]) -> None:
        super().__init__(name, script=script)
        self.embeds_requests = []

    def model_card(self):
        return msgspec.structs.replace(
            super().model_card(), prompt_embeds_hidden_size=HIDDEN, context_length=CONTEXT
        )

    async def generate(self, request):
        if request.prompt_embeds is not None:
            self.embeds_requests.append(request)
            # The scripted engine counts prompt tokens by token ids: one per row.
            rows = request.prompt_embeds_shape[0]
            request = msgspec.structs.replace(request, token_ids=[0] * rows)
        async for output in super().generate(request):
            yield output


@pytest.fixture(scope="module")
def engines(tokenizer):
    return {
        EMBEDS: EmbedsEngine(EMBEDS, script=tokenizer.encode(STORY_TEXT)),
        ECHO: ScriptedEngine(ECHO),
    }


def saved(obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


def embeds(rows: int, hidden: int = HIDDEN, dtype=torch.float32) -> torch.Tensor:
    return torch.arange(rows * hidden, dtype=torch.float32).reshape(rows, hidden).to(dtype) / 7


def received(request) -> torch.Tensor:
    return embeds_tensor(
        request.prompt_embeds,
        request.prompt_embeds_shape,
        request.prompt_embeds_dtype,
        HIDDEN,
        CONTEXT,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embeddings_reach_the_engine_and_count_as_prompt_tokens(client, engines, dtype):
    tensor = embeds(5, dtype=dtype)
    resp = client.completions.create(
        model=EMBEDS, prompt="", max_tokens=4, extra_body={"prompt_embeds": saved(tensor)}
    )
    assert len(resp.choices) == 1
    assert resp.choices[0].text and STORY_TEXT.startswith(resp.choices[0].text)
    assert resp.usage.prompt_tokens == 5 and resp.usage.completion_tokens == 4
    request = engines[EMBEDS].embeds_requests[-1]
    assert request.token_ids == []
    assert torch.equal(received(request), tensor)


def test_batch_of_one_and_a_list_of_payloads(client, engines):
    payloads = [saved(embeds(3)[None]), saved(embeds(2))]
    resp = client.completions.create(
        model=EMBEDS, prompt="", max_tokens=2, extra_body={"prompt_embeds": payloads}
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.usage.prompt_tokens == 5
    shapes = [r.prompt_embeds_shape for r in engines[EMBEDS].embeds_requests[-2:]]
    assert sorted(shapes) == [[2, HIDDEN], [3, HIDDEN]]


def test_embeddings_come_before_the_prompts_as_in_vllm(client, engines, tokenizer):
    ids = tokenizer.encode("import os")
    resp = client.completions.create(
        model=EMBEDS, prompt=ids, n=2, max_tokens=3, extra_body={"prompt_embeds": saved(embeds(4))}
    )
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert resp.usage.prompt_tokens == 4 + len(ids)  # each prompt once, whatever n is
    engine = engines[EMBEDS]
    by_id = {r.request_id: r for r in engine.requests[-4:]}
    first = min(by_id)  # choice 0 keeps the request id; the others get "-index"
    assert by_id[first].prompt_embeds is not None
    assert by_id[f"{first}-2"].prompt_embeds is None and by_id[f"{first}-2"].token_ids == ids


def test_streaming_with_embeddings(client):
    chunks = list(
        client.completions.create(
            model=EMBEDS,
            prompt="",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"prompt_embeds": saved(embeds(6))},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens == 6


class NotATensor:
    def __reduce__(self):
        return (print, ("unpickled!",))


def raw_b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("not base64 at all!!", "not valid base64"),
        (raw_b64(b"just some bytes"), "not a saved tensor"),
        (raw_b64(pickle.dumps(NotATensor())), "not a saved tensor"),
        (saved({"x": torch.zeros(2, HIDDEN)}), "not a tensor"),
        (saved(torch.zeros(HIDDEN)), "2-D"),
        (saved(torch.zeros(2, 3, HIDDEN)), "2-D"),
        (saved(torch.zeros(3, HIDDEN + 1)), f"hidden size {HIDDEN}"),
        (saved(torch.zeros(3, HIDDEN, dtype=torch.int64)), "dtype"),
        (saved(torch.full((3, HIDDEN), float("nan"))), "NaN"),
        (saved(torch.zeros(CONTEXT + 1, HIDDEN)), f"1 to {CONTEXT}"),
    ],
    ids=[
        "bad-base64",
        "not-a-pickle",
        "pickled-object",
        "dict",
        "1-d",
        "batch-of-two",
        "wrong-width",
        "int-dtype",
        "nan",
        "too-long",
    ],
)
def test_bad_payloads_are_400_naming_prompt_embeds(http, payload, message):
    resp = http.post(
        "/v1/completions",
        json={"model": EMBEDS, "prompt_embeds": payload, "max_tokens": 2},
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "prompt_embeds"
    assert message in error["message"]


def test_a_prompt_that_fills_the_context_is_400(http):
    resp = http.post(
        "/v1/completions",
        json={"model": EMBEDS, "prompt_embeds": saved(embeds(CONTEXT)), "max_tokens": 2},
    )
    assert resp.status_code == 400, resp.text
    assert "context length" in resp.json()["error"]["message"]


def test_the_bad_entry_of_a_list_is_named(http):
    payloads = [saved(embeds(2)), "%%%"]
    resp = http.post(
        "/v1/completions", json={"model": EMBEDS, "prompt_embeds": payloads, "max_tokens": 2}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("prompt_embeds[1]:")


def test_engine_without_embeddings_is_400_naming_it(http, engines):
    before = len(engines[ECHO].requests)
    resp = http.post(
        "/v1/completions",
        json={"model": ECHO, "prompt_embeds": saved(embeds(2)), "max_tokens": 2},
    )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["param"] == "prompt_embeds"
    assert "does not accept prompt embeddings" in error["message"]
    assert "scripted" in error["message"]
    assert len(engines[ECHO].requests) == before


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt_embeds": []}, "prompt"),
        ({"prompt_embeds": saved(embeds(2)), "echo": True}, "echo"),
        ({"prompt_embeds": 12}, "prompt_embeds"),
    ],
)
def test_missing_or_conflicting_fields_are_400(http, body, param):
    resp = http.post("/v1/completions", json={"model": EMBEDS, "max_tokens": 2, **body})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
