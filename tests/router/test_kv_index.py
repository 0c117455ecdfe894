import pytest

from stator.kv.hashing import block_hashes
from stator.protocols import AllCleared, BlockRemoved, BlockStored
from stator.router.kv_index import KvIndex

BS = 4
A, B = (0, 0), (1, 0)


def blocks(*tokens_per_block: int) -> list[int]:
    """Token ids for blocks whose tokens are all `t` (one block per argument)."""
    return [t for t in tokens_per_block for _ in range(BS)]


def test_leading_blocks_per_worker():
    index = KvIndex(BS)
    prompt = block_hashes(blocks(1, 2, 3, 4), BS)
    index.store(A, prompt[:3])
    index.store(B, prompt[:1])
    assert index.find_matches(prompt) == {A: 3, B: 1}
    assert index.tree_size(A) == 3 and index.tree_size(B) == 1


def test_a_hole_ends_the_match_even_if_later_blocks_are_held():
    index = KvIndex(BS)
    prompt = block_hashes(blocks(1, 2, 3), BS)
    index.store(A, [prompt[0], prompt[2]])
    assert index.find_matches(prompt) == {A: 1}
    assert index.find_matches(prompt[1:]) == {}


def test_other_prefixes_do_not_match():
    index = KvIndex(BS)
    index.store(A, block_hashes(blocks(1, 2, 3), BS))
    # Same second block but a different first one: chained hashes differ.
    assert index.find_matches(block_hashes(blocks(9, 2, 3), BS)) == {}
    assert index.find_matches([]) == {}


def test_remove_and_clear():
    index = KvIndex(BS)
    prompt = block_hashes(blocks(1, 2, 3), BS)
    index.store(A, prompt)
    index.store(B, prompt)
    index.apply(A, BlockRemoved(block_hashes=[prompt[1]]))
    assert index.find_matches(prompt) == {A: 1, B: 3}
    index.apply(B, AllCleared())
    assert index.find_matches(prompt) == {A: 1}
    assert index.tree_size(B) == 0
    assert index.num_blocks() == 2  # A still holds blocks 0 and 2


def test_removed_worker_frees_its_bit_for_a_newcomer():
    index = KvIndex(BS)
    prompt = block_hashes(blocks(1, 2), BS)
    index.store(A, prompt)
    index.store(B, prompt[:1])
    index.remove_worker(A[0])
    assert index.find_matches(prompt) == {B: 1}
    newcomer = (7, 0)
    index.store(newcomer, prompt[:1])
    assert index.find_matches(prompt) == {B: 1, newcomer: 1}
    assert index.holders(prompt[1]) == []


def test_dp_ranks_are_separate_holders():
    index = KvIndex(BS)
    prompt = block_hashes(blocks(1, 2), BS)
    index.store((5, 0), prompt)
    index.store((5, 1), prompt[:1])
    assert index.find_matches(prompt) == {(5, 0): 2, (5, 1): 1}
    index.remove_worker(5)
    assert index.find_matches(prompt) == {}


def test_stored_event_with_our_hashes():
    index = KvIndex(BS)
    tokens = blocks(1, 2, 3)
    ours = block_hashes(tokens, BS)
    index.apply(A, BlockStored(block_hashes=ours[:2], token_ids=tokens[: 2 * BS], block_size=BS))
    index.apply(
        A,
        BlockStored(
            block_hashes=ours[2:], parent_hash=ours[1], token_ids=tokens[2 * BS :], block_size=BS
        ),
    )
    assert index.find_matches(ours) == {A: 3}


def test_engine_with_its_own_hashes_is_indexed_from_tokens():
    index = KvIndex(BS)
    tokens = blocks(1, 2, 3)
    ours = block_hashes(tokens, BS)
    theirs = [101, 102, 103]  # e.g. vLLM's own block hashes
    index.apply(A, BlockStored(block_hashes=theirs[:2], token_ids=tokens[: 2 * BS], block_size=BS))
    index.apply(
        A,
        BlockStored(
            block_hashes=theirs[2:],
            parent_hash=theirs[1],
            token_ids=tokens[2 * BS :],
            block_size=BS,
        ),
    )
    assert index.find_matches(ours) == {A: 3}
    # Removals name the engine's hashes.
    index.apply(A, BlockRemoved(block_hashes=[102]))
    assert index.find_matches(ours) == {A: 1}
    index.apply(A, AllCleared())
    assert index.find_matches(ours) == {}


def test_foreign_block_with_unknown_parent_is_ignored():
    index = KvIndex(BS)
    tokens = blocks(1, 2)
    index.apply(A, BlockStored(block_hashes=[1], token_ids=tokens[:BS], block_size=BS))
    index.apply(
        A, BlockStored(block_hashes=[9], parent_hash=555, token_ids=tokens[BS:], block_size=BS)
    )
    assert index.tree_size(A) == 1


def test_lora_blocks_are_other_blocks():
    index = KvIndex(BS)
    tokens = blocks(1, 2)
    lora = block_hashes(tokens, BS, lora_name="ad")
    index.apply(A, BlockStored(block_hashes=lora, token_ids=tokens, block_size=BS, lora_name="ad"))
    assert index.find_matches(lora) == {A: 2}
    assert index.find_matches(block_hashes(tokens, BS)) == {}


def test_block_size_mismatch_is_ignored():
    index = KvIndex(BS)
    tokens = list(range(2 * BS))
    index.apply(A, BlockStored(block_hashes=[1], token_ids=tokens, block_size=2 * BS))
    assert index.tree_size(A) == 0


def test_bad_block_size():
    with pytest.raises(ValueError):
        KvIndex(0)


def test_jump_search_finds_every_drop_point():
    index = KvIndex(BS, jump=4)
    prompt = block_hashes(blocks(*range(1, 12)), BS)  # 11 blocks
    depths = {(w, 0): d for w, d in enumerate([0, 1, 3, 4, 5, 8, 10, 11])}
    for key, depth in depths.items():
        index.store(key, prompt[:depth])
    exact = KvIndex(BS)
    for key, depth in depths.items():
        exact.store(key, prompt[:depth])
    expected = {k: d for k, d in depths.items() if d}
    assert index.find_matches(prompt) == exact.find_matches(prompt) == expected


def test_jump_search_misses_a_hole_inside_a_stride():
    """The documented trade-off of jump > 1."""
    prompt = block_hashes(blocks(1, 2, 3, 4, 5), BS)
    holey = [prompt[0], prompt[2], prompt[3], prompt[4]]
    exact, jumping = KvIndex(BS), KvIndex(BS, jump=4)
    exact.store(A, holey)
    jumping.store(A, holey)
    assert exact.find_matches(prompt) == {A: 1}
    assert jumping.find_matches(prompt) == {A: 5}
