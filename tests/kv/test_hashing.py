import struct

import pytest
import xxhash

from stator.kv.hashing import (
    HASH_SEED,
    BlockHasher,
    block_hashes,
    chain_hash,
    hash_seed,
    local_block_hash,
)

# Fixed values: if these change, every KV event and router index in a mixed-version fleet
# would disagree. Change them only with a wire-version bump.
KNOWN_0_31_B16 = [15310707395893867146, 13769157705258532664]
KNOWN_LORA = [8452581587455479075, 12251366404976269379]


def test_known_values_are_stable():
    assert block_hashes(list(range(32)), 16) == KNOWN_0_31_B16
    assert block_hashes(list(range(32)), 16, lora_name="adapter") == KNOWN_LORA


def test_definition_matches_spec():
    tokens = list(range(32))
    first = xxhash.xxh3_64_intdigest(struct.pack("<16I", *tokens[:16]), HASH_SEED)
    local2 = xxhash.xxh3_64_intdigest(struct.pack("<16I", *tokens[16:]), HASH_SEED)
    second = xxhash.xxh3_64_intdigest(struct.pack("<QQ", first, local2), HASH_SEED)
    assert block_hashes(tokens, 16) == [first, second]
    assert local_block_hash(tokens[:16]) == first
    assert chain_hash(first, local2) == second
    assert chain_hash(None, first) == first


def test_partial_blocks_are_not_hashed_and_prefixes_share_hashes():
    assert block_hashes(list(range(15)), 16) == []
    long = block_hashes(list(range(50)), 16)
    assert len(long) == 3
    assert long[:2] == block_hashes(list(range(32)), 16)


def test_chain_depends_on_every_earlier_block():
    a = block_hashes([1] * 16 + [2] * 16, 16)
    b = block_hashes([3] * 16 + [2] * 16, 16)
    assert a[1] != b[1]


def test_lora_and_extra_keys_change_hashes():
    tokens = list(range(16))
    assert block_hashes(tokens, 16, lora_name="x") != block_hashes(tokens, 16)
    assert hash_seed(None) == HASH_SEED
    assert hash_seed("x") != hash_seed("y")
    assert block_hashes(tokens, 16, extra_keys=[b"img"]) != block_hashes(tokens, 16)


def test_parent_continues_a_chain():
    tokens = list(range(48))
    whole = block_hashes(tokens, 16)
    tail = block_hashes(tokens[16:], 16, parent=whole[0])
    assert tail == whole[1:]


def test_incremental_hasher_matches_batch():
    hasher = BlockHasher(8)
    seen = []
    for chunk in ([1, 2, 3], list(range(10, 20)), [7] * 11):
        seen += hasher.extend(chunk)
    all_tokens = [1, 2, 3, *range(10, 20), *[7] * 11]
    assert seen == hasher.hashes == block_hashes(all_tokens, 8)


def test_bad_block_size():
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)
