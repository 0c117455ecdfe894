"""`GET/POST /busy_threshold`: read and change each model's load-shedding thresholds at
run time (Dynamo's endpoint of the same name and body)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from stator.frontend import errors
from stator.frontend.pipelines.manager import ModelManager


class BusyThresholdUpdate(BaseModel):
    model: str
    # Omitted: unchanged; null: that threshold off.
    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None


def install_busy_threshold_routes(app: FastAPI, manager: ModelManager) -> None:
    @app.get("/busy_threshold")
    async def get_thresholds() -> JSONResponse:
        rows = []
        for name in manager.names():
            pipeline = await manager.pipeline(name)
            if pipeline is not None:
                rows.append({"model": name, **pipeline.router.busy_thresholds()})
        return JSONResponse({"thresholds": rows})

    @app.post("/busy_threshold")
    async def set_thresholds(request: Request) -> JSONResponse:
        try:
            update = BusyThresholdUpdate.model_validate_json(await request.body())
        except ValidationError as exc:
            raise errors.validation_error(exc.errors()) from None
        pipeline = await manager.pipeline(update.model)
        if pipeline is None:
            raise errors.model_not_found(update.model)
        changes = update.model_dump(exclude_unset=True, exclude={"model"})
        try:
            values = pipeline.router.set_busy_thresholds(**changes)
        except ValueError as exc:
            raise errors.bad_request(str(exc)) from exc
        return JSONResponse({"model": update.model, **values})
