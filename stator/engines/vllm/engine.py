"""`VllmEngine`: stator's Engine on vLLM's `AsyncLLM`, token ids in, token ids out.

The frontend tokenizes; this engine hands token ids (or prompt embeddings) to vLLM with
detokenization off and streams the token deltas back. Around that: vLLM's ZMQ KV events
relayed as stator events, an engine monitor that turns vLLM's EngineDeadError into
`EngineDead`, run-time LoRA adapters, and vLLM's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from vllm.distributed.kv_events import KVEventBatch
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.platforms import current_platform
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError

from stator.engines.base import Engine, EngineDead, EngineError, Unsupported
from stator.engines.vllm.args import KV_TOPIC, engine_args
from stator.engines.vllm.card import vllm_model_card
from stator.engines.vllm.config import VllmConfig
from stator.engines.vllm.disagg import kv_transfer_config, prefill_params, request_kv_params
from stator.engines.vllm.kv_events import KvEventRelay
from stator.engines.vllm.lora import LoraSet, local_adapter_dir
from stator.engines.vllm.metrics import vllm_samples
from stator.engines.vllm.outputs import OutputConverter
from stator.engines.vllm.prompts import vllm_prompt
from stator.engines.vllm.sampling import sampling_params
from stator.protocols import EngineOutput, EngineRequest, KvEvent, LoadReport, LoraInfo, ModelCard

log = logging.getLogger(__name__)


class VllmEngine(Engine):
    def __init__(self, config: VllmConfig, model_path: str, served_name: str) -> None:
        self.config = config
        self.model_path = model_path
        self.served_name = served_name
        self.args = engine_args(config, model_path, served_name)
        self.llm: AsyncLLM | None = None
        self.loras = LoraSet(served_name, 0)
        self._relay: KvEventRelay | None = None
        self._monitor: asyncio.Task | None = None
        self._dead: str | None = None
        self._dead_event = asyncio.Event()
        self._card: ModelCard | None = None
        self._role_connector: dict[str, Any] | None = None

    def _engine_args(self, kv_endpoint: str | None = None) -> AsyncEngineArgs:
        return engine_args(
            self.config, self.model_path, self.served_name, kv_endpoint, self._role_connector
        )

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        if self.args.enable_lora:
            # vLLM's add_lora/remove_lora at run time need this switch.
            os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # A prefill or decode role's connector leads the chain of --connector's (vLLM's
        # MultiConnector), so offloading and disaggregation work together.
        self._role_connector = kv_transfer_config(self.role, current_platform.is_cuda_alike())
        self.args = self._engine_args()
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        if self.config.kv_events and self.args.kv_events_config is None:
            self._relay = KvEventRelay.on_loopback(KV_TOPIC, decoder)
            self.args = self._engine_args(self._relay.endpoint)
        # Start-up (spawning EngineCore, loading, profiling) blocks for seconds: keep the
        # event loop (and the runtime's heartbeats) going meanwhile.
        try:
            self.llm = await asyncio.to_thread(AsyncLLM.from_engine_args, self.args)
        except BaseException:
            if self._relay is not None:
                self._relay.close()
                self._relay = None
            raise
        vllm_config = self.llm.vllm_config
        if self.args.enable_lora:
            self.loras.max_adapters = vllm_config.lora_config.max_loras - 1
        kv = vllm_config.kv_events_config
        user_publisher = kv is not None and kv.enable_kv_cache_events and kv.publisher == "zmq"
        if self._relay is None and user_publisher:
            self._relay = KvEventRelay.for_publisher(kv.endpoint, kv.topic, decoder)
        self._card = vllm_model_card(
            self.llm.vllm_config, self.served_name, self.model_path, self.role
        )
        self._monitor = asyncio.create_task(self._watch_engine(), name="vllm engine monitor")
        log.info(
            "vLLM engine up: block size %d, %d KV blocks, max_num_seqs %d",
            self._card.kv_block_size,
            self._card.total_kv_blocks,
            self._card.max_num_seqs,
        )

    async def shutdown(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        if self.llm is not None:
            llm, self.llm = self.llm, None
            await asyncio.to_thread(llm.shutdown)
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    # -- health ----------------------------------------------------------------------------

    async def _watch_engine(self) -> None:
        while self._dead is None:
            await asyncio.sleep(self.config.engine_monitor_interval)
            try:
                await self.health_check()
            except EngineDead:
                log.error("vLLM engine died: %s", self._dead)
                return

    def _declare_dead(self, exc: BaseException) -> EngineDead:
        if self._dead is None:
            self._dead = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self._dead_event.set()
        return EngineDead(f"vLLM engine died: {self._dead}")

    async def health_check(self) -> None:
        if self._dead is not None:
            raise EngineDead(f"vLLM engine died: {self._dead}")
        if self.llm is None:
            raise EngineDead("vLLM engine is not running")
        try:
            await self.llm.check_health()
        except EngineDeadError as exc:
            raise self._declare_dead(exc) from exc
        if self.llm.errored:
            raise self._declare_dead(self.llm.dead_error)

    # -- generation ------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if self._dead is not None or self.llm is None:
            raise EngineDead(f"vLLM engine is not running: {self._dead or 'not started'}")
        llm = self.llm
        prompt, prompt_ids, prompt_len = vllm_prompt(request, llm.vllm_config.model_config)
        params = sampling_params(request, prompt_len, llm.vllm_config.model_config.max_model_len)
        kv_params = request_kv_params(request)
        if kv_params is not None:
            params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": kv_params}
        # An adapter is named by lora_name, or by the model name its own card carries.
        lora = self.loras.request_for(request.lora_name or self.loras.adapter_named(request.model))
        if request.sampling.prompt_logprobs is not None and self._prompt_logprobs_kill_engine():
            raise EngineError(
                "prompt_logprobs is refused on this worker: with LoRA enabled on vLLM's CPU "
                "build, prompt logprobs in a batch of two or more kill the engine"
            )
        converter = OutputConverter(
            prompt_ids,
            prompt_len,
            logprobs=request.sampling.logprobs,
            prompt_logprobs=request.sampling.prompt_logprobs,
            hidden_stop_ids=set(request.stop.stop_token_ids_hidden),
        )
        # Stator serves a higher priority first (as the router's queue does); vLLM serves a
        # lower value first, and only under --scheduling-policy priority (with FCFS it
        # refuses any non-zero value, so none is passed).
        priority = -request.priority if self._priority_scheduling() else 0
        finished = False
        try:
            async for ro in llm.generate(
                prompt, params, request.request_id, lora_request=lora, priority=priority
            ):
                output = converter.convert(ro)
                finished = output.finish_reason is not None
                if finished and kv_params is not None:
                    output.disagg = prefill_params(
                        self.worker_id,
                        request,
                        getattr(ro, "kv_transfer_params", None),
                        llm.vllm_config.cache_config.block_size,
                    )
                yield output
                if finished:
                    return
        except EngineDeadError as exc:
            finished = True
            raise self._declare_dead(exc) from exc
        except (ValueError, VLLMClientError) as exc:  # vLLM input validation
            finished = True
            raise EngineError(str(exc)) from exc
        finally:
            if not finished and self.llm is not None:
                with contextlib.suppress(Exception):
                    await self.llm.abort(request.request_id)

    def _prompt_logprobs_kill_engine(self) -> bool:
        """vLLM bug (CPU LoRA kernels, PunicaWrapperCPU.add_lora_logits): prompt_logprobs
        with more than one request in the batch raises in the engine and kills it,
        whether or not the requests use an adapter (upstream issues #29955, #16668)."""
        return bool(self.args.enable_lora) and current_platform.is_cpu()

    def _priority_scheduling(self) -> bool:
        assert self.llm is not None
        return self.llm.vllm_config.scheduler_config.policy == "priority"

    async def abort(self, request_id: str) -> None:
        if self.llm is not None and self._dead is None:
            await self.llm.abort(request_id)

    # -- state -------------------------------------------------------------------------------

    def model_card(self) -> ModelCard:
        if self._card is None:
            raise RuntimeError("the vLLM engine has not started")
        return msgspec.structs.replace(self._card, loras=self.loras.infos())

    def load(self) -> list[LoadReport]:
        samples = vllm_samples()
        total = self._card.total_kv_blocks if self._card else 0
        usage = samples.get("vllm_kv_cache_usage_perc", 0.0)
        return [
            LoadReport(
                worker_id=self.worker_id,
                active_kv_blocks=round(usage * total),
                total_kv_blocks=total,
                num_waiting=int(samples.get("vllm_num_requests_waiting", 0)),
                num_running=int(samples.get("vllm_num_requests_running", 0)),
            )
        ]

    def metrics(self) -> dict[str, Any]:
        samples: dict[str, Any] = vllm_samples()
        samples["preemptions_total"] = samples.get("vllm_num_preemptions_total", 0.0)
        return samples

    async def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        """vLLM's KV events; raises EngineDead when the engine dies, so the worker host
        hears of a death even between health checks."""
        dead = asyncio.create_task(self._dead_event.wait())
        nxt: asyncio.Future | None = None
        try:
            if self._relay is None:
                await dead
            else:
                batches = self._relay.batches(self.worker_id)
                while True:
                    nxt = asyncio.ensure_future(anext(batches))
                    done, _ = await asyncio.wait({nxt, dead}, return_when=asyncio.FIRST_COMPLETED)
                    if nxt not in done:
                        break
                    yield nxt.result()
            raise EngineDead(f"vLLM engine died: {self._dead}")
        finally:
            dead.cancel()
            if nxt is not None and not nxt.done():
                nxt.cancel()

    def kv_state(self) -> list[KvEvent]:
        # Answering [] would tell a router the cache is empty; the card says instead that
        # routers must do without (ModelCard.kv_state_available).
        raise Unsupported("vLLM cannot list the blocks of its prefix cache (no KV state dump)")

    async def clear_kv(self) -> None:
        assert self.llm is not None
        await self.llm.reset_prefix_cache()

    # -- LoRA ----------------------------------------------------------------------------------

    async def load_lora(self, name: str, path: str) -> LoraInfo:
        assert self.llm is not None
        directory = local_adapter_dir(path)
        async with self.loras.lock:
            current = self.loras.loaded.get(name)
            if current is not None and current.lora_path == str(directory):
                return self.loras.info(name)  # idempotent
            lora = self.loras.new_request(name, directory)
            if current is not None:
                await self.llm.remove_lora(current.lora_int_id)
            try:
                await self.llm.add_lora(lora)
            except Exception as exc:
                self.loras.loaded.pop(name, None)
                raise EngineError(f"vLLM could not load LoRA {name!r}: {exc}") from exc
            self.loras.loaded[name] = lora
            return self.loras.info(name)

    async def unload_lora(self, name: str) -> None:
        assert self.llm is not None
        async with self.loras.lock:
            lora = self.loras.loaded.pop(name, None)
            if lora is None:
                raise EngineError(f"LoRA adapter {name!r} is not loaded")
            await self.llm.remove_lora(lora.lora_int_id)

    def list_loras(self) -> list[LoraInfo]:
        return self.loras.infos()

    # -- sleep ---------------------------------------------------------------------------------

    def _check_sleep(self) -> None:
        if not current_platform.is_sleep_mode_available():
            raise Unsupported(
                f"vLLM's sleep mode is not available on the {current_platform.device_name} "
                "platform (vLLM offers it on CUDA, ROCm and XPU only)"
            )
        if self.llm is None or not self.llm.vllm_config.model_config.enable_sleep_mode:
            raise Unsupported("sleep mode is off: start the worker with --enable-sleep-mode")

    async def sleep(self, level: int = 1) -> None:
        self._check_sleep()
        assert self.llm is not None
        await self.llm.sleep(level)

    async def wake(self, tags: list[str] | None = None) -> None:
        self._check_sleep()
        assert self.llm is not None
        await self.llm.wake_up(tags)
