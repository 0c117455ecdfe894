"""The global router's flags and its standalone process.

Standalone (`stator global-router`), it stands in front of the pools as one worker of the
frontend's namespace: it serves `{namespace}.global_router.generate` and publishes a card
for every model the pools serve, so an unmodified `stator frontend` routes to it and it
picks the pool. Embedded (`stator frontend --global-router-config`), the frontend serves
the pools' models itself and each request goes through the same `GlobalRouter`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
from prometheus_client import CollectorRegistry

from stator.config import option
from stator.global_router.config import load_config
from stator.global_router.router import GlobalRouter
from stator.protocols import EngineRequest
from stator.router import RouterConfig
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.names import EndpointName

log = logging.getLogger(__name__)


@dataclass
class GlobalRouterConfig:
    global_router_config: str | None = option(
        None,
        "Pool-selection config, JSON or YAML (Dynamo's format): pick a pool per request "
        "from the ISL×TTFT and context×ITL grids (docs/global_router.md)",
        metavar="FILE",
    )
    default_ttft_target: float | None = option(
        None, "TTFT target in ms for requests that give none (none: the grid's midpoint)"
    )
    default_itl_target: float | None = option(
        None, "ITL target in ms for requests that give none (none: the grid's midpoint)"
    )


def build_global_router(
    config: GlobalRouterConfig,
    runtime_config: RuntimeConfig,
    router_config: RouterConfig,
    registry: CollectorRegistry | None = None,
) -> GlobalRouter:
    """Raises `ConfigError` (a ValueError) for a bad config file."""
    if not config.global_router_config:
        raise ValueError("--global-router-config is required")
    return GlobalRouter(
        load_config(config.global_router_config),
        runtime_config,
        router_config,
        default_ttft_ms=config.default_ttft_target,
        default_itl_ms=config.default_itl_target,
        registry=registry,
    )


async def serve_global_router(
    runtime: Runtime, global_router: GlobalRouter, component: str = "global_router"
) -> None:
    """Serve `global_router` as a worker of `runtime`'s namespace until cancelled: one
    generate endpoint, and a model card per model the pools serve (kept in step with
    them)."""
    endpoint = EndpointName(runtime.namespace, component, "generate")

    async def handle(request: EngineRequest):
        async for output in global_router.generate(request):
            yield output

    await runtime.serve(endpoint, handle, EngineRequest)
    published: dict[str, str] = {}
    while True:
        changed = global_router.changed_event()
        models = global_router.models()
        for name, card in models.items():
            if name not in published:
                card = msgspec.structs.replace(card, role="aggregated")
                published[name] = await runtime.publish_model_card(
                    endpoint, card, suffix=f"model-{name}" if published else None
                )
                log.info("global router: serving model %s", name)
        for name in [n for n in published if n not in models]:
            await runtime.remove_model_card(published.pop(name))
            log.info("global router: model %s has no pool any more", name)
        await changed.wait()


async def run_standalone(
    config: GlobalRouterConfig, runtime_config: RuntimeConfig, router_config: RouterConfig
) -> int:
    """`stator global-router`: serve until SIGTERM, then drain (in-flight requests finish)."""
    from stator.runtime import Lifecycle

    global_router = build_global_router(config, runtime_config, router_config)
    runtime = await Runtime.create(runtime_config)
    await global_router.start()
    lifecycle = Lifecycle(runtime, grace=runtime_config.graceful_shutdown_timeout)
    lifecycle.on_stop(global_router.close)
    return await lifecycle.run(serve_global_router(runtime, global_router))
