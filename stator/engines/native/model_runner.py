"""Owns the model and its paged KV cache on one device: builds a step's flat inputs from
the scheduled batch, runs the forward pass and returns the logits the engine asked for."""

from __future__ import annotations

import contextlib
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from stator.engines.native import kernel_warmup, step_graphs
from stator.engines.native.attention import AttentionBackend, make_backend
from stator.engines.native.config import ModelSpec, NativeConfig, parse_bytes
from stator.engines.native.context import StepContext, set_context
from stator.engines.native.cpu_threads import StepThreads
from stator.engines.native.cuda_graphs import DecodeGraphs
from stator.engines.native.layers import Linear
from stator.engines.native.loader import init_dummy_weights, load_weights
from stator.engines.native.lora.batch import build_lora_batch, token_slots
from stator.engines.native.lora.slots import LoraSlots
from stator.engines.native.models import model_class
from stator.engines.native.overlap import to_device
from stator.engines.native.piecewise import PiecewiseGraphs
from stator.engines.native.request import Sequence
from stator.engines.native.sleep import Offloaded, offload_model, restore_model
from stator.kv.block_copy import pool_shape

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_DEFAULT_KV_BYTES = 1 << 30


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, spec: ModelSpec, device: torch.device) -> torch.dtype:
    if name == "auto":
        # Half-precision matmuls are slow on most CPUs; the checkpoint's dtype on GPUs.
        return torch.float32 if device.type == "cpu" else DTYPES[spec.checkpoint_dtype]
    return DTYPES[name]


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    ctx: StepContext
    logits_rows: torch.Tensor  # rows of the hidden states to turn into logits
    # One token per sequence and one logits row per token, in order (CUDA-graph eligible).
    plain_decode: bool = False
    # Every sequence computes this many tokens, each with a logits row, in order (a
    # speculative verification step when > 1: verify graphs); 0 when they differ.
    rows_per_seq: int = 0


class ModelRunner:
    def __init__(
        self,
        spec: ModelSpec,
        config: NativeConfig,
        model_dir: str | Path,
        max_model_len: int,
        backend: AttentionBackend | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, spec, self.device)
        self.block_size = config.block_size
        self.threads = StepThreads(config.cpu_threads) if self.device.type == "cpu" else None
        self.backend = backend or make_backend(config.attention_backend, self.device)
        self.max_model_len = max_model_len
        self.sliding_window = spec.sliding_window
        cls = model_class(spec.architecture)
        extra = {}
        if spec.num_experts:
            from stator.engines.native.models.gpt_oss import resolve_moe_weights

            dummy = config.load_format == "dummy"
            extra["packed"] = resolve_moe_weights(
                config.moe_weights, model_dir, self.device.type, dummy
            )
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                self.model = cls(spec, self.backend, max_model_len, **extra)
        finally:
            torch.set_default_dtype(previous)
        if config.load_format == "dummy":
            init_dummy_weights(self.model)
        else:
            load_weights(self.model, model_dir)
        self.model.eval()
        self.lora_slots: LoraSlots | None = None
        if config.enable_lora:
            # Before the KV cache is sized: the slots take their memory first.
            self.lora_slots = LoraSlots(
                self.model, config.max_loras, config.max_lora_rank, self.dtype, self.device
            )
            log.info(
                "LoRA: %d slots of rank %d (%.1f MiB)",
                config.max_loras,
                config.max_lora_rank,
                self.lora_slots.nbytes() / 2**20,
            )
        # Half precision only: in float32 the kernel's dot would round through tf32.
        half = self.dtype in (torch.bfloat16, torch.float16)
        if self.device.type == "cuda" and config.tune_gemv and half:
            self._choose_gemv()
        self.graphs: DecodeGraphs | None = None
        self.verify_graphs: DecodeGraphs | None = None  # speculative decoding's (spec/)
        self.piecewise: PiecewiseGraphs | None = None  # mixed steps' (step_graphs.py)
        self.kv_pool: torch.Tensor | None = None
        peak = self._warm_up_peak() if self.device.type == "cuda" else 0
        self.num_blocks = self._size_kv_cache(max_model_len, peak)
        self._allocate_kv(self.num_blocks)
        self._model_dir = Path(model_dir)
        self._asleep: Offloaded | None = None
        self._asleep_parts: set[str] = set()
        step_graphs.capture(self, prepare=True)
        kernel_warmup.warm_up(self)  # after the graphs: steps they do not take, compiled

    # -- sleep mode ----------------------------------------------------------------------

    @property
    def asleep(self) -> bool:
        return bool(self._asleep_parts)

    @torch.inference_mode()
    def sleep(self, level: int) -> None:
        """Free the device memory of the weights (level 1: kept on the host; level 2:
        dropped), the KV cache, the LoRA slots and the decode graphs."""
        if self.asleep:
            return
        step_graphs.release(self)
        self._asleep = offload_model(self.model, level)
        self._allocate_kv(0)
        if self.lora_slots is not None:
            self.lora_slots.release()
        self._asleep_parts = {"weights", "kv_cache"}
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            # cuBLAS keeps its workspaces in the caching allocator (64 MiB on an H100).
            clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear is not None:
                clear()
            torch.cuda.empty_cache()

    @torch.inference_mode()
    def wake(self, tags: list[str] | None = None) -> None:
        """Bring back the parts named by `tags` ("weights", "kv_cache"; default: both).
        The decode graphs are captured again once everything is back."""
        wanted = set(tags or ("weights", "kv_cache"))
        unknown = wanted - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"unknown wake-up tags {sorted(unknown)}; known: weights, kv_cache")
        if "weights" in wanted & self._asleep_parts:
            assert self._asleep is not None
            if not restore_model(self.model, self._asleep, self.device):
                if self.config.load_format == "dummy":
                    init_dummy_weights(self.model)
                else:
                    load_weights(self.model, self._model_dir)
            self._asleep = None
            self._asleep_parts.discard("weights")
        if "kv_cache" in wanted & self._asleep_parts:
            self._allocate_kv(self.num_blocks)
            if self.lora_slots is not None:
                self.lora_slots.allocate()
            self._asleep_parts.discard("kv_cache")
        if not self._asleep_parts and self.graphs is None:
            step_graphs.capture(self, prepare=False)

    def _prepare_graphs(self, max_batch: int) -> None:
        """What decode graphs of up to `max_batch` sequences need before their capture
        (tensor parallelism: graph-safe collectives); nothing on one device."""

    def _choose_gemv(self) -> None:
        """Measure, per weight shape, whether the split-K GEMV beats cuBLAS at one row."""
        from stator.engines.native.kernels.gemv import choose

        chosen: dict[tuple, object] = {}
        for module in self.model.modules():
            if isinstance(module, Linear) and module.weight.is_contiguous():
                # With a bias or without: the kernels add it (as cuBLAS does), so it counts.
                shape = (*module.weight.shape, module.bias is not None)
                if shape not in chosen:
                    chosen[shape] = choose(module.weight, module.bias)
                module.gemv_config = chosen[shape]
                if module.epilogue:  # its output goes to a fused consumer: timed as that
                    key = (*shape, module.epilogue)
                    if key not in chosen:
                        chosen[key] = choose(module.weight, module.bias, module.epilogue)
                    module.epilogue_gemv = chosen[key]
        log.info("split-K GEMV for batch <= 8: %s", chosen)

    def _allocate_kv(self, num_blocks: int) -> None:
        """One pool tensor for every layer's keys and values (`stator.kv.block_copy`):
        each layer's caches are contiguous views of it, and whole blocks move in and out
        of it (offload tiers, KV transfer) with one gather or scatter."""
        layers = self.model.attention_layers()
        shape = pool_shape(
            len(layers), num_blocks, self.block_size, self.spec.num_kv_heads, self.spec.head_dim
        )
        self.kv_pool = None  # free the old pool before allocating the new one
        # Zeroed, not empty: padded gathers read unused slots and must see finite values.
        self.kv_pool = torch.zeros(shape, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(layers):
            layer.k_cache = self.kv_pool[i, 0]
            layer.v_cache = self.kv_pool[i, 1]

    @torch.inference_mode()
    def _warm_up_peak(self) -> int:
        """Peak bytes of activations of a full-budget prefill step (run on a scratch cache
        just large enough), so the KV cache can take what is left."""
        tokens = max(1, min(self.config.max_num_batched_tokens, self.max_model_len))
        blocks = -(-tokens // self.block_size)
        self._allocate_kv(blocks)  # allocated before `base`: not part of the peak
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        dev = self.device
        ctx = StepContext(
            positions=torch.arange(tokens, device=dev),
            slot_mapping=torch.arange(tokens, device=dev),
            block_tables=torch.arange(blocks, device=dev)[None],
            query_lens=torch.tensor([tokens], device=dev),
            seq_lens=torch.tensor([tokens], device=dev),
            cu_query_lens=torch.tensor([0, tokens], device=dev),
            max_query_len=tokens,
            max_seq_len=tokens,
            block_size=self.block_size,
            uniform=True,
        )
        ids = torch.zeros(tokens, dtype=torch.long, device=dev)
        rows = torch.arange(min(tokens, self.config.max_num_seqs), device=dev)
        self.execute(StepInputs(input_ids=ids, ctx=ctx, logits_rows=rows))
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(self.device) - base
        self._allocate_kv(0)
        torch.cuda.empty_cache()
        log.info("warm-up step of %d tokens: activation peak %.2f GiB", tokens, peak / 2**30)
        return peak

    def bytes_per_block(self) -> int:
        s = self.spec
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * s.num_layers * self.block_size * s.num_kv_heads * s.head_dim * elem

    def _size_kv_cache(self, max_model_len: int, activation_peak: int) -> int:
        per_block = self.bytes_per_block()
        if self.config.kv_cache_memory:
            budget = parse_bytes(self.config.kv_cache_memory)
        elif self.device.type == "cuda":
            # What this process may hold in all, less what is already in use (weights,
            # other processes), less the activations of the largest step.
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = int(total * self.config.gpu_memory_utilization - used - activation_peak)
        else:
            budget = _CPU_DEFAULT_KV_BYTES
        num_blocks = budget // per_block
        if not self.config.kv_cache_memory:
            # No point holding more than every sequence at full length.
            useful = self.config.max_num_seqs * -(-max_model_len // self.block_size)
            num_blocks = min(num_blocks, useful)
        if num_blocks < 1:
            raise ValueError(
                f"the KV cache budget ({budget} bytes) is smaller than one block "
                f"({per_block} bytes); raise --kv-cache-memory or --gpu-memory-utilization"
            )
        log.info(
            "KV cache: %d blocks of %d tokens (%d bytes each)",
            num_blocks,
            self.block_size,
            per_block,
        )
        return num_blocks

    def close(self) -> None:
        """Nothing to release on one device (tensor parallelism's rank 0 stops its ranks)."""

    # -- one step ------------------------------------------------------------------------

    def prepare(
        self,
        seqs: list[Sequence],
        num_new: list[int],
        logits_rows: list[int],
        lora_slots: list[int] | None = None,
    ) -> StepInputs:
        """Flatten the batch. Sequence i computes tokens [computed, computed + num_new[i]);
        `lora_slots`: the adapter slot of each sequence (-1: the base model)."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        bs = self.block_size
        embed_rows: list[int] = []
        embed_values: list[torch.Tensor] = []
        for seq, n in zip(seqs, num_new, strict=True):
            start = seq.num_computed_tokens
            if seq.prompt_embeds is not None and start < seq.num_prompt_tokens:
                end = min(start + n, seq.num_prompt_tokens)
                embed_rows.extend(range(len(input_ids), len(input_ids) + end - start))
                embed_values.append(seq.prompt_embeds[start:end])
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            table = seq.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
        tables = _block_table([s.block_ids for s in seqs])
        seq_lens = [s.num_computed_tokens + n for s, n in zip(seqs, num_new, strict=True)]
        dev = self.device
        query_lens = torch.tensor(num_new, dtype=torch.long)
        cu = torch.zeros(len(seqs) + 1, dtype=torch.long)
        torch.cumsum(query_lens, 0, out=cu[1:])
        ctx = StepContext(
            positions=to_device(positions, dev),
            slot_mapping=to_device(slots, dev),
            block_tables=to_device(torch.from_numpy(tables), dev),
            query_lens=to_device(query_lens, dev),
            seq_lens=to_device(seq_lens, dev),
            cu_query_lens=to_device(cu, dev),
            max_query_len=max(num_new),
            max_seq_len=max(seq_lens),
            block_size=bs,
            uniform=len(set(num_new)) == 1 and len(set(seq_lens)) == 1,
            num_leading_single=_leading_ones(num_new),
        )
        if embed_rows:
            ctx.input_embeds = (to_device(embed_rows, dev), torch.cat(embed_values))
        if lora_slots is not None and self.lora_slots is not None:
            ctx.lora = build_lora_batch(
                token_slots(lora_slots, num_new),
                self.lora_slots.num_slots,
                dev,
                groups=dev.type != "cuda",
                scratch_shape=self.lora_slots.workspace_shape(),
            )
        every_row = logits_rows == list(range(len(input_ids))) and not embed_rows
        return StepInputs(
            input_ids=to_device(input_ids, dev),
            ctx=ctx,
            logits_rows=to_device(logits_rows, dev),
            plain_decode=max(num_new) == 1 and every_row,
            rows_per_seq=num_new[0] if every_row and len(set(num_new)) == 1 else 0,
        )

    def step_scope(self, decode: bool, tokens: int) -> contextlib.AbstractContextManager:
        """Wraps a whole engine step (inputs, forward pass, sampling): on the CPU it runs
        on the intra-op thread count `StepThreads` picks, and is timed for it."""
        if self.threads is None:
            return contextlib.nullcontext()
        return self.threads.scope(decode, tokens)

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Run the model; logits [len(logits_rows), vocab] in float32."""
        logits = step_graphs.run(self, inputs)
        if logits is not None:
            return logits
        self.backend.plan(inputs.ctx, self.sliding_window)
        set_context(inputs.ctx)
        try:
            hidden = self.model(inputs.input_ids, inputs.ctx.positions)
        finally:
            set_context(None)
        return self.model.compute_logits(hidden[inputs.logits_rows]).float()


def _block_table(block_ids: list[list[int]]) -> np.ndarray:
    """Rows padded with 0, built with one flat conversion (a nested-list torch.tensor
    costs ~1 ms per 10k entries, which is most of a 256-sequence decode step's input)."""
    lens = np.fromiter((len(b) for b in block_ids), dtype=np.int64, count=len(block_ids))
    width = int(lens.max())
    table = np.zeros((len(block_ids), width), dtype=np.int64)
    flat = np.fromiter(
        itertools.chain.from_iterable(block_ids), dtype=np.int64, count=int(lens.sum())
    )
    table[np.arange(width)[None, :] < lens[:, None]] = flat
    return table


def _leading_ones(values: list[int]) -> int:
    for i, v in enumerate(values):
        if v != 1:
            return i
    return len(values)
