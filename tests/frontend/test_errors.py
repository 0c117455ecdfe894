"""Bad input gets OpenAI's error object with the right status; never a 500, never a hang."""

from __future__ import annotations

import openai
import pytest

from stator.router import Overloaded
from tests.frontend.conftest import ECHO, STORY

MESSAGES = [{"role": "user", "content": "hi"}]


def error_of(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_malformed_json_is_400(http):
    resp = http.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert "JSON" in error_of(resp)["message"]


def test_body_that_is_not_an_object_is_400(http):
    resp = http.post("/v1/chat/completions", json=[1, 2])
    assert resp.status_code == 400


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MESSAGES}, "model"),
        ({"model": STORY}, "messages"),
        ({"model": STORY, "messages": []}, "messages"),
        ({"model": STORY, "messages": [{"content": "x"}]}, "messages[0].role"),
        ({"model": STORY, "messages": MESSAGES, "temperature": 3}, "temperature"),
        ({"model": STORY, "messages": MESSAGES, "top_p": 0}, "top_p"),
        ({"model": STORY, "messages": MESSAGES, "n": 0}, "n"),
        ({"model": STORY, "messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"model": STORY, "messages": MESSAGES, "max_tokens": "ten"}, "max_tokens"),
        ({"model": STORY, "messages": MESSAGES, "top_logprobs": 50}, "top_logprobs"),
        ({"model": STORY, "messages": MESSAGES, "stop": 5}, "stop"),
        ({"model": STORY, "messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ({"model": STORY, "messages": MESSAGES, "stop": [""]}, "stop"),
        ({"model": STORY, "messages": MESSAGES, "logit_bias": {"x": 1}}, "logit_bias"),
    ],
)
def test_chat_schema_errors_name_the_parameter(http, body, param):
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["param"] == param
    assert error_of(resp)["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": ECHO}, "prompt"),
        ({"model": ECHO, "prompt": []}, "prompt"),
        ({"model": ECHO, "prompt": [[]]}, "prompt"),
        ({"model": ECHO, "prompt": [10**9]}, "prompt"),
        ({"model": ECHO, "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": ECHO, "prompt": "x", "logprobs": 99}, "logprobs"),
        ({"model": ECHO, "prompt": "x", "echo": True, "logprobs": 1}, "logprobs"),
    ],
)
def test_completion_schema_errors_name_the_parameter(http, body, param):
    resp = http.post("/v1/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["param"] == param


def test_non_text_content_parts_are_400(http):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]
    resp = http.post("/v1/chat/completions", json={"model": STORY, "messages": messages})
    assert resp.status_code == 400
    assert error_of(resp)["param"] == "messages[0].content"
    assert "image_url" in error_of(resp)["message"]


def test_template_errors_are_400(http):
    # The tiny ChatML template concatenates content; a message without one cannot render.
    resp = http.post(
        "/v1/chat/completions",
        json={"model": STORY, "messages": [{"role": "assistant", "content": None}]},
    )
    assert resp.status_code == 400
    assert error_of(resp)["param"] == "messages"


def test_unknown_model_is_404(client, http):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no/such-model", messages=MESSAGES)
    assert info.value.status_code == 404
    resp = http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert resp.status_code == 404
    assert error_of(resp)["code"] == "model_not_found"


def test_prompt_plus_max_tokens_over_context_is_400_with_both_numbers(http, tokenizer):
    ids = tokenizer.encode("word " * 10)
    resp = http.post("/v1/completions", json={"model": ECHO, "prompt": ids, "max_tokens": 4090})
    assert resp.status_code == 400
    error = error_of(resp)
    assert str(len(ids)) in error["message"] and "4090" in error["message"]
    assert "4096" in error["message"]


def test_prompt_alone_over_context_is_400(http):
    resp = http.post("/v1/completions", json={"model": ECHO, "prompt": [5] * 5000})
    assert resp.status_code == 400
    assert "5000" in error_of(resp)["message"]


def test_unknown_route_is_404_error_object(http):
    resp = http.get("/v1/nothing")
    assert resp.status_code == 404
    error_of(resp)


def test_model_with_card_but_no_live_worker_is_503(stack, http, engines, tiny_model_dir):
    # A card without a served endpoint: the model is known, no instance is live.
    import msgspec

    async def publish():
        runtime = await stack.new_runtime()
        card = msgspec.structs.replace(
            engines[ECHO].model_card(), name="test/orphan", source_path=str(tiny_model_dir)
        )
        await runtime.publish_model_card("stator.orphan.generate", card)
        return runtime

    runtime = stack.call(publish())
    try:
        stack.wait_for_model("test/orphan")
        resp = http.post("/v1/completions", json={"model": "test/orphan", "prompt": "x"})
        assert resp.status_code == 503
        assert error_of(resp)["code"] == "no_instances"
        assert http.get("/health").status_code == 200  # other models are live
    finally:
        stack.call(runtime.shutdown())


def test_overloaded_is_503_with_retry_after(stack, http, monkeypatch):
    pipeline = stack.call(stack.frontend.manager.pipeline(ECHO))

    async def refuse(request):
        raise Overloaded("all workers busy", retry_after=2.5)
        yield  # pragma: no cover

    monkeypatch.setattr(pipeline.router, "generate", refuse)
    resp = http.post("/v1/completions", json={"model": ECHO, "prompt": "x", "stream": True})
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "3"
    assert error_of(resp)["code"] == "overloaded"


def test_sdk_raises_on_503(stack, client, monkeypatch):
    pipeline = stack.call(stack.frontend.manager.pipeline(ECHO))

    async def refuse(request):
        raise Overloaded("busy", retry_after=1)
        yield  # pragma: no cover

    monkeypatch.setattr(pipeline.router, "generate", refuse)
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=ECHO, prompt="x")
    assert info.value.status_code == 503


def test_engine_error_mid_stream_is_an_sse_error(stack, http, monkeypatch, tokenizer):
    from stator.protocols import EngineOutput

    pipeline = stack.call(stack.frontend.manager.pipeline(ECHO))

    async def failing(request):
        yield EngineOutput(token_ids=tokenizer.encode("hello"))
        yield EngineOutput(finish_reason="error", error="device lost")

    monkeypatch.setattr(pipeline.router, "generate", failing)
    with http.stream(
        "POST", "/v1/completions", json={"model": ECHO, "prompt": "x", "stream": True}
    ) as resp:
        assert resp.status_code == 200
        raw = resp.read().decode()
    assert "device lost" in raw and raw.endswith("data: [DONE]\n\n")
    resp = http.post("/v1/completions", json={"model": ECHO, "prompt": "x"})
    assert resp.status_code == 500 and "device lost" in error_of(resp)["message"]
