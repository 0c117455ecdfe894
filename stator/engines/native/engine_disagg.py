"""Disaggregated serving in the in-process `NativeEngine` (mixed into it): the KV
transfer agent, and the pull of a decode request's prompt KV from its prefill worker."""

from __future__ import annotations

import contextlib
import logging

from stator.engines.base import EngineDead, EngineError
from stator.engines.native import rank_transfer
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.kv_handoff import ImportPlan
from stator.kv.transfer.agent import KvTransferAgent
from stator.protocols import DisaggParams

log = logging.getLogger("stator.engines.native.engine")


class DisaggServing:
    rank_agents: list[dict]

    async def _start_transfer(self, core: EngineCore) -> None:
        pool = getattr(core.runner, "kv_pool", None)
        if pool is None:
            raise EngineError(f"--role {self.role} needs the KV cache in one pool")
        core.exports.timeout = self.kv_transfer.timeout
        self.agent = KvTransferAgent(
            self.kv_transfer,
            pool,
            pins=core.pinned,
            release=self.release_kv,
            claim=core.claim_export,
        )
        size = self.config.tensor_parallel_size
        if size > 1:  # one agent per rank, each on its own heads' pool (rank_transfer.py)
            store = core.runner.group.store
            self.rank_agents = await rank_transfer.start_rank_agents(store, size, self.kv_transfer)
        if self.role == "prefill":
            await self.agent.serve()
            core.transfer_info = self.agent.describe()
            if self.rank_agents:
                core.transfer_info["ranks"] = self.rank_agents

    # -- disaggregated serving -----------------------------------------------------------

    async def _import(self, disagg: DisaggParams, plan: ImportPlan) -> None:
        """Pull the plan's blocks from the prefill worker, then schedule the request (with
        its prompt computed, or to compute it here if the pull failed), then unpin."""
        assert self.agent is not None and disagg.prefill_request_id is not None
        core = self._core()
        ok = False
        try:
            if plan.remote:
                args = (disagg.transfer, disagg.prefill_request_id, plan.remote, plan.local)
                self.transfers.begin()
                try:
                    if self.rank_agents:
                        result = await rank_transfer.pull_all_ranks(
                            self.agent, self.rank_agents, *args
                        )
                    else:
                        result = await self.agent.pull(*args)
                finally:
                    self.transfers.end()
                self.transfers.record(result)
                log.debug(
                    "request %s: pulled %d blocks (%d cached here) by %s in %.2f ms",
                    plan.request_id,
                    result.blocks,
                    plan.num_cached_blocks,
                    result.kind,
                    result.seconds * 1e3,
                )
            ok = True
        except Exception as exc:
            self.transfers.fallbacks += 1
            log.warning(
                "request %s: KV pull failed (%s); computing the prompt here", plan.request_id, exc
            )
        finally:
            rid = plan.request_id
            with contextlib.suppress(EngineDead):
                await self._between_steps(lambda: core.end_import(rid, ok))
            self._after_change()
            self._wakeup.set()
            self._spawn(self._release_remote(disagg))

    async def _release_remote(self, disagg: DisaggParams) -> None:
        if self.agent is not None and disagg.prefill_request_id is not None:
            await self.agent.release(disagg.transfer, disagg.prefill_request_id)

    async def release_kv(
        self, prefill_request_id: str, unless_claimed: bool = False, later: bool = False
    ) -> bool:
        core = self.core
        if core is None or self._dead is not None:
            return False
        released = await self._between_steps(
            lambda: core.release_export(prefill_request_id, unless_claimed, later)
        )
        self._after_change()
        return released
