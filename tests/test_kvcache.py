"""The paged KV pool: block accounting, prefix lookups, LRU eviction order, the offload tier, sliding windows."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agentload.capacity.kv import KVLayout
from agentload.capacity.profile import parse_profile
from agentload.errors import SimulationError
from agentload.sim.kvcache import BlockTable, KVCacheManager, _HashIndex
from agentload.sim.tokens import block_hashes

BS = 16

DENSE = """
name = "dense"
model = "qwen2.5-0.5b"
gpu = "h100"
max_model_len = 128
[kv_pool]
num_blocks = 64
"""

HYBRID = """
name = "hybrid"
gpu = "h100"
max_model_len = 2048
[model]
name = "hybrid-tiny"
num_layers = 8
hidden_size = 512
num_attention_heads = 8
num_kv_heads = 2
head_dim = 64
attention = "hybrid"
sliding_window = 64
num_sliding_layers = 6
total_params = 1e8
active_params = 1e8
[kv_pool]
num_blocks = 1000
"""


def dense_layout() -> KVLayout:
    return parse_profile(DENSE, "dense").layout


def new_held(kv: KVCacheManager) -> BlockTable:
    return kv.new_table()


def chain(seed: int, blocks: int) -> list[int]:
    """Hashes of ``blocks`` full blocks of a token sequence nobody else uses."""
    return block_hashes([seed * 100_003 + i for i in range(blocks * BS)], BS)


def computed(kv: KVCacheManager, hashes: list[int]) -> BlockTable:
    """A request that computed (and cached) the blocks of ``hashes``; its blocks are still held."""
    held = new_held(kv)
    assert kv.allocate(held, len(hashes) * BS)
    kv.register(held, hashes, 0, len(hashes))
    return held


def test_allocate_and_free_account_for_every_block() -> None:
    kv = KVCacheManager(dense_layout(), 16)
    held = new_held(kv)
    assert kv.allocate(held, 40)
    assert len(held[0]) == 3
    assert kv.num_free == 13
    assert kv.usage == pytest.approx(3 / 16)
    assert kv.allocate(held, 48)  # still three blocks
    assert kv.num_free == 13
    assert kv.allocate(held, 49)
    assert kv.num_free == 12
    kv.check_invariants()
    kv.free(held)
    assert len(held[0]) == 0
    assert kv.num_free == 16
    assert kv.usage == 0.0
    kv.check_invariants()


def test_allocate_that_does_not_fit_changes_nothing() -> None:
    kv = KVCacheManager(dense_layout(), 16)
    other = new_held(kv)
    assert kv.allocate(other, 10 * BS)
    held = new_held(kv)
    assert not kv.allocate(held, 7 * BS)
    assert len(held[0]) == 0
    assert kv.num_free == 6
    assert kv.allocate(held, 6 * BS)
    assert kv.num_free == 0
    kv.check_invariants()


def test_an_empty_pool_is_refused() -> None:
    with pytest.raises(SimulationError):
        KVCacheManager(dense_layout(), 0)


def test_lookup_walks_the_chain_and_stops_at_the_first_miss() -> None:
    kv = KVCacheManager(dense_layout(), 16)
    hashes = chain(1, 4)
    kv.free(computed(kv, hashes))
    assert kv.lookup(hashes, 10).num_hit_blocks == 4
    assert kv.lookup(hashes, 3).num_hit_blocks == 3  # the cap (prompt length - 1, in blocks) is the caller's
    assert kv.lookup(hashes, 0).num_hit_blocks == 0
    holed = [hashes[0], hashes[1], chain(2, 1)[0], hashes[3]]
    assert kv.lookup(holed, 10).num_hit_blocks == 2  # block 3 is cached, but the walk stopped at the miss


def test_no_hits_without_prefix_caching() -> None:
    kv = KVCacheManager(dense_layout(), 16, prefix_caching=False)
    hashes = chain(1, 4)
    kv.free(computed(kv, hashes))
    assert kv.lookup(hashes, 10).num_hit_blocks == 0
    assert kv.num_cached_blocks == 0


def test_a_hit_takes_cached_blocks_back_from_the_free_queue() -> None:
    kv = KVCacheManager(dense_layout(), 8)
    hashes = chain(1, 4)
    first = computed(kv, hashes)
    kv.free(first)
    assert kv.num_free == 8
    lookup = kv.lookup(hashes, 4)
    held = new_held(kv)
    assert kv.blocks_needed(held, 5 * BS, lookup) == 5  # four free hits to take back, one new block
    assert kv.allocate(held, 5 * BS, lookup)
    assert held[0].tolist()[:4] == lookup.hit_blocks[0].tolist()
    assert kv.num_free == 3
    # The hit blocks are held again, so filling the rest of the pool cannot evict them.
    filler = new_held(kv)
    assert kv.allocate(filler, 3 * BS)
    assert kv.num_free == 0
    assert kv.lookup(hashes, 4).num_hit_blocks == 4
    kv.check_invariants()


def test_a_block_shared_by_two_requests_is_free_only_after_both_let_go() -> None:
    kv = KVCacheManager(dense_layout(), 8)
    hashes = chain(1, 2)
    a = computed(kv, hashes)
    b = new_held(kv)
    lookup = kv.lookup(hashes, 2)
    # Hits on blocks another request holds cost nothing.
    assert kv.blocks_needed(b, 3 * BS, lookup) == 1
    assert kv.allocate(b, 3 * BS, lookup)
    assert kv.num_free == 5
    kv.free(a)
    assert kv.num_free == 5
    kv.check_invariants()
    kv.free(b)
    assert kv.num_free == 8
    kv.check_invariants()


def test_eviction_takes_the_least_recently_freed_and_a_conversation_tail_first() -> None:
    kv = KVCacheManager(dense_layout(), 8)
    ha, hb = chain(1, 4), chain(2, 4)
    a, b = computed(kv, ha), computed(kv, hb)
    kv.free(a)  # freed first: evicted first
    kv.free(b)
    assert kv.num_cached_blocks == 8
    taker = new_held(kv)

    def hits() -> tuple[int, int]:
        return kv.lookup(ha, 4).num_hit_blocks, kv.lookup(hb, 4).num_hit_blocks

    assert kv.allocate(taker, 1 * BS)
    assert hits() == (3, 4)  # a's tail went; its head still hits
    assert kv.allocate(taker, 3 * BS)
    assert hits() == (1, 4)
    assert kv.allocate(taker, 4 * BS)
    assert hits() == (0, 4)
    assert kv.allocate(taker, 6 * BS)
    assert hits() == (0, 2)
    assert kv.stats.evicted_blocks == 6
    assert kv.num_cached_blocks == 2
    kv.check_invariants()


def test_a_hit_refreshes_a_block_in_the_lru() -> None:
    kv = KVCacheManager(dense_layout(), 4)
    ha, hb = chain(1, 2), chain(2, 2)
    a, b = computed(kv, ha), computed(kv, hb)
    kv.free(a)
    kv.free(b)
    # a is used again (and freed again): it is now more recently freed than b.
    again = new_held(kv)
    assert kv.allocate(again, 2 * BS, kv.lookup(ha, 2))
    kv.free(again)
    taker = new_held(kv)
    assert kv.allocate(taker, 2 * BS)
    assert kv.lookup(ha, 2).num_hit_blocks == 2
    assert kv.lookup(hb, 2).num_hit_blocks == 0


def test_the_first_block_cached_under_a_hash_keeps_it() -> None:
    kv = KVCacheManager(dense_layout(), 8)
    hashes = chain(1, 2)
    a = computed(kv, hashes)
    b = computed(kv, hashes)  # the same content computed again by a request that did not look it up
    assert kv.num_cached_blocks == 2
    assert kv.lookup(hashes, 2).hit_blocks[0].tolist() == a[0].tolist()
    kv.free(b)
    kv.free(a)
    taker = new_held(kv)
    assert kv.allocate(taker, 2 * BS)  # b's uncached blocks, freed first, go first
    assert kv.lookup(hashes, 2).num_hit_blocks == 2
    kv.check_invariants()


def test_evicted_blocks_move_to_the_offload_tier() -> None:
    kv = KVCacheManager(dense_layout(), 8, offload_blocks=4)
    ha, hb = chain(1, 4), chain(2, 4)
    kv.free(computed(kv, ha))
    kv.free(computed(kv, hb))
    taker = new_held(kv)
    assert kv.allocate(taker, 4 * BS)  # evicts all of a
    found = kv.lookup(ha, 4)
    assert (found.num_hit_blocks, found.offload_blocks) == (0, 4)
    assert kv.stats.offload_stored_blocks == 4
    assert kv.allocate(taker, 6 * BS)  # evicts b's tail: b hits twice on the GPU, then twice in offload
    found = kv.lookup(hb, 4)
    assert (found.num_hit_blocks, found.offload_blocks) == (2, 2)
    # The tier holds 4 blocks: b's two pushed out a's two oldest entries, its tail (evicted first), so a's
    # head still loads.
    assert kv.offload_entries == 4
    found = kv.lookup(ha, 4)
    assert (found.num_hit_blocks, found.offload_blocks) == (0, 2)
    assert kv.lookup(ha[2:], 2).offload_blocks == 0
    kv.check_invariants()


def test_no_offload_tier_means_an_evicted_block_is_gone() -> None:
    kv = KVCacheManager(dense_layout(), 4)
    ha = chain(1, 4)
    kv.free(computed(kv, ha))
    taker = new_held(kv)
    assert kv.allocate(taker, 4 * BS)
    found = kv.lookup(ha, 4)
    assert (found.num_hit_blocks, found.offload_blocks) == (0, 0)


def test_remembered_walks_find_what_a_fresh_walk_finds() -> None:
    """Long prefix walks start from the blocks the last walk found; evictions, refreshed hits and re-computed
    blocks in between must not change any result."""
    rng = random.Random(3)
    managers = [KVCacheManager(dense_layout(), 1200, remember_walks=r) for r in (False, True)]
    # Chains of their own, and chains that share their first 150 blocks (past the remembered block) then part.
    shared = [7] * 150 * BS
    chains = [chain(c, rng.randrange(130, 400)) for c in range(4)]
    chains += [block_hashes(shared + [c] * rng.randrange(10, 250) * BS, BS) for c in range(4)]
    holding: list[list[BlockTable]] = [[] for _ in managers]
    for _ in range(400):
        c = chains[rng.randrange(len(chains))]
        limit = rng.randrange(100, len(c) + 1)
        tokens = rng.randrange(1, limit + 2) * BS
        keep = rng.randrange(1, 4)
        drop = [rng.random() for _ in range(4)]
        results = []
        for kv, held in zip(managers, holding, strict=True):
            found = kv.lookup(c, limit)
            results.append((found.num_hit_blocks, found.hit_blocks[0].tolist()))
            table = new_held(kv)
            if found.num_hit_blocks * BS < tokens and kv.allocate(table, tokens, found):
                kv.register(table, c, found.num_hit_blocks, tokens // BS)
                held.append(table)
            for x in drop:
                if len(held) > keep:
                    kv.free(held.pop(int(x * len(held))))
        assert results[0] == results[1]
    for kv in managers:
        kv.check_invariants()
    assert managers[1].stats.evicted_blocks == managers[0].stats.evicted_blocks > 500


def test_sliding_groups_hold_only_their_window() -> None:
    layout = parse_profile(HYBRID, "hybrid").layout
    full = [i for i, g in enumerate(layout.groups) if g.window is None]
    sliding = [i for i, g in enumerate(layout.groups) if g.window is not None]
    assert (len(full), len(sliding)) == (1, 3)
    cap = -(-(64 - 1) // BS) + 1  # ceil((W - 1) / 16) + 1 = 5
    kv = KVCacheManager(layout, 1000)
    held = new_held(kv)
    for tokens in range(50, 2001, 50):
        assert kv.allocate(held, tokens)
        assert all(len(held[g]) == -(-tokens // BS) for g in full)
        assert all(len(held[g]) == min(-(-tokens // BS), cap) for g in sliding)
        assert 1000 - kv.num_free == -(-tokens // BS) + 3 * min(-(-tokens // BS), cap)
    kv.check_invariants()
    kv.free(held)
    assert kv.num_free == 1000
    kv.check_invariants()


def cache(kv: KVCacheManager, held: BlockTable, hashes: list[int], how: str) -> None:
    if how == "one by one":
        for i in range(len(hashes)):
            kv.register(held, hashes, i, i + 1)
    elif how == "each":  # as a decode step caches the blocks it filled, one per request
        kv.register_each([held] * len(hashes), hashes, list(range(len(hashes))))
    else:
        kv.register(held, hashes, 0, len(hashes))


def test_caching_block_by_block_is_caching_the_blocks_at_once() -> None:
    """A decoder caches one block at a time (``register_one``); a decode step the blocks it filled, a block of each
    request (``register_each``); a prefill caches a run of them (``register``): the first request under a hash keeps
    it, an evicted block's entry is taken over, every way."""
    outcomes = []
    hashes = chain(1, 3)
    for how, use_kernel in [("at once", True), ("one by one", True), ("each", True), ("each", False)]:
        kv = KVCacheManager(dense_layout(), 8, use_kernel=use_kernel)
        first, second = new_held(kv), new_held(kv)
        assert kv.allocate(first, 3 * BS)
        assert kv.allocate(second, 3 * BS)
        cache(kv, first, hashes, how)
        cache(kv, second, hashes, how)  # the same content again: the first request's blocks keep the hashes
        kept = kv.lookup(hashes, 3).hit_blocks[0].tolist()
        assert kept == first[0].tolist()
        kv.free(second)
        kv.free(first)
        evictor = new_held(kv)
        assert kv.allocate(evictor, 8 * BS)  # every block taken: every cached hash's entry goes stale
        assert kv.lookup(hashes, 3).num_hit_blocks == 0
        kv.free(evictor)
        again = new_held(kv)
        assert kv.allocate(again, 3 * BS)
        cache(kv, again, hashes, how)  # stale entries are taken over by the blocks now holding the content
        outcomes.append((kept, again[0].tolist(), kv.lookup(hashes, 3).hit_blocks[0].tolist()))
        kv.check_invariants()
    assert outcomes[0] == outcomes[1] == outcomes[2] == outcomes[3]
    assert outcomes[1][2] == outcomes[1][1]


@pytest.mark.parametrize("use_kernel", [True, False])
def test_caching_a_block_a_request_does_not_hold_is_refused(use_kernel: bool) -> None:
    kv = KVCacheManager(dense_layout(), 8, use_kernel=use_kernel)
    held = new_held(kv)
    assert kv.allocate(held, 3 * BS)
    hashes = chain(2, 4)
    with pytest.raises((SimulationError, IndexError)):
        kv.register_each([held], hashes[3:4], [3])  # it holds blocks 0-2
    kv.register_each([held, held, held], hashes[:3], [0, 1, 2])
    assert kv.lookup(hashes, 4).hit_blocks[0].tolist() == held[0].tolist()


def test_a_finished_requests_table_goes_empty_to_the_next_request() -> None:
    kv = KVCacheManager(dense_layout(), 8)
    held = kv.new_table()
    assert kv.allocate(held, 5 * BS)
    kv.retire(held)
    assert kv.num_free == 8
    again = kv.new_table()
    assert again is held
    assert [len(blocks) for blocks in again] == [0]
    assert kv.allocate(again, 3 * BS)
    assert kv.new_table() is not again  # one request's table at a time
    kv.free(again)
    kv.check_invariants()


def test_the_hash_index_maps_what_a_dict_maps() -> None:
    """Batches of keys crowded into a small table (long probe runs, new keys racing for one empty slot, keys
    found in the first pass and in later ones): every key lands once, is found where it was placed, and a key
    already in the table is reported as such."""
    rng = np.random.default_rng(5)
    index = _HashIndex(64)  # 1,024 slots
    model: dict[int, int] = {}
    # Keys from a narrow range whose multiples of 2⁶⁴/φ crowd the top bits: home slots collide often.
    while True:
        keys = np.unique(rng.integers(1, 3_000, int(rng.integers(1, 200)), dtype=np.int64))
        rng.shuffle(keys)
        if not index.room_for(len(keys)):
            break
        slots, existed = index.place(keys)
        assert existed.tolist() == [k in model for k in keys.tolist()]
        assert (index.keys[slots] == keys).all()
        assert len(set(slots.tolist())) == len(keys)
        blocks = rng.integers(0, 1_000_000, len(keys))
        index.blocks[slots] = blocks
        model.update(zip(keys.tolist(), blocks.tolist(), strict=True))
        assert index.used == len(model)
        probe = rng.integers(1, 3_500, 300, dtype=np.int64)
        assert index.find(probe).tolist() == [model.get(k, -1) for k in probe.tolist()]
    assert index.used * 2 > 1_024 - 200  # the table was driven to its load limit
    assert [index.find_one(k) for k in model] == list(model.values())
