"""Regression tests for issue 23's black-box findings: each bad or adversarial input is a
4xx in OpenAI's format, answered fast, and the server keeps serving."""

from __future__ import annotations

import time

import pytest

from stator.frontend.openai.requests import MAX_CHOICES
from tests.frontend.conftest import ECHO, STORY

MESSAGES = [{"role": "user", "content": "hi"}]


def error_of(resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def still_live(http) -> None:
    assert http.get("/live", timeout=5).status_code == 200


def test_completion_fan_out_is_capped(http):
    started = time.monotonic()
    resp = http.post("/v1/completions", json={"model": ECHO, "prompt": [[1]] * 2000, "n": 128})
    assert resp.status_code == 400 and str(MAX_CHOICES) in error_of(resp)["message"]
    assert time.monotonic() - started < 5
    ok = http.post("/v1/completions", json={"model": ECHO, "prompt": [[5]] * 4, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4
    still_live(http)


def test_a_huge_text_prompt_is_refused_before_tokenizing(http):
    started = time.monotonic()
    text = "word " * 2_000_000  # 10 MB
    resp = http.post("/v1/completions", json={"model": ECHO, "prompt": text})
    assert resp.status_code in (400, 413)
    resp = http.post(
        "/v1/chat/completions",
        json={"model": STORY, "messages": [{"role": "user", "content": "x" * 3_000_000}]},
    )
    assert resp.status_code == 400
    assert error_of(resp)["code"] == "context_length_exceeded"
    assert time.monotonic() - started < 10
    still_live(http)


def test_long_stop_strings_are_refused_or_cheap(http):
    started = time.monotonic()
    resp = http.post(
        "/v1/chat/completions", json={"model": STORY, "messages": MESSAGES, "stop": "ab" * 3000}
    )
    assert resp.status_code == 400 and error_of(resp)["param"] == "stop"
    body = {"model": STORY, "messages": MESSAGES, "stop": ["ab" * 500] * 2 + ["x" * 1024]}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "key", ["tools", "messages", "add_generation_prompt", "continue_final_message"]
)
def test_reserved_chat_template_kwargs_are_400(http, key):
    body = {"model": STORY, "messages": MESSAGES, "chat_template_kwargs": {key: True}}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and error_of(resp)["param"] == "chat_template_kwargs"
    # The keep-alive connection is still good for the next request.
    assert http.post("/v1/chat/completions", json={"model": STORY, "messages": MESSAGES}).is_success


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", "1"), ("max_tokens", True), ("n", "2"), ("top_logprobs", False)],
)
def test_strings_and_booleans_are_not_integers(http, field, value):
    body = {"model": STORY, "messages": MESSAGES, field: value}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and error_of(resp)["param"] == field


def test_unknown_chat_roles_are_400(http):
    body = {"model": STORY, "messages": [{"role": "wizard", "content": "hi"}]}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and error_of(resp)["param"] == "messages[0].role"


def test_empty_responses_input_names_input(http):
    resp = http.post("/v1/responses", json={"model": STORY, "input": []})
    assert resp.status_code == 400 and error_of(resp)["param"] == "input"


def test_503s_carry_retry_after(http):
    headers = {"x-worker-instance-id": "abcdef12"}  # no such worker
    resp = http.post(
        "/v1/chat/completions", json={"model": STORY, "messages": MESSAGES}, headers=headers
    )
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
    assert error_of(resp)["code"] == "no_instances"
