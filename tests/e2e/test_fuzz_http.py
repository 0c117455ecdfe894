"""Property-based fuzzing of the HTTP surface of `stator run --engine mocker`: malformed
and adversarial bodies, headers and methods on every route. Whatever comes in: no 5xx, an
answer within 10 s, every error in OpenAI's format, and the server still serving after."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.fleet import Fleet, wait_until
from tests.procs import free_port

pytestmark = pytest.mark.integration

MODEL = "tiny-chat"
POST_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/busy_threshold"]
GET_ROUTES = [
    "/v1/models", f"/v1/models/{MODEL}", "/v1/models/nope", "/health", "/live", "/metrics",
    "/busy_threshold", "/openapi.json", "/nowhere",
]  # fmt: skip
VALID = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/v1/responses": {"model": MODEL, "input": "hi"},
    "/busy_threshold": {"model": MODEL},
}

# JSON values, nested, with the awkward corners: huge and negative numbers, NaN-like
# strings, unicode, empty containers.
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | st.sampled_from(["", "NaN", "Infinity", "\x00", "\ud7ff", "A" * 5000, MODEL, "user"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=25,
)
FIELDS = [
    "model", "messages", "prompt", "input", "max_tokens", "n", "stop", "stream", "logprobs",
    "top_logprobs", "temperature", "top_p", "top_k", "seed", "logit_bias", "tools",
    "tool_choice", "response_format", "chat_template_kwargs", "stream_options", "echo",
    "prompt_embeds", "best_of", "min_tokens", "max_completion_tokens", "guided_json",
    "active_decode_blocks_threshold", "previous_response_id", "instructions", "role",
]  # fmt: skip


@st.composite
def bodies(draw, route: str) -> bytes:
    kind = draw(st.sampled_from(["mutated", "json", "bytes", "deep"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(50, 5000))
        return ("[" * depth + "]" * depth).encode()
    body = dict(VALID[route])
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(FIELDS))
        if draw(st.booleans()) and key in body:
            del body[key]
        else:
            body[key] = draw(JSON)
    # Small generations keep each example short; the mocker is not what is fuzzed.
    if "max_tokens" not in body and route != "/busy_threshold":
        body["max_tokens"] = 4
    return json.dumps(body).encode()


@st.composite
def requests(draw):
    if draw(st.integers(0, 4)) == 0:
        method = draw(st.sampled_from(["GET", "DELETE", "PUT", "PATCH", "OPTIONS"]))
        route = draw(st.sampled_from(GET_ROUTES + POST_ROUTES))
        return method, route, b"", {}
    route = draw(st.sampled_from(POST_ROUTES))
    content_type = draw(
        st.sampled_from(["application/json", "application/json", "text/plain", "", "a/b; x"])
    )
    headers = {"content-type": content_type} if content_type else {}
    if draw(st.integers(0, 5)) == 0:
        headers["x-worker-instance-id"] = draw(st.sampled_from(["zz", "-1", "ffffffff", ""]))
    return "POST", route, draw(bodies(route)), headers


def assert_openai_error(resp: httpx.Response) -> None:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert {"message", "type", "param", "code"} <= set(body["error"]), body


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    fleet = Fleet(tmp_path_factory.mktemp("fuzz"))
    port = free_port()
    proc = fleet.start(
        "run", "run", "--engine", "mocker", "--speedup-ratio", "0", "--http-port", str(port),
        "--workers", "2",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, 120, "stator run to serve", [proc])
    with httpx.Client(base_url=url, timeout=10) as client:
        yield client
    assert proc.alive(), proc.output()[-3000:]
    fleet.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(req=requests())
def test_no_input_gets_a_5xx_or_a_hang(server, req):
    method, route, content, headers = req
    started = time.monotonic()
    resp = server.request(method, route, content=content, headers=headers)
    assert time.monotonic() - started < 10
    # A 503 only for a request pinned to a worker that does not exist, with Retry-After.
    pinned = bool(headers.get("x-worker-instance-id"))
    assert resp.status_code < 500 or (
        resp.status_code == 503 and pinned and "retry-after" in resp.headers
    ), (route, content[:300], resp.text)
    if resp.status_code >= 400 and route != "/nowhere" and method in ("GET", "POST"):
        assert_openai_error(resp)
    elif resp.status_code == 200 and resp.headers.get("content-type", "").startswith(
        "text/event-stream"
    ):
        assert resp.text.rstrip().endswith("data: [DONE]") or "error" in resp.text


def test_still_serving_after_the_fuzz(server):
    assert server.get("/live").status_code == 200
    ok = server.post(
        "/v1/chat/completions", json={**VALID["/v1/chat/completions"], "max_tokens": 3}
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
