"""Wait for a server to serve before measuring it (`stator bench run --ready-check-timeout-sec`):
a benchmark Job started with its deployment waits here while the model downloads and loads."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from stator.bench.http import HttpClient, HttpError

log = logging.getLogger(__name__)


async def _get(http: HttpClient, path: str) -> tuple[int, bytes]:
    resp = await http.request("GET", path)
    body = await resp.read()
    http.release(resp)
    return resp.status, body


async def _check(http: HttpClient, model: str | None) -> str | None:
    """None when ready, else what is missing."""
    status, _ = await _get(http, "/health")
    if status != 200:
        return f"GET /health answered {status}"
    status, raw = await _get(http, "/v1/models")
    if status != 200:
        return f"GET /v1/models answered {status}"
    ids = [m.get("id") for m in json.loads(raw).get("data", [])]
    if model is None:
        return None if ids else "GET /v1/models lists no model"
    return None if model in ids else f"GET /v1/models lists {ids}, not {model!r}"


async def wait_until_ready(
    http: HttpClient,
    base: str,
    model: str | None,
    timeout: float,
    interval: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Poll until `/health` is 200 and `/v1/models` lists `model` (any model when None);
    RuntimeError after `timeout` seconds, naming the last thing that was not ready."""
    deadline = clock() + timeout
    while True:
        try:
            missing = await _check(http, model)
        except (HttpError, OSError, TimeoutError, ValueError) as exc:
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        left = deadline - clock()
        if left <= 0:
            raise RuntimeError(f"{base} was not ready after {timeout:g} s: {missing}")
        log.info("waiting for %s to serve (%s); %.0f s left", base, missing, left)
        await sleep(min(interval, left))
