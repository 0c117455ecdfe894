"""Per-request routing hints from HTTP headers.

`x-worker-instance-id: <id>` asks for one worker (its id as `/health` lists it, in hex; a
`0x` prefix or a decimal id with `0d` prefix are also accepted). The router sends the
request there when that worker is live (and `--router-mode direct` requires it). The hint
travels in a context variable, so that the pipeline deep below the route sees it without
threading it through every signature, as the request id does.
"""

from __future__ import annotations

import contextvars

from starlette.requests import Request

from stator.frontend import errors

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
