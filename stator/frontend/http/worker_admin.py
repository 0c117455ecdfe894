"""Admin routes that act on workers, as vLLM's server offers them:

- `POST /v1/load_lora_adapter` `{"lora_name", "lora_path"}` and
  `POST /v1/unload_lora_adapter` `{"lora_name"}`: every worker of the base model loads
  (or drops) the adapter, which then appears in `/v1/models` under its own name. A load
  that fails on one worker is undone on the others, so no worker is left half-registered.
- `POST /sleep?level=1`, `POST /wake_up[?tags=...]`, `GET /is_sleeping`: put the workers
  of a model (`?model=`; default: every model) to sleep and wake them. The arguments may
  also come as a JSON object, which the edge's guard (`security.py`) wants for a POST
  outside /v1/ (`Content-Type: application/json`, e.g. `{}` or `{"level": 2}`). A sleeping worker
  leaves discovery, so this frontend remembers whom it put to sleep: it wakes them, and
  answers requests for a sleeping model with 503 instead of 404.

Each goes to the workers' admin endpoint (`stator.worker.admin`) as an `AdminRequest`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse, PlainTextResponse, Response

from stator.frontend import errors
from stator.frontend.pipelines.manager import ModelEntry, ModelManager
from stator.protocols import AdminRequest, AdminResponse
from stator.runtime import Client
from stator.runtime.names import EndpointName

log = logging.getLogger(__name__)

# How long a load waits for the adapter's model card to reach this frontend.
_CARD_WAIT_S = 10.0


class LoadLoraAdapter(BaseModel):
    lora_name: str
    lora_path: str
    # stator serves several models: which one the adapter is for (default: the only one).
    base_model: str | None = None


class UnloadLoraAdapter(BaseModel):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's field; names are what stator goes by


class WorkerAdmin:
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager
        self._clients: dict[EndpointName, Client] = {}
        # model -> (its endpoint, the workers this frontend put to sleep)
        self.sleeping: dict[str, tuple[EndpointName, list[int]]] = {}
        self._lock = asyncio.Lock()

    async def _client(self, endpoint: EndpointName) -> Client:
        client = self._clients.get(endpoint)
        if client is None:
            client = await self.manager.runtime.client(endpoint.sibling("admin"), AdminResponse)
            self._clients[endpoint] = client
        return client

    async def call_all(
        self, endpoint: EndpointName, op: str, args: dict[str, Any], ids: list[int] | None = None
    ) -> dict[int, AdminResponse]:
        """Send one admin op to workers `ids` (default: every live one) at once."""
        client = await self._client(endpoint)
        targets = client.instance_ids() if ids is None else ids

        async def one(wid: int) -> AdminResponse:
            try:
                answers = await client.call(wid, AdminRequest(op=op, args=args))
            except Exception as exc:
                return AdminResponse(ok=False, error=f"worker {wid:x}: {exc}")
            return answers[0] if answers else AdminResponse(ok=False, error="no answer")

        results = await asyncio.gather(*(one(w) for w in targets))
        return dict(zip(targets, results, strict=True))

    def base_entry(self, name: str | None) -> ModelEntry:
        bases = {n: e for n, e in self.manager.models.items() if e.card.base_model is None}
        if name is None:
            if len(bases) != 1:
                raise errors.bad_request(
                    f"name the base model (`base_model`): this server serves {sorted(bases)}",
                    param="base_model",
                )
            return next(iter(bases.values()))
        entry = bases.get(name)
        if entry is None:
            raise errors.model_not_found(name)
        return entry

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients = {}


def _failures(results: dict[int, AdminResponse]) -> list[str]:
    return [f"worker {wid:x}: {r.error}" for wid, r in results.items() if not r.ok]


def install_worker_admin_routes(app: FastAPI, manager: ModelManager) -> WorkerAdmin:
    admin = WorkerAdmin(manager)
    app.state.worker_admin = admin

    async def parse(request: Request, model: type[BaseModel]) -> Any:
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as exc:
            raise errors.validation_error(exc.errors()) from None

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await parse(request, LoadLoraAdapter)
        entry = admin.base_entry(body.base_model)
        if body.lora_name in manager.models and body.lora_name != entry.name:
            existing = manager.models[body.lora_name].card
            if existing.base_model != entry.name:
                raise errors.bad_request(
                    f"`{body.lora_name}` is already the name of another model", param="lora_name"
                )
        args = {"name": body.lora_name, "path": body.lora_path}
        results = await admin.call_all(entry.endpoint, "load_lora", args)
        if not results:
            raise errors.no_workers(entry.name)
        failed = _failures(results)
        if failed:
            done = [wid for wid, r in results.items() if r.ok]
            if done:  # undo it where it worked: all workers or none
                await admin.call_all(entry.endpoint, "unload_lora", {"name": body.lora_name}, done)
            raise errors.bad_request(
                f"Failed to load LoRA adapter `{body.lora_name}`: " + "; ".join(failed),
                param="lora_path",
            )
        try:
            await manager.wait_for_model(body.lora_name, _CARD_WAIT_S)
        except TimeoutError:
            log.warning("LoRA %s loaded, but its card has not arrived yet", body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await parse(request, UnloadLoraAdapter)
        entry = manager.models.get(body.lora_name)
        if entry is None or entry.card.base_model is None:
            raise errors.ApiError(
                404,
                f"The LoRA adapter `{body.lora_name}` is not loaded.",
                param="lora_name",
                code="lora_not_found",
            )
        results = await admin.call_all(entry.endpoint, "unload_lora", {"name": body.lora_name})
        loaded_somewhere = [r for r in results.values() if r.ok]
        if not loaded_somewhere:
            raise errors.bad_request(
                f"Failed to unload LoRA adapter `{body.lora_name}`: "
                + "; ".join(_failures(results))
            )
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    async def arguments(request: Request) -> dict[str, Any]:
        """vLLM's query parameters (`level`, `tags`, `model`), or the same as a JSON object
        (the edge refuses a state-changing POST outside /v1/ without a JSON body, so
        a cross-site form cannot put the fleet to sleep: `-d '{"level": 1}'`)."""
        params: dict[str, Any] = dict(request.query_params)
        if "tags" in request.query_params:
            params["tags"] = request.query_params.getlist("tags")
        raw = await request.body()
        if raw.strip():
            try:
                body = json.loads(raw)
            except ValueError:
                raise errors.bad_request("the body is not valid JSON") from None
            if not isinstance(body, dict):
                raise errors.bad_request("the body must be a JSON object")
            params.update(body)
        return params

    def models_named(model: str | None) -> list[ModelEntry]:
        if model is None:
            return [e for e in manager.models.values() if e.card.base_model is None]
        return [admin.base_entry(model)]

    @app.post("/sleep")
    async def sleep(request: Request) -> Response:
        params = await arguments(request)
        try:
            level = int(params.get("level", 1))
        except (TypeError, ValueError):
            raise errors.bad_request("level must be 1 or 2", param="level") from None
        if level not in (1, 2):
            raise errors.bad_request("level must be 1 or 2", param="level")
        async with admin._lock:
            for entry in models_named(params.get("model")):
                results = await admin.call_all(entry.endpoint, "sleep", {"level": level})
                asleep = [wid for wid, r in results.items() if r.ok]
                if asleep:
                    admin.sleeping[entry.name] = (entry.endpoint, asleep)
                failed = _failures(results)
                if failed:
                    raise errors.bad_request(f"Sleep failed: {'; '.join(failed)}")
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(request: Request) -> Response:
        params = await arguments(request)
        tags = params.get("tags") or None
        if isinstance(tags, str):
            tags = [tags]
        model = params.get("model")
        async with admin._lock:
            names = [model] if model is not None else list(admin.sleeping)
            failed: list[str] = []
            for name in names:
                record = admin.sleeping.get(name)
                if record is None:
                    continue
                endpoint, ids = record
                results = await admin.call_all(endpoint, "wake", {"tags": tags}, ids)
                failed.extend(_failures(results))
                if not failed:
                    del admin.sleeping[name]
            if failed:
                raise errors.bad_request(f"Wake up failed: {'; '.join(failed)}")
        for name in names:  # back in discovery: requests work once this returns
            try:
                await manager.wait_for_model(name, _CARD_WAIT_S)
            except TimeoutError:
                log.warning("woke %s, but its card has not arrived yet", name)
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": bool(admin.sleeping)})

    return admin


def sleeping_error(admin: WorkerAdmin | None, model: str) -> errors.ApiError | None:
    """The 503 for a request to a model whose workers sleep (None if it is not asleep)."""
    if admin is None or model not in admin.sleeping:
        return None
    return errors.ApiError(
        503,
        f"Model `{model}` is sleeping; wake it (POST /wake_up) and retry.",
        type="service_unavailable",
        code="model_sleeping",
    )
