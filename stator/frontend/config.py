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
    processor: str = option(
        "stator",
        "Whose code renders chats, tokenizes, detokenizes and parses reasoning and tool "
        "calls: stator (its own) or vllm (vLLM's classes, as under `vllm serve`; needs "
        "vLLM installed here: pip install 'stator[vllm]')",
        choices=["stator", "vllm"],
    )
    responses_store_size: int = option(
        1024,
        "Responses kept in memory for `previous_response_id` (oldest evicted first)",
    )
    # -- security and limits (stator.frontend.http.security, stator.frontend.http.connections) --
    api_key: list[str] = option(
        [],
        "API key clients must send as `Authorization: Bearer KEY` (repeatable, or "
        "comma-separated); /live, /health and /metrics stay open",
        secret=True,
    )
    api_key_file: str | None = option(
        None, "File of API keys, one per line (# comments), in addition to --api-key"
    )
    metrics_auth: bool = option(False, "With API keys, /metrics needs a key too")
    allowed_origins: list[str] = option(
        [],
        "Origins (scheme://host:port) whose browser pages may POST here; others are "
        "refused with 403 (same-origin requests are always allowed)",
    )
    rate_limit_rps: float = option(
        0.0, "Requests per second one API key (or client address) may send; 0 = no limit"
    )
    rate_limit_burst: int = option(
        0, "Requests one key may send at once above --rate-limit-rps (0 = one second's)"
    )
    rate_limit_tpm: float = option(
        0.0,
        "Tokens (prompt + completion) per minute one API key (or client address) may use; "
        "0 = no limit",
    )
    max_body_bytes: int = option(
        8 << 20,
        "Largest request body in bytes (413 past it); the generation routes also take the "
        "largest prompt_embeds a served model accepts; 0 = no limit",
    )
    max_header_bytes: int = option(
        64 << 10, "Largest request head (request line and headers) in bytes (431 past it)"
    )
    max_connections: int = option(
        0,
        "Most open HTTP connections; one more gets a 503 and is closed (0 = 8192, or "
        "less when the open-files limit is lower)",
    )
    header_timeout: float = option(
        10.0, "Seconds a connection may take to send a request's headers (idle included)"
    )
    body_timeout: float = option(30.0, "Seconds a request may take to send its whole body")
    ssl_keyfile: str | None = option(None, "TLS private key (PEM): serve HTTPS")
    ssl_certfile: str | None = option(None, "TLS certificate chain (PEM) for --ssl-keyfile")
    ssl_ca_certs: str | None = option(None, "CA bundle (PEM) to verify client certificates against")
    ssl_client_cert: str = option(
        "none",
        "Client certificates: none | optional | required (verified with --ssl-ca-certs)",
        choices=["none", "optional", "required"],
    )
