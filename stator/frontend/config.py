"""Frontend configuration (flags of `stator frontend` and `stator run`)."""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option


@dataclass
class FrontendConfig:
    # --host/--port: `stator run`'s older names. On `stator frontend`, --host stays the
    # runtime's (the address of the TCP planes), so there only --port is an alias.
    http_host: str = option(
        "127.0.0.1", "Address the HTTP server binds (0.0.0.0: all)", aliases=("--host",)
    )
    http_port: int = option(8000, "HTTP port (0 = any free port)", aliases=("--port",))
    access_log: bool = option(False, "Log every HTTP request (uvicorn's access log)")
    model_wait_timeout: float = option(
        0.0,
        "Seconds a request for an unknown model waits for it to appear before a 404",
    )
    responses_store_size: int = option(
        1024,
        "Responses kept in memory for `previous_response_id` (oldest evicted first)",
    )
