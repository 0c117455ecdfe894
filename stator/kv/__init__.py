"""KV cache keys and KV events shared by engines and the router."""

from stator.kv.hashing import (
    HASH_SEED,
    BlockHasher,
    block_hashes,
    chain_hash,
    hash_seed,
    local_block_hash,
)

__all__ = [
    "HASH_SEED",
    "BlockHasher",
    "block_hashes",
    "chain_hash",
    "hash_seed",
    "local_block_hash",
]
