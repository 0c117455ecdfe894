"""The HTTP edge's guard and limits: API keys, origins, rate limits, body, head and
connection limits, timeouts, HTTPS (with client certificates)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time

import httpx
import pytest

from stator.frontend import FrontendConfig, running_frontend
from stator.frontend.http.security import TokenBuckets, load_api_keys
from stator.runtime import Runtime, RuntimeConfig
from tests.certs import make_certs


@contextlib.asynccontextmanager
async def frontend(**fields):
    runtime = await Runtime.create(RuntimeConfig(discovery="mem:security-tests"))
    config = FrontendConfig(http_host="127.0.0.1", http_port=0, **fields)
    try:
        async with (
            running_frontend(runtime, config) as front,
            httpx.AsyncClient(base_url=front.base_url, verify=False) as http,
        ):
            front.http = http
            yield front
    finally:
        await runtime.shutdown()


async def test_api_keys_guard_every_route_but_health_and_live(caplog):
    async with frontend(api_key=["k1", "k2"]) as front:
        http = front.http
        for path in ("/live", "/health", "/metrics"):
            assert (await http.get(path)).status_code in (200, 503), path
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "k1"}):
            resp = await http.get("/v1/models", headers=headers)
            assert resp.status_code == 401
            error = resp.json()["error"]
            assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
            assert resp.headers["www-authenticate"] == "Bearer"
        for key in ("k1", "k2"):
            ok = await http.get("/v1/models", headers={"authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        # Admin routes too, and the generation routes before any parsing.
        assert (await http.get("/busy_threshold")).status_code == 401
        post = await http.post("/v1/chat/completions", json={"model": "m", "messages": []})
        assert post.status_code == 401
    assert "k1" not in caplog.text and "k2" not in caplog.text


async def test_metrics_auth_and_key_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nfrom-file\n\n")
    assert load_api_keys(["a", " "], str(keys)) == {"a", "from-file"}
    async with frontend(api_key_file=str(keys), metrics_auth=True) as front:
        http = front.http
        assert (await http.get("/metrics")).status_code == 401
        auth = {"authorization": "Bearer from-file"}
        assert (await http.get("/metrics", headers=auth)).status_code == 200
        assert (await http.get("/live")).status_code == 200


async def test_rate_limit_answers_429_with_retry_after():
    async with frontend(rate_limit_rps=1, rate_limit_burst=2, api_key=["a", "b"]) as front:
        http = front.http
        a = {"authorization": "Bearer a"}
        codes = [(await http.get("/v1/models", headers=a)).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        limited = await http.get("/v1/models", headers=a)
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert limited.json()["error"]["type"] == "rate_limit_error"
        # Per key: another key has its own budget.
        b = await http.get("/v1/models", headers={"authorization": "Bearer b"})
        assert b.status_code == 200


def test_token_buckets_refill_at_their_rate():
    buckets = TokenBuckets(rate=2.0, burst=2)
    assert [buckets.take(b"k", 0.0) for _ in range(2)] == [0.0, 0.0]
    assert buckets.take(b"k", 0.0) == pytest.approx(0.5)
    assert buckets.take(b"k", 0.5) == 0.0  # one token back after 0.5 s
    assert buckets.take(b"other", 0.5) == 0.0


async def test_body_limit_refuses_declared_and_streamed_bodies():
    async with frontend(max_body_bytes=1000) as front:
        http = front.http
        big = b'{"model": "m", "prompt": "' + b"x" * 5000 + b'"}'
        resp = await http.post(
            "/v1/completions", content=big, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "request_too_large"

        async def chunks():
            for _ in range(10):
                yield b"x" * 500

        resp = await http.post("/v1/completions", content=chunks())
        assert resp.status_code == 413
        assert (await http.get("/live")).status_code == 200


async def _raw(port: int, data: bytes, read_timeout: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), read_timeout)
    finally:
        writer.close()


async def test_slow_heads_and_bodies_and_idle_connections_are_cut_off():
    async with frontend(header_timeout=0.5, body_timeout=0.5) as front:
        port = front.port
        start = time.monotonic()
        # Connected, nothing sent; half a head; a head and half a body: all closed.
        assert await _raw(port, b"") == b""
        assert await _raw(port, b"GET /live HTTP/1.1\r\nHost: x\r\n") == b""
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
        assert await _raw(port, head) == b""
        assert time.monotonic() - start < 4.0
        async with httpx.AsyncClient(base_url=front.base_url) as http:
            assert (await http.get("/live")).status_code == 200


async def test_large_heads_get_431_and_extra_connections_503():
    async with frontend(max_header_bytes=2048, max_connections=4) as front:
        port = front.port
        head = b"GET /live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
        assert (await _raw(port, head)).startswith(b"HTTP/1.1 431")
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        try:
            answer = await _raw(port, b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer
        finally:
            for _, writer in held:
                writer.close()
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=front.base_url) as http:
            assert (await http.get("/live")).status_code == 200


async def test_https_with_client_certificates(tmp_path):
    certs = make_certs(tmp_path)
    tls = {
        "ssl_keyfile": str(certs.server.key),
        "ssl_certfile": str(certs.server.cert),
        "ssl_ca_certs": str(certs.ca),
        "ssl_client_cert": "required",
    }
    async with frontend(**tls) as front:
        assert front.base_url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        ctx.load_cert_chain(str(certs.client.cert), str(certs.client.key))
        async with httpx.AsyncClient(base_url=front.base_url, verify=ctx) as http:
            assert (await http.get("/live")).status_code == 200
        bare = ssl.create_default_context(cafile=str(certs.ca))
        async with httpx.AsyncClient(base_url=front.base_url, verify=bare) as http:
            with pytest.raises(httpx.TransportError):
                await http.get("/live")
        # Plain HTTP to the TLS port gets nothing useful.
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{front.port}") as http:
            with pytest.raises(httpx.TransportError):
                await http.get("/live")


def test_token_budgets_go_into_debt_and_refill():
    from stator.frontend.http.security import TokenBudget

    budget = TokenBudget(per_minute=600)  # 10 tokens a second, up to 600
    assert budget.wait(b"k", 0.0) == 0.0
    budget.spend(b"k", 0.0, 700)  # one long request: 100 in debt
    assert budget.wait(b"k", 0.0) == pytest.approx(10.1)
    assert budget.wait(b"k", 11.0) == 0.0
    assert budget.wait(b"other", 0.0) == 0.0


def test_tokens_per_minute_limit_a_key(tiny_model_dir):
    from tests.fakes import ScriptedEngine
    from tests.frontend.harness import Stack

    stack = Stack(tiny_model_dir, "tpm-tests", api_key=["a", "b"], rate_limit_tpm=60).start()
    try:
        stack.add_worker(ScriptedEngine("m"), "stator.tpm.generate", wait_model="m")
        body = {"model": "m", "prompt": "hello " * 20, "max_tokens": 30}
        with httpx.Client(base_url=stack.base_url, timeout=30) as http:
            a = {"authorization": "Bearer a"}
            first = http.post("/v1/completions", json=body, headers=a)
            assert first.status_code == 200  # the budget starts full; this spends > 60
            again = http.post("/v1/completions", json=body, headers=a)
            assert again.status_code == 429 and int(again.headers["retry-after"]) >= 1
            b = http.post("/v1/completions", json=body, headers={"authorization": "Bearer b"})
            assert b.status_code == 200
    finally:
        stack.stop()
