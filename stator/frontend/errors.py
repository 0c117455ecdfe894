"""OpenAI's error object, and the status code each failure gets.

Every failure the HTTP edge reports is an `ApiError`; the handlers installed by
`install_error_handlers` turn it (and FastAPI's own validation and HTTP errors) into
`{"error": {"message", "type", "param", "code"}}` with the right status. Bad input is
never a 500: FastAPI's 422 for schema errors becomes OpenAI's 400 naming the parameter.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from stator.protocols import INVALID_REQUEST

log = logging.getLogger(__name__)


class ApiError(Exception):
    """A failure to report to the client as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> Response:
        return Response(
            msgspec.json.encode(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist.",
        param="model",
        code="model_not_found",
    )


def no_workers(model: str, detail: str = "") -> ApiError:
    return ApiError(
        503,
        f"No live worker serves model `{model}` right now{detail}; retry later.",
        type="service_unavailable",
        code="no_instances",
        # Workers come back (or others are started) on the scale of a discovery TTL.
        headers={"Retry-After": "2"},
    )


def overloaded(message: str, retry_after: float) -> ApiError:
    return ApiError(
        503,
        f"The server is overloaded: {message}",
        type="service_unavailable",
        code="overloaded",
        headers={"Retry-After": str(max(1, math.ceil(retry_after)))},
    )


def engine_failed(message: str) -> ApiError:
    # The request was fine; a worker failed it. 500 is honest here: it is our fault.
    return ApiError(500, message, type="internal_server_error", code="engine_error")


def engine_failed_from(exc: Exception) -> ApiError:
    """The error for a choice's `EngineFailed`: a 400 when the engine refused the request
    (`EngineOutput.error_code`), else a 500."""
    if getattr(exc, "code", None) == INVALID_REQUEST:
        return bad_request(f"The engine refused the request: {exc}", code="invalid_request")
    return engine_failed(f"The worker failed the request: {exc}")


def model_error(message: str) -> ApiError:
    """The model's output breaks the request's contract (e.g. `tool_choice: required` and
    no call). OpenAI answers such output with a 500 of type `model_error` ("The model
    produced invalid content"): the request was valid, a retry may succeed."""
    return ApiError(500, message, type="model_error", code="invalid_model_output")


def _param_from_location(loc: tuple[Any, ...]) -> str | None:
    """`("body", "messages", 0, "role")` -> `messages[0].role`."""
    parts = [p for p in loc if p != "body"]
    # Pydantic names the union member it tried (e.g. `str`, `list[int]`); drop those.
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or part in ("str", "int", "float", "bool", "list", "dict"):
            continue
        else:
            out += f".{part}" if out else part
    return out or None


# Error types of checks across fields, and the parameter each names.
WHOLE_BODY_ERRORS = {"too_many_choices": "n"}


def validation_error(errors: list[dict[str, Any]] | Any) -> ApiError:
    """OpenAI's 400 for pydantic's (or FastAPI's) validation errors, naming the first bad
    parameter."""
    if isinstance(errors, RequestValidationError):
        errors = errors.errors()
    if not errors:
        return bad_request("Invalid request body.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", "")
        return bad_request(
            f"The request body is not valid JSON: {detail}".rstrip(": "), code="invalid_json"
        )
    loc = tuple(p for p in first.get("loc", ()) if p != "body")
    if not loc and first.get("type") in WHOLE_BODY_ERRORS:
        # A check across fields (a model validator): its message says what is wrong.
        param = WHOLE_BODY_ERRORS[first["type"]]
        return bad_request(
            first.get("msg", "invalid request"), param=param, code="invalid_parameter"
        )
    if not loc:
        return bad_request("The request body must be a JSON object.", code="invalid_json")
    param = _param_from_location(loc)
    message = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    else:
        message = f"Invalid value for '{param}': {message}."
    return bad_request(message, param=param, code="invalid_parameter")


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def on_validation(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return validation_error(exc).response()

    async def on_http(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return ApiError(exc.status_code, str(exc.detail), type=kind).response()

    async def on_unexpected(_request: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return ApiError(
            500, f"Internal error: {type(exc).__name__}", type="internal_server_error"
        ).response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
