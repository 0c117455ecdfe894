"""The synchronous engine: requests in, one `step()` at a time, `EngineOutput` deltas out.

No asyncio and no threads here: the async `NativeEngine` and the offline `LLM` both drive
this core, which keeps it deterministic and easy to test. With `--overlap` (CUDA's default)
a step launches its work before reading the previous step's sampled tokens, so the device
runs one step ahead of the host (`overlap.py`); outputs then arrive one step later.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from stator.engines.base import EngineError
from stator.engines.native.attention import AttentionBackend
from stator.engines.native.block_manager import BlockManager
from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.core_disagg import DisaggCore
from stator.engines.native.core_offload import OffloadCore
from stator.engines.native.core_outputs import OutputEmitter, PromptLogprobRows
from stator.engines.native.guided import Guidance
from stator.engines.native.kv_handoff import ExportTable, ImportPlan
from stator.engines.native.lora.adapter import LoraAdapter
from stator.engines.native.overlap import (
    PendingStep,
    deferrable,
    patch_inputs,
    placeholder_rows,
    to_device,
)
from stator.engines.native.params import resolve_sampling, validate_request
from stator.engines.native.request import Sequence, Status
from stator.engines.native.sampler import Sampler
from stator.engines.native.scheduler import ScheduledBatch, Scheduler, check_policy
from stator.engines.native.spec import SpecDecoder, make_spec_decoder
from stator.engines.native.startup_heap import freeze_startup_heap
from stator.engines.native.tp_runner import make_runner
from stator.llm.prompt_embeds import InvalidPromptEmbeds, embeds_tensor
from stator.protocols import (
    EngineOutput,
    EngineRequest,
    KvEvent,
    LoadReport,
)


class EngineCore(DisaggCore, OffloadCore, OutputEmitter):
    def __init__(
        self,
        config: NativeConfig,
        model_dir: str | Path,
        *,
        worker_id: int = 0,
        backend: AttentionBackend | None = None,
    ) -> None:
        self.config = config
        self.spec = ModelSpec.from_dir(model_dir)
        if config.block_size < 1:
            raise ValueError(f"--block-size must be positive, got {config.block_size}")
        check_policy(config.scheduling_policy)  # before the model loads
        self.max_model_len = config.max_model_len or self.spec.max_position_embeddings
        if config.tensor_parallel_size > 1 and (config.enable_lora or config.enable_prompt_embeds):
            raise ValueError(
                "--enable-lora and --enable-prompt-embeds do not work with tensor parallelism "
                "yet (--tensor-parallel-size > 1): the steps sent to the other ranks carry "
                "neither adapters nor embeddings"
            )
        # One runner, or rank 0 of a tensor-parallel group (--tensor-parallel-size).
        self.runner = make_runner(self.spec, config, model_dir, self.max_model_len, backend)
        self.blocks = BlockManager(
            self.runner.num_blocks,
            config.block_size,
            prefix_caching=config.enable_prefix_caching,
            worker_id=worker_id,
        )
        self.offload = self._make_offload(model_dir)
        self.blocks.offload = self.offload
        self.scheduler = Scheduler(
            self.blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_prefill_chunk=config.max_prefill_chunk,
            max_loras=config.max_loras if config.enable_lora else 0,
            num_continuous_decode_steps=config.num_continuous_decode_steps
            or (4 if self.runner.device.type == "cuda" else 1),
            policy=config.scheduling_policy,
        )
        self.sampler = Sampler(self.spec.vocab_size, self.runner.device, config.seed)
        self.guidance = Guidance(
            model_dir,
            self.spec.vocab_size,
            self.spec.eos_token_ids,
            self.runner.device,
            config.grammar_threads,
        )
        # A sequence never outgrows the whole cache, so it can always run alone.
        self.max_total_tokens = min(self.max_model_len, self.blocks.num_blocks * config.block_size)
        self.seqs: dict[str, Sequence] = {}
        # Speculative decoding (--speculative-config), or None.
        self.specdec: SpecDecoder | None = make_spec_decoder(self)
        # Disaggregated serving: prompts pinned for decode workers (prefill role), and
        # requests whose prompt KV is being pulled (decode role).
        self.worker_id = worker_id
        self.exports = ExportTable(timeout=30.0)
        self.importing: dict[str, ImportPlan] = {}
        self.transfer_info: dict = {}
        mode = config.overlap
        self.overlap = mode == "on" or (mode == "auto" and self.runner.device.type == "cuda")
        if self.specdec is not None:
            # Drafting and verifying read each step's tokens on the host before the next.
            self.overlap = False
        self._pending: PendingStep | None = None  # a launched step not yet read back
        self.adapters: dict[str, LoraAdapter] = {}  # loaded LoRA adapters by name
        freeze_startup_heap()

    # -- requests ------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        seq = self._new_sequence(request)
        self.seqs[seq.request_id] = seq
        self.scheduler.add(seq)

    def _new_sequence(self, request: EngineRequest) -> Sequence:
        if request.request_id in self.seqs or request.request_id in self.importing:
            raise EngineError(f"request id {request.request_id!r} is already running")
        validate_request(request, self.spec, self.max_total_tokens)
        adapter = self._adapter(request.lora_name)
        embeds = self._prompt_embeds(request)
        sampling = resolve_sampling(request, self.spec, self.max_total_tokens)
        # Rows of prompt embeddings stand in for tokens: their ids are placeholders.
        token_ids = list(request.token_ids) if embeds is None else [0] * embeds.shape[0]
        seq = Sequence(
            request_id=request.request_id,
            token_ids=token_ids,
            num_prompt_tokens=len(token_ids),
            sampling=sampling,
            max_total_tokens=self.max_total_tokens,
            lora_name=request.lora_name if adapter is not None else None,
            lora=adapter,
            prompt_embeds=embeds,
        )
        self.guidance.attach(seq, request.sampling.guided_decoding)
        if sampling.seed is not None:
            seq.generator = torch.Generator(device=self.runner.device)
            seq.generator.manual_seed(sampling.seed)
        if sampling.prompt_logprobs is not None:
            seq.prompt_logprobs.append(None)  # the first prompt token has no context
        # A router's prefill request (an empty `DisaggParams`): keep the prompt's KV.
        disagg = request.disagg
        seq.export = disagg is not None and disagg.prefill_worker_id is None
        return seq

    def _adapter(self, name: str | None) -> LoraAdapter | None:
        if not name:
            return None
        if not self.config.enable_lora:
            raise EngineError(
                f"LoRA adapter {name!r} asked for, but LoRA is off: start the worker with "
                "--enable-lora"
            )
        adapter = self.adapters.get(name)
        if adapter is None:
            raise EngineError(f"LoRA adapter {name!r} is not loaded")
        return adapter

    def _prompt_embeds(self, request: EngineRequest) -> torch.Tensor | None:
        if request.prompt_embeds is None:
            return None
        if not self.config.enable_prompt_embeds:
            raise EngineError("prompt_embeds are off: start the worker with --enable-prompt-embeds")
        if not getattr(self.runner.model, "supports_prompt_embeds", False):
            raise EngineError(f"{self.spec.architecture} does not take prompt_embeds")
        try:
            tensor = embeds_tensor(
                request.prompt_embeds,
                request.prompt_embeds_shape,
                request.prompt_embeds_dtype,
                self.spec.hidden_size,
                self.max_total_tokens - 1,
            )
        except InvalidPromptEmbeds as exc:
            raise EngineError(f"invalid prompt_embeds: {exc}") from exc
        return tensor.to(device=self.runner.device, dtype=self.runner.dtype)

    # -- LoRA adapters -------------------------------------------------------------------

    def add_adapter(self, adapter: LoraAdapter) -> None:
        """Register (or replace) an adapter; requests already running keep theirs."""
        old = self.adapters.get(adapter.name)
        self.adapters[adapter.name] = adapter
        if old is not None and old is not adapter and self.runner.lora_slots is not None:
            self.runner.lora_slots.forget(old)

    def remove_adapter(self, name: str) -> bool:
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            return False
        in_use = any(s.lora is adapter for s in self.seqs.values())
        if not in_use and self.runner.lora_slots is not None:
            self.runner.lora_slots.forget(adapter)
        return True

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its blocks now (a request whose KV is being pulled:
        once the pull ends). False when the id is unknown."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        plan = self.importing.get(request_id)
        if plan is not None:
            plan.aborted = True
            seq.status = Status.FINISHED
            return True
        self.scheduler.remove(seq)
        return True

    def close(self) -> None:
        """Stop what the engine started besides this thread (tensor-parallel ranks, the
        disk tier's writer) and give back the pinned host tier."""
        if self.offload is not None:
            self.offload.close()
        self.runner.close()

    def has_work(self) -> bool:
        if self.runner.asleep:
            return False
        # A load still copying holds its blocks: step until it is done and they are free.
        loading = self.offload is not None and self.offload.copying()
        return self.scheduler.has_work() or self._pending is not None or loading

    # -- sleep mode ----------------------------------------------------------------------

    def sleep(self, level: int) -> None:
        """Drop every request, forget the prefix cache and free the device's memory
        (`ModelRunner.sleep`). The caller has ended the requests' streams."""
        if self._pending is not None:
            self._pending.tokens()  # the launched step must finish before its inputs go
            self._pending = None
        for rid in list(self.seqs):
            self.abort(rid)
        if self.offload is not None:
            self.offload.settle()  # copies in flight read or write blocks about to go
        self.blocks.clear()
        self.runner.sleep(level)

    def wake(self, tags: list[str] | None = None) -> None:
        self.runner.wake(tags)

    @property
    def asleep(self) -> bool:
        return self.runner.asleep

    # -- one step ------------------------------------------------------------------------

    def step(self) -> list[tuple[str, EngineOutput]]:
        """Run one step. With overlap, most outputs are those of the step before (read
        while this one runs on the device); a call with nothing left to schedule returns
        the last pending ones."""
        if self.specdec is not None:
            self.specdec.reserve(self.scheduler.running, set(self.seqs))
        batch = self.scheduler.schedule()
        if self.offload is not None:
            self._move_blocks()
        pending, self._pending = self._pending, None
        if not batch:
            return self._resolve(pending) if pending is not None else []
        news = batch.num_new_tokens
        started = time.perf_counter()
        with self.runner.step_scope(max(news) == 1, sum(news)), torch.inference_mode():
            outputs = self._run(batch, pending)
        if self.offload is not None and max(news) > 1:
            self.offload.observe_prefill(sum(news), time.perf_counter() - started)
        return outputs

    def _run(
        self, batch: ScheduledBatch, pending: PendingStep | None
    ) -> list[tuple[str, EngineOutput]]:
        specdec = self.specdec
        if specdec is not None:
            specdec.propose(batch)
        spec_rows: dict[int, int] = {}  # id(seq) -> its first logits row (drafts)
        sample_seqs: list[Sequence] = []
        rows: list[int] = []  # flat token index of each logits row
        sample_idx: list[int] = []  # which logits rows are sampled
        prompt_rows: list[PromptLogprobRows] = []
        offset = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            if seq.wants_prompt_logprobs and start < seq.num_prompt_tokens - 1:
                # Position p's logits predict prompt token p + 1.
                end = min(start + n, seq.num_prompt_tokens - 1)
                prompt_rows.append(PromptLogprobRows(seq, len(rows), start + 1, end - start))
                rows.extend(range(offset, offset + end - start))
            k = specdec.num_drafts(seq) if specdec is not None else 0
            if k and start + n == seq.num_tokens:
                # The last real token and each draft: k + 1 rows to verify.
                spec_rows[id(seq)] = len(rows)
                rows.extend(range(offset + n - 1 - k, offset + n))
            elif start + n == seq.num_tokens:
                sample_seqs.append(seq)
                sample_idx.append(len(rows))
                rows.append(offset + n - 1)
            offset += n
        slots = self.runner.lora_slots
        lora_slots = None
        if slots is not None and any(seq.lora is not None for seq in batch.seqs):
            lora_slots = slots.slots_for([seq.lora for seq in batch.seqs])
        inputs = self.runner.prepare(batch.seqs, batch.num_new_tokens, rows, lora_slots)
        dst, src = placeholder_rows(batch.seqs, batch.num_new_tokens, pending)
        if dst and pending is not None:
            patch_inputs(inputs.input_ids, pending, dst, src)
        if pending is not None:
            pending.draw()  # its masks were filled while this step was prepared
        if self.offload is not None:
            self.offload.wait_for(b for seq in batch.seqs for b in seq.block_ids)
        logits = self.runner.execute(inputs)
        starts = [seq.num_computed_tokens for seq in batch.seqs]
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
        # Before any block is committed to the prefix cache: rejected drafts roll back.
        gained = specdec.verify(logits, spec_rows) if spec_rows else {}
        if specdec is not None:
            specdec.observe(batch.seqs, starts, batch.num_new_tokens)
        deferred = self.overlap and bool(sample_seqs) and deferrable(sample_seqs)
        outputs: list[tuple[str, EngineOutput]] = []
        if deferred:
            if pending is not None and any(s.matcher is not None for s in sample_seqs):
                # A grammar's next mask needs the previous token: read it now (the device
                # has this step's forward pass queued, so it is not left idle).
                outputs, pending = self._resolve(pending), None
            rows = self._rows(logits, sample_idx)
            self._pending = self.guidance.launch_sampling(self.sampler, rows, sample_seqs)
            for seq in sample_seqs:
                if seq.status is not Status.FINISHED:
                    self._add_placeholder(seq)
        # The device has this step queued: read the previous step's tokens meanwhile.
        if pending is not None:
            outputs = self._resolve(pending)
        for seq in batch.seqs:
            if seq.status is not Status.FINISHED:
                # After `_resolve`, every token whose KV is cached is a real one.
                self.blocks.commit(seq)
        for pr in prompt_rows:
            self._add_prompt_logprobs(pr, logits)
        for seq in batch.seqs:
            tokens = gained.get(id(seq))
            if tokens is not None:
                outputs.append((seq.request_id, self._emit_tokens(seq, len(tokens))))
        if deferred:
            return outputs
        # A sequence `_resolve` just finished ran one step too many: drop its row.
        live = [i for i, seq in enumerate(sample_seqs) if seq.status is not Status.FINISHED]
        if not live:
            return outputs
        live_seqs = [sample_seqs[i] for i in live]
        result = self.sampler.sample(
            self._rows(logits, [sample_idx[i] for i in live]),
            live_seqs,
            self.guidance.constraint(live_seqs),
        )
        for seq, token, logprob in zip(live_seqs, result.token_ids, result.logprobs, strict=True):
            seq.token_ids.append(token)
            out = self._accept_token(seq, len(seq.token_ids) - 1, logprob)
            outputs.append((seq.request_id, out))
        return outputs

    def _rows(self, logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        if rows == list(range(logits.shape[0])):
            return logits  # a decode step: every row is sampled, in order
        return logits.index_select(0, to_device(rows, logits.device))

    # -- state for the worker host -------------------------------------------------------

    def load(self, worker_id: int) -> LoadReport:
        return LoadReport(
            worker_id=worker_id,
            active_kv_blocks=self.blocks.num_used_blocks,
            total_kv_blocks=self.blocks.num_blocks,
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            queued_prefill_tokens=self.scheduler.queued_prefill_tokens(),
        )

    def drain_kv_events(self) -> list[KvEvent]:
        return self.blocks.drain_events()

    def kv_state(self) -> list[KvEvent]:
        return self.blocks.kv_state()

    def clear_kv(self) -> None:
        self.blocks.clear()
