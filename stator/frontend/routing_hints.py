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
target_worker_var: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "target_worker", default=None
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


def set_target_worker(request: Request) -> None:
    """Read the header of this request into `target_worker_var` (None when absent)."""
    raw = request.headers.get(WORKER_HEADER)
    target_worker_var.set(parse_worker_id(raw) if raw else None)
