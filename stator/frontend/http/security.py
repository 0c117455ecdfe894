"""The HTTP edge's guard: API keys, cross-site requests, per-key rate limits, body size.

One pure-ASGI middleware (`HttpGuard`), inside the request-context one (so its refusals
carry a request id and are counted). What it answers, each as an OpenAI error object:

- 401 without `Authorization: Bearer <key>` for one of the keys, on every route but
  `/live`, `/health` and (unless `--metrics-auth`) `/metrics`.
- 403 for a state-changing request a browser sent from another origin (an `Origin` that is
  not this server's and not in `--allowed-origins`): a web page must not be able to set
  busy thresholds to 0 with one cross-site POST. 415 for an admin POST whose body is not
  declared JSON (what a cross-site "simple" request would send).
- 429 with `Retry-After` past `--rate-limit-rps` requests per second for one key (or one
  client address without keys), or while the key is past `--rate-limit-tpm` tokens (prompt
  and completion) per minute: a request's tokens are charged when it finishes, and the
  key's next request waits until its budget is back above zero.
- 413 for a body over `--max-body-bytes` (or what the largest `prompt_embeds` of a served
  model needs, for the generation routes): refused from `Content-Length` before reading,
  or as soon as a chunked body passes the limit.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stator.frontend.errors import ApiError

OPEN_PATHS = frozenset({"/live", "/health"})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Rate-limit buckets kept (least recently used evicted): bounds memory under address churn.
_MAX_BUCKETS = 65536


def load_api_keys(keys: Iterable[str], key_file: str | None) -> frozenset[str]:
    """The keys from `--api-key` and `--api-key-file` (one per line; `#` comments)."""
    found = {k.strip() for k in keys if k.strip()}
    if key_file:
        for line in Path(key_file).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                found.add(line)
    return frozenset(found)


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None):
    kind = {
        401: "authentication_error",
        403: "permission_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error")
    return ApiError(status, message, type=kind, code=code, headers=headers)


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"The request body is larger than this server accepts ({limit} bytes).",
            code="request_too_large",
        )


# Set for each request under --rate-limit-tpm: charge(tokens) debits its key's budget
# (`GenerationTracker.finish` calls it).
TOKEN_CHARGE: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "stator_token_charge", default=None
)


class TokenBudget:
    """Per-identity token budgets refilled at `per_minute / 60` a second, up to one
    minute's worth; spending may take a budget below zero (a request's tokens are known
    only at its end). Pure: the clock is passed in."""

    def __init__(self, per_minute: float) -> None:
        self.rate = per_minute / 60.0
        self.cap = per_minute
        self._budgets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def _refilled(self, identity: bytes, now: float) -> float:
        left, last = self._budgets.pop(identity, (self.cap, now))
        return min(self.cap, left + (now - last) * self.rate)

    def wait(self, identity: bytes, now: float) -> float:
        """0 when the key may send a request now, else the seconds until it may."""
        left = self._refilled(identity, now)
        self._keep(identity, left, now)
        return 0.0 if left > 0 else (1.0 - left) / self.rate

    def spend(self, identity: bytes, now: float, tokens: int) -> None:
        self._keep(identity, self._refilled(identity, now) - tokens, now)

    def _keep(self, identity: bytes, left: float, now: float) -> None:
        self._budgets[identity] = (left, now)
        if len(self._budgets) > _MAX_BUCKETS:
            self._budgets.popitem(last=False)


class TokenBuckets:
    """Per-identity token buckets: `rate` per second, bursts up to `burst`. Pure: the
    clock is passed in."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def take(self, identity: bytes, now: float, cost: float = 1.0) -> float:
        """0 when the request may go, else the seconds until it could."""
        tokens, last = self._buckets.pop(identity, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0
        if tokens >= cost:
            tokens -= cost
        else:
            wait = (cost - tokens) / self.rate
        self._buckets[identity] = (tokens, now)
        if len(self._buckets) > _MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return wait


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _same_origin(origin: bytes, scope: Scope) -> bool:
    host = _header(scope, b"host")
    try:
        netloc = urlsplit(origin.decode("latin-1")).netloc
    except ValueError:
        return False
    return host is not None and netloc.lower() == host.decode("latin-1").lower()


class HttpGuard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        api_keys: frozenset[str] = frozenset(),
        metrics_auth: bool = False,
        allowed_origins: Iterable[str] = (),
        rate_limit_rps: float = 0.0,
        rate_limit_burst: int = 0,
        rate_limit_tpm: float = 0.0,
        max_body_bytes: int = 0,
        generation_body_bytes: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        # Keys are compared as digests: equal lengths for compare_digest, and the keys
        # themselves are not kept around in this object.
        self.key_digests = [hashlib.sha256(k.encode()).digest() for k in api_keys]
        self.open_paths = OPEN_PATHS if metrics_auth else OPEN_PATHS | {"/metrics"}
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.buckets = (
            TokenBuckets(rate_limit_rps, rate_limit_burst or math.ceil(rate_limit_rps))
            if rate_limit_rps > 0
            else None
        )
        self.tokens = TokenBudget(rate_limit_tpm) if rate_limit_tpm > 0 else None
        self.max_body_bytes = max_body_bytes
        self.generation_body_bytes = generation_body_bytes
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            identity = self._check(scope)
            if self.buckets is not None:
                wait = self.buckets.take(identity, self.clock())
                if wait > 0:
                    raise _error(
                        429,
                        "Rate limit reached for requests; retry later.",
                        "rate_limit_exceeded",
                        {"Retry-After": str(max(1, math.ceil(wait)))},
                    )
            charge = None
            if self.tokens is not None and scope["path"].startswith("/v1/"):
                wait = self.tokens.wait(identity, self.clock())
                if wait > 0:
                    raise _error(
                        429,
                        "Rate limit reached for tokens per minute; retry later.",
                        "rate_limit_exceeded",
                        {"Retry-After": str(max(1, math.ceil(wait)))},
                    )
                budget, clock = self.tokens, self.clock

                def charge(tokens: int, identity: bytes = identity) -> None:
                    budget.spend(identity, clock(), tokens)

            limit = self._body_limit(scope["path"])
            if limit:
                receive = self._limited(scope, receive, limit)
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        if charge is None:
            await self.app(scope, receive, send)
            return
        token = TOKEN_CHARGE.set(charge)
        try:
            await self.app(scope, receive, send)
        finally:
            TOKEN_CHARGE.reset(token)

    def _check(self, scope: Scope) -> bytes:
        """Raise the refusal of this request, or return its rate-limit identity."""
        path = scope["path"]
        method = scope["method"]
        identity = b""
        if self.key_digests and path not in self.open_paths:
            given = _header(scope, b"authorization") or b""
            scheme, _, token = given.partition(b" ")
            digest = hashlib.sha256(token.strip()).digest()
            # Every key is compared (no early exit): the time taken says nothing.
            ok = scheme.lower() == b"bearer" and token.strip() != b""
            ok = sum(hmac.compare_digest(digest, d) for d in self.key_digests) > 0 and ok
            if not ok:
                raise _error(
                    401,
                    "Missing or incorrect API key: send `Authorization: Bearer <key>`.",
                    "invalid_api_key",
                    {"WWW-Authenticate": "Bearer"},
                )
            identity = digest
        if method not in _SAFE_METHODS:
            self._check_origin(scope)
            if not path.startswith("/v1/"):
                kind = (_header(scope, b"content-type") or b"").split(b";")[0].strip()
                if kind.lower() != b"application/json":
                    raise ApiError(
                        415,
                        "This endpoint takes a JSON body (Content-Type: application/json).",
                        code="unsupported_media_type",
                    )
        if not identity:
            client = scope.get("client")
            identity = (client[0] if client else "").encode()
        return identity

    def _check_origin(self, scope: Scope) -> None:
        site = _header(scope, b"sec-fetch-site")
        origin = _header(scope, b"origin")
        cross = site == b"cross-site"
        if origin is not None and not _same_origin(origin, scope):
            cross = True
        if cross and (origin or b"").decode("latin-1").rstrip("/").lower() in (
            self.allowed_origins or ()
        ):
            cross = False
        if cross:
            raise _error(
                403,
                "Cross-origin requests may not change state here (see --allowed-origins).",
                "cross_origin_refused",
            )

    def _body_limit(self, path: str) -> int:
        limit = self.max_body_bytes
        if limit and self.generation_body_bytes is not None and path.startswith("/v1/"):
            limit = max(limit, self.generation_body_bytes())
        return limit

    def _limited(self, scope: Scope, receive: Receive, limit: int) -> Receive:
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                raise ApiError(400, "Invalid Content-Length header.", code="bad_request") from None
            if declared > limit:
                raise BodyTooLarge(limit)
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        return limited


__all__ = [
    "TOKEN_CHARGE",
    "BodyTooLarge",
    "HttpGuard",
    "TokenBuckets",
    "TokenBudget",
    "load_api_keys",
]
