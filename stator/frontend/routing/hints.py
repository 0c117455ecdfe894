"""Per-request routing hints from HTTP headers and the body's `nvext`.

`x-worker-instance-id: <id>` asks for one worker (its id as `/health` lists it, in hex; a
`0x` prefix or a decimal id with `0d` prefix are also accepted). The router sends the
request there when that worker is live (and `--router-mode direct` requires it). The hint
travels in a context variable, so that the pipeline deep below the route sees it without
threading it through every signature, as the request id does.
"""

from __future__ import annotations

import contextvars
from typing import Any

from starlette.requests import Request

from stator.frontend import errors
from stator.protocols import RoutingHints

WORKER_HEADER = "x-worker-instance-id"
TTFT_HEADER = "x-ttft-target"
ITL_HEADER = "x-itl-target"
target_worker_var: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "target_worker", default=None
)
# (ttft ms, itl ms) from the headers
targets_var: contextvars.ContextVar[tuple[float | None, float | None]] = contextvars.ContextVar(
    "latency_targets", default=(None, None)
)


def parse_worker_id(text: str) -> int:
    value = text.strip().lower()
    try:
        if value.startswith("0d"):
            return int(value[2:], 10)
        return int(value.removeprefix("0x"), 16)
    except ValueError:
        raise errors.bad_request(
            f"Header {WORKER_HEADER} must be a worker id as /health lists it (hex), got {text!r}.",
            param=WORKER_HEADER,
        ) from None


def parse_target_ms(text: str, header: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise errors.bad_request(
            f"Header {header} must be a positive number of milliseconds, got {text!r}.",
            param=header,
        )
    return value


def set_target_worker(request: Request) -> None:
    """Read this request's routing headers into `target_worker_var` and `targets_var`."""
    headers = request.headers
    raw = headers.get(WORKER_HEADER)
    target_worker_var.set(parse_worker_id(raw) if raw else None)
    ttft, itl = headers.get(TTFT_HEADER), headers.get(ITL_HEADER)
    targets_var.set(
        (
            parse_target_ms(ttft, TTFT_HEADER) if ttft else None,
            parse_target_ms(itl, ITL_HEADER) if itl else None,
        )
    )


def routing_hints(body: Any) -> tuple[RoutingHints | None, int]:
    """(routing hints, priority) of a chat or completions request body: the headers
    (context variables) and its `nvext`."""
    target = target_worker_var.get()
    ttft, itl = targets_var.get()
    priority = 0
    nvext = body.nvext
    if nvext is not None:
        ttft = nvext.ttft_target or ttft
        itl = nvext.itl_target or itl
        hinted = nvext.agent_hints.priority if nvext.agent_hints else None
        priority = nvext.priority if nvext.priority is not None else (hinted or 0)
    if target is None and ttft is None and itl is None:
        return None, priority
    hints = RoutingHints(target_worker_id=target, ttft_target_ms=ttft, itl_target_ms=itl)
    return hints, priority
