"""ASGI middleware giving every HTTP request its id and counting it.

The id comes from the client's `x-request-id` (when it is a sane token) or is generated;
it is echoed in the response and set in `stator.logs.request_id_var`, so every log line
written while serving the request carries it. Pure ASGI, not `BaseHTTPMiddleware`: the
latter adds a task and a memory stream per request.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stator.frontend.metrics import FrontendMetrics
from stator.frontend.openai.streaming import RAW_SEND_KEY
from stator.logs import request_id_var

_VALID_ID = re.compile(rb"^[A-Za-z0-9._:\-]{1,128}$")
_HEADER = b"x-request-id"
_KNOWN_PATHS = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/live",
    "/metrics",
}


def endpoint_label(path: str) -> str:
    """A bounded label for the requests counter (never the raw path of a 404)."""
    if path in _KNOWN_PATHS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "other"


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: FrontendMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == _HEADER), None)
        rid = raw.decode() if raw is not None and _VALID_ID.match(raw) else uuid.uuid4().hex
        token = request_id_var.set(rid)
        rid_bytes = rid.encode()
        # Streaming bodies skip the wrappers inside this one (see `SSEResponse`): once the
        # headers went out through the full chain, each token's chunk goes straight here.
        scope[RAW_SEND_KEY] = send
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (_HEADER, rid_bytes)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)
            self.metrics.count_request(endpoint_label(scope["path"]), status)
