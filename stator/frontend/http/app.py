"""The FastAPI app: OpenAI routes, models, health, liveness and metrics.

`create_app(manager, metrics, config)` builds it around a running `ModelManager`; the
serving (uvicorn) lives in `server.py`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TypeVar

from fastapi import FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.routing import Route

from stator.frontend import errors
from stator.frontend.config import FrontendConfig
from stator.frontend.http.busy_threshold import install_busy_threshold_routes
from stator.frontend.http.request_context import RequestContextMiddleware
from stator.frontend.http.security import HttpGuard, load_api_keys
from stator.frontend.http.worker_admin import install_worker_admin_routes, sleeping_error
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.openai.chat import create_chat_completion
from stator.frontend.openai.completions import create_completion
from stator.frontend.openai.objects import ModelList, ModelObject, to_json
from stator.frontend.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    SamplingFields,
)
from stator.frontend.openai.responses_api import create_response
from stator.frontend.pipelines.manager import ModelManager
from stator.frontend.pipelines.pipeline import ModelPipeline
from stator.frontend.routing.hints import set_target_worker
from stator.llm.responses import InMemoryResponseStore
from stator.logs import request_id_var

log = logging.getLogger(__name__)


Body = TypeVar("Body", bound=BaseModel)


async def _parse(request: Request, model: type[Body]) -> Body:
    raw = await request.body()
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        raise errors.validation_error(exc.errors()) from None
    if isinstance(body, SamplingFields):
        body._raw = raw
    return body


_SCHEMA_REF = "#/components/schemas/{model}"


def _operation(path: str, model: type[BaseModel]) -> dict:
    """The OpenAPI operation of a generation route (what FastAPI would generate for it,
    with the self-parsed body's schema as the request body)."""
    name = path.removeprefix("/v1/").replace("/", "_")
    return {
        "summary": name.replace("_", " ").title(),
        "operationId": f"{name}_post",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _SCHEMA_REF.format(model=model.__name__)}}
            },
        },
        "responses": {
            "200": {
                "description": "A JSON response, or server-sent events when streaming",
                "content": {"application/json": {"schema": {}}, "text/event-stream": {}},
            }
        },
    }


def _install_openapi(app: FastAPI, routes: list[tuple[str, type[BaseModel]]]) -> None:
    """Add the generation routes (plain Starlette routes, which FastAPI does not
    document) and their request bodies' schemas to the generated document."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = generate()
            paths = document.setdefault("paths", {})
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for path, model in routes:
                paths[path] = {"post": _operation(path, model)}
                schema = model.model_json_schema(ref_template=_SCHEMA_REF)
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
        return app.openapi_schema or document

    app.openapi = openapi  # type: ignore[method-assign]


def _json(obj: object, status: int = 200) -> Response:
    return Response(to_json(obj), status_code=status, media_type="application/json")


def create_app(
    manager: ModelManager, metrics: FrontendMetrics, config: FrontendConfig | None = None
) -> FastAPI:
    config = config or FrontendConfig()
    app = FastAPI(
        title="stator",
        description="OpenAI-compatible LLM serving",
        version="0.1.0",
    )
    errors.install_error_handlers(app)

    def prompt_embeds_body_bytes() -> int:
        # base64 (4/3) of float32 embeddings for a full context, plus room for the rest.
        sizes = [
            e.card.context_length * e.card.prompt_embeds_hidden_size * 4 * 4 // 3 + (1 << 20)
            for e in manager.models.values()
            if e.card.prompt_embeds_hidden_size
        ]
        return max(sizes, default=0)

    # Added first, so it runs inside the request-context middleware (ids and counts).
    app.add_middleware(
        HttpGuard,
        api_keys=load_api_keys(config.api_key, config.api_key_file),
        metrics_auth=config.metrics_auth,
        allowed_origins=config.allowed_origins,
        rate_limit_rps=config.rate_limit_rps,
        rate_limit_burst=config.rate_limit_burst,
        rate_limit_tpm=config.rate_limit_tpm,
        max_body_bytes=config.max_body_bytes,
        generation_body_bytes=prompt_embeds_body_bytes,
    )
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    app.state.manager = manager
    app.state.metrics = metrics
    app.state.response_store = InMemoryResponseStore(config.responses_store_size)

    worker_admin = install_worker_admin_routes(app, manager)

    async def resolve(model: str) -> ModelPipeline:
        if model not in manager.models and config.model_wait_timeout > 0:
            try:
                await manager.wait_for_model(model, config.model_wait_timeout)
            except TimeoutError:
                pass
        try:
            pipeline = await manager.pipeline(model)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("cannot build the pipeline of %s", model)
            raise errors.ApiError(
                500,
                f"Model `{model}` cannot be served: its files failed to load ({exc}).",
                type="internal_server_error",
                code="model_load_failed",
            ) from exc
        if pipeline is None:
            raise sleeping_error(worker_admin, model) or errors.model_not_found(model)
        return pipeline

    # The generation routes parse their body themselves: pydantic-core validates the raw
    # JSON in one pass, where FastAPI's body handling (json.loads, then validation, then
    # its dependency machinery) cost several times more per request. They are plain
    # Starlette routes for the same reason (FastAPI's per-request dependency solving
    # and exit stacks cost about 60 µs on a request's path to its first token); errors
    # still go through the app's exception handlers, and `_install_openapi` publishes
    # their schemas in /openapi.json.
    async def chat_completions(request: Request) -> Response:
        set_target_worker(request)
        body = await _parse(request, ChatCompletionRequest)
        pipeline = await resolve(body.model)
        return await create_chat_completion(body, pipeline, request_id_var.get(), request.receive)

    async def completions(request: Request) -> Response:
        set_target_worker(request)
        body = await _parse(request, CompletionRequest)
        pipeline = await resolve(body.model)
        return await create_completion(body, pipeline, request_id_var.get(), request.receive)

    async def responses(request: Request) -> Response:
        set_target_worker(request)
        body = await _parse(request, ResponsesRequest)
        pipeline = await resolve(body.model)
        return await create_response(
            body, pipeline, app.state.response_store, request_id_var.get(), request.receive
        )

    generation_routes = [
        ("/v1/chat/completions", chat_completions, ChatCompletionRequest),
        ("/v1/completions", completions, CompletionRequest),
        ("/v1/responses", responses, ResponsesRequest),
    ]
    # First in the route list: every request is matched against the routes in order.
    for path, endpoint, _ in reversed(generation_routes):
        app.router.routes.insert(0, Route(path, endpoint, methods=["POST"]))

    def model_object(name: str) -> ModelObject:
        entry = manager.models[name]
        obj = ModelObject(id=name, created=entry.created, max_model_len=entry.card.context_length)
        if entry.card.base_model:  # a LoRA adapter, listed as vLLM lists it
            obj.parent = entry.card.base_model
        return obj

    @app.get("/v1/models")
    async def list_models() -> Response:
        return _json(ModelList(data=[model_object(name) for name in manager.names()]))

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> Response:
        if model_id not in manager.models:
            raise errors.model_not_found(model_id)
        return _json(model_object(model_id))

    @app.get("/health")
    async def health() -> Response:
        instances = manager.live_instances()
        live = any(instances.values())
        body = {
            "status": "healthy" if live else "unhealthy",
            "models": sorted(instances),
            "instances": {m: [f"{i:x}" for i in ids] for m, ids in instances.items()},
        }
        return _json(body, 200 if live else 503)

    @app.get("/live")
    async def live() -> Response:
        return _json({"status": "live"})

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    install_busy_threshold_routes(app, manager)
    _install_openapi(app, [(path, model) for path, _, model in generation_routes])
    return app
