"""The one block hash: how a block of token ids becomes a KV cache key.

A block's *local* hash is xxh3-64 (seed `HASH_SEED`) over its token ids as little-endian
uint32. Its *sequence* hash chains the parent's sequence hash with the local hash, so one
64-bit value names the whole prefix up to and including the block. Only full blocks are
hashed. The router, the mocker and the native engine all call this module, so a KV event
from any of them means the same thing.

A LoRA adapter changes the seed (the same tokens under another adapter are other KV);
extra keys (e.g. multimodal content hashes) are folded into each block's bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import xxhash

# Dynamo uses the same seed; keeping it means our hashes can be compared with theirs.
HASH_SEED = 1337
_MASK64 = (1 << 64) - 1
_pair = struct.Struct("<QQ")


def hash_seed(lora_name: str | None = None) -> int:
    """The xxh3 seed for blocks computed under `lora_name` (None: the base model)."""
    if not lora_name:
        return HASH_SEED
    return (HASH_SEED + xxhash.xxh3_64_intdigest(lora_name.encode())) & _MASK64


def local_block_hash(tokens: Sequence[int], seed: int = HASH_SEED, extra: bytes = b"") -> int:
    """Hash of one block's tokens alone (no parent)."""
    data = np.asarray(tokens, dtype="<u4").tobytes() + extra
    return xxhash.xxh3_64_intdigest(data, seed)


def chain_hash(parent: int | None, local: int, seed: int = HASH_SEED) -> int:
    """Sequence hash of a block whose local hash is `local`, after block `parent`."""
    if parent is None:
        return local
    return xxhash.xxh3_64_intdigest(_pair.pack(parent, local), seed)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    parent: int | None = None,
    lora_name: str | None = None,
    extra_keys: Sequence[bytes] | None = None,
) -> list[int]:
    """Sequence hashes of every full block of `token_ids` (a trailing partial block is
    ignored). `parent` continues a chain from an earlier block; `extra_keys[i]` is folded
    into block i."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    seed = hash_seed(lora_name)
    n_full = len(token_ids) // block_size
    if n_full == 0:
        return []
    raw = np.asarray(token_ids[: n_full * block_size], dtype="<u4").tobytes()
    step = 4 * block_size
    digest = xxhash.xxh3_64_intdigest
    pack = _pair.pack
    out: list[int] = []
    prev = parent
    for i in range(n_full):
        chunk = raw[i * step : (i + 1) * step]
        if extra_keys is not None and i < len(extra_keys):
            chunk += extra_keys[i]
        local = digest(chunk, seed)
        prev = local if prev is None else digest(pack(prev, local), seed)
        out.append(prev)
    return out


class BlockHasher:
    """Incremental hashing for a growing sequence (an engine appending tokens): feed it
    tokens as they come; it returns the hashes of blocks that just became full."""

    __slots__ = ("_pending", "block_size", "hashes", "lora_name")

    def __init__(self, block_size: int, lora_name: str | None = None) -> None:
        self.block_size = block_size
        self.lora_name = lora_name
        self.hashes: list[int] = []
        self._pending: list[int] = []

    def extend(self, tokens: Sequence[int]) -> list[int]:
        self._pending.extend(tokens)
        n_full = len(self._pending) // self.block_size
        if n_full == 0:
            return []
        take = n_full * self.block_size
        parent = self.hashes[-1] if self.hashes else None
        new = block_hashes(
            self._pending[:take], self.block_size, parent=parent, lora_name=self.lora_name
        )
        del self._pending[:take]
        self.hashes.extend(new)
        return new
