"""`DisaggRouter`: serves a model from prefill and decode workers when it has both.

It holds two `Router`s over the same card: one for the decode (or aggregated) workers the
model's card came from, one for the prefill workers (`NAMESPACE.prefill.generate`), each
with its own load tracking and, in kv mode, its own KV index fed by its own workers'
events. Per request it decides where the prompt is computed:

- remote: the prefill router runs `prefill_request` on a prefill worker, then the decode
  router sends `decode_request` to a decode worker (chosen by its load and by what it
  caches), which pulls the KV; the protocol is `stator.router.disagg_requests`;
- local (the plain decode router, as aggregated serving): no prefill worker is live, the
  uncached part of the prompt is under `--disagg-min-prefill-tokens`, every prefill
  worker has more than `--disagg-max-prefill-queue` prompt tokens queued, the request
  cannot be split, or the prefill worker failed before its answer.

With `--enforce-disagg` a request that should go remote but finds no prefill worker (or
loses it) fails with 503 instead of being prefilled locally. Every decision is counted in
`stator_router_disagg_requests_total{path, reason}` and logged at debug level.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from stator.protocols import AdminRequest, EngineOutput, EngineRequest
from stator.router.config import RouterConfig
from stator.router.disagg_requests import (
    as_part_of_original,
    decode_request,
    finished_at_prefill,
    first_output,
    is_handoff,
    prefill_request,
    wants_remote_prefill,
)
from stator.router.errors import Overloaded
from stator.router.router import Router, prompt_length
from stator.runtime import Client, Migratable, NoInstances

log = logging.getLogger(__name__)


class DisaggRouter:
    def __init__(
        self,
        decode: Router,
        prefill: Router | None,
        config: RouterConfig,
        *,
        prefill_admin: Client | None = None,
    ) -> None:
        self.decode = decode
        self.prefill = prefill
        self.config = config
        self.prefill_admin = prefill_admin
        self.model = decode.card.name
        self.metrics = decode.metrics
        self._releases: set[asyncio.Task] = set()
        self._disaggregated = False

    async def start(self) -> None:
        await self.decode.start()
        if self.prefill is not None:
            self.prefill.client.on_change(lambda wid, info: self._prefill_pool_changed())
            await self.prefill.start()
            self._prefill_pool_changed()

    def _prefill_pool_changed(self) -> None:
        count = len(self.prefill_workers())
        self.metrics.prefill_workers.labels(self.model).set(count)
        if count and not self._disaggregated:
            log.info(
                "model %s: %d prefill worker(s) live; disaggregated serving", self.model, count
            )
        elif not count and self._disaggregated:
            then = "requests fail with 503" if self.config.enforce_disagg else "aggregated serving"
            log.warning("model %s: no prefill worker left; %s", self.model, then)
        self._disaggregated = bool(count)

    async def close(self) -> None:
        for task in list(self._releases):
            task.cancel()
        if self.prefill is not None:
            await self.prefill.close()
        await self.decode.close()

    # -- decisions -----------------------------------------------------------------

    def prefill_workers(self) -> list[int]:
        return [] if self.prefill is None else self.prefill.client.instance_ids()

    def route(self, request: EngineRequest) -> tuple[str, str]:
        """("remote" | "local", why). Pure apart from reading the routers' state."""
        reason = wants_remote_prefill(request)
        if reason is not None:
            return "local", reason
        workers = self.prefill_workers()
        self.metrics.prefill_workers.labels(self.model).set(len(workers))
        if not workers:
            return "local", "no_prefill_workers"
        assert self.prefill is not None
        uncached = prompt_length(request) - self._decode_cached_tokens(request)
        if uncached < self.config.disagg_min_prefill_tokens:
            return "local", "short_prompt"
        queue = min(self.prefill.load.load((wid, 0)).queued_prefill_tokens for wid in workers)
        self.metrics.prefill_queue_tokens.labels(self.model).set(queue)
        limit = self.config.disagg_max_prefill_queue
        if limit > 0 and queue > limit:
            return "local", "prefill_queue"
        return "remote", "prefill"

    def _decode_cached_tokens(self, request: EngineRequest) -> int:
        """The most prompt tokens one decode worker already caches (kv mode with events;
        0 otherwise: the router cannot tell)."""
        index = self.decode.index
        if index is None or not request.token_ids:
            return 0
        matches = index.find_matches(self.decode._hashes(request))
        return max(matches.values(), default=0) * self.decode.block_size

    def _count(self, path: str, reason: str, request: EngineRequest) -> None:
        self.metrics.disagg_requests.labels(self.model, path, reason).inc()
        log.debug("request %s: %s prefill (%s)", request.request_id, path, reason)

    # -- serving -------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        path, reason = self.route(request)
        if path == "local":
            if reason == "no_prefill_workers" and self.config.enforce_disagg:
                self._count("rejected", reason, request)
                raise NoInstances(f"no prefill worker serves {request.model} (--enforce-disagg)")
            self._count(path, reason, request)
            async for output in self.decode.generate(request):
                yield output
            return
        async for output in self._remote(request):
            yield output

    async def _remote(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        assert self.prefill is not None
        final: EngineOutput | None = None
        try:
            async for output in self.prefill.generate(prefill_request(request)):
                if output.finish_reason is not None:
                    final = output
        except BaseException as exc:
            if final is not None and is_handoff(final):
                # Its answer came (the KV is pinned) but its stream did not end: the
                # client left, or the stream broke. Nobody will pull it: unpin it now.
                assert final.disagg is not None
                self._release(
                    final.disagg.prefill_worker_id, final.disagg.prefill_request_id, False
                )
            elif isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                # The client left before the answer came. The prefill worker frees what it
                # has unless its answer was already on its way here (then it pinned the KV
                # under the request's id for a decode worker that will never come): ask
                # every prefill worker to unpin that id (a no-op where nothing is pinned).
                # The prefill may also still run there: `later` makes the worker drop a
                # pin it makes under that id soon (its abort can come after it pinned).
                for worker_id in list(self.prefill_admin.instances if self.prefill_admin else []):
                    self._release(worker_id, request.request_id, True, later=True)
            if not isinstance(exc, (Migratable, NoInstances, Overloaded)):
                raise
            if self.config.enforce_disagg:
                self._count("rejected", "prefill_failed", request)
                raise NoInstances(f"the prefill worker failed: {exc}") from exc
            log.warning(
                "request %s: prefill worker failed (%s); prefilling on a decode worker",
                request.request_id,
                exc,
            )
            self._count("local", "prefill_failed", request)
            async for output in self.decode.generate(request):
                yield output
            return
        if final is None:
            raise Migratable("the prefill worker's stream ended without an answer")
        if not is_handoff(final):
            # The first token ended the request (or the worker reported an error).
            self._count("remote", "finished_at_prefill", request)
            yield finished_at_prefill(final, request)
            return
        self._count("remote", "prefill", request)
        params = final.disagg
        assert params is not None
        first = first_output(final)
        handed_over = finished = False
        try:
            yield first
            decode = decode_request(request, final, params)
            stream = self.decode.generate(decode)
            handed_over = True
            try:
                async for output in stream:
                    finished = output.finish_reason is not None
                    yield as_part_of_original(output, request, final)
            finally:
                await stream.aclose()
        finally:
            if not finished:
                # The client left between the two halves, or while the decode request was
                # on its way (queued here, in transit, not yet admitted there): unpin the
                # prefill's KV now rather than at its timeout. Once handed over, a decode
                # worker may be reading it: then the pin stays, and that worker releases
                # it when its copy is over.
                pin = params.prefill_request_id
                self._release(params.prefill_worker_id, pin, unless_claimed=handed_over)

    def _release(
        self,
        worker_id: int | None,
        prefill_request_id: str | None,
        unless_claimed: bool,
        later: bool = False,
    ) -> None:
        admin = self.prefill_admin
        if admin is None or worker_id is None or prefill_request_id is None:
            return
        if worker_id not in admin.instances:
            return

        async def release() -> None:
            try:
                args = {"id": prefill_request_id, "unless_claimed": unless_claimed}
                if later:
                    args["later"] = True
                request = AdminRequest(op="kv_release", args=args)
                await asyncio.wait_for(admin.call(worker_id, request), 5.0)
            except Exception as exc:  # the prefill worker's timeout releases it anyway
                log.debug("kv_release of %s failed: %s", prefill_request_id, exc)

        task = asyncio.get_running_loop().create_task(release(), name="kv release")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)


__all__ = ["DisaggRouter"]
