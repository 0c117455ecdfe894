"""`MockerConfig`: the mocker's flags (`stator worker --engine mocker ...`).

Names and defaults mirror Dynamo's mocker where a flag means the same thing, so a command
line moves between the two unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from stator.config import option


@dataclass
class MockerConfig:
    num_gpu_blocks: int = option(16384, "KV cache size in blocks")
    block_size: int = option(64, "Tokens per KV block")
    max_num_seqs: int = option(256, "Most requests running at once")
    max_num_batched_tokens: int = option(8192, "Token budget of one engine step")
    enable_prefix_caching: bool = option(True, "Reuse cached KV blocks across requests")
    enable_chunked_prefill: bool = option(True, "Split long prompts over several steps")
    speedup_ratio: float = option(
        1.0, "Divide simulated time by this; 0 means no simulated time at all"
    )
    decode_speedup_ratio: float = option(
        1.0, "Extra divisor for the decode part of a step (on top of --speedup-ratio)"
    )
    startup_time: float = option(0.0, "Seconds to pretend loading takes")
    profile: str | None = option(
        None, "JSON timing profile (prefill ms vs tokens, decode ms vs batch and context)"
    )
    output_mode: str = option(
        "random",
        "Generated tokens: seeded random ids, or the prompt echoed",
        choices=["random", "echo"],
    )
    vocab_size: int | None = option(
        None, "Vocabulary size for random tokens (default: config.json)"
    )
    role: str = option(
        "aggregated",
        "Serve whole requests, or only the prefill / decode half of disaggregated serving",
        choices=["aggregated", "prefill", "decode"],
    )
    kv_bytes_per_token: int | None = option(
        None, "KV bytes per token for transfer time (default: from config.json)"
    )
    kv_transfer_bandwidth: float = option(
        64.0, "Simulated KV transfer bandwidth in GB/s (0: transfers are instant)"
    )
    host_cache_blocks: int = option(
        0,
        "Blocks of a simulated host-memory KV tier below the GPU cache (evicted blocks go "
        "there and are loaded back at --host-load-bandwidth; 0: none)",
    )
    disk_cache_blocks: int = option(
        0, "Blocks of a simulated disk KV tier below the host tier (0: none)"
    )
    host_load_bandwidth: float = option(
        25.0, "GB/s of loading KV blocks back from the host tier (0: instant)"
    )
    disk_load_bandwidth: float = option(
        3.0, "GB/s of loading KV blocks back from the disk tier (0: instant)"
    )
    data_parallel_size: int = option(1, "Independent engine ranks (each its own KV cache)")
    max_model_len: int = option(
        0, "Context length in tokens (0 = the model's config.json)", aliases=("--context-length",)
    )

    def validate(self) -> None:
        """Raise ValueError on settings the mocker cannot run with."""
        positive = {
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "data_parallel_size": self.data_parallel_size,
        }
        if self.max_model_len < 0:
            raise ValueError(f"--max-model-len must not be negative, got {self.max_model_len}")
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")
        for name in (
            "speedup_ratio",
            "decode_speedup_ratio",
            "startup_time",
            "kv_transfer_bandwidth",
            "host_cache_blocks",
            "disk_cache_blocks",
            "host_load_bandwidth",
            "disk_load_bandwidth",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must not be negative")
        if self.output_mode not in ("random", "echo"):
            raise ValueError(f"--output-mode must be random or echo, got {self.output_mode!r}")
        if self.role not in ("aggregated", "prefill", "decode"):
            raise ValueError(f"--role must be aggregated, prefill or decode, got {self.role!r}")
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise ValueError("--vocab-size must be positive")
