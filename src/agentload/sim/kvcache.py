"""Paged KV cache: a fixed block pool, prefix caching with an LRU of freed-but-cached blocks, an offload tier.

Mirrors vLLM V1's KVCacheManager / BlockPool (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``;
docs/background.md §3):

* every block id lives in the pool; a block with no reference sits in the free queue (the front is evicted
  first) and keeps its hash until it is taken for new data;
* a request's blocks are freed in reverse order, so a conversation's tail is evicted before its shared head;
* a prefix hit pulls a cached block out of the free queue (or shares a running request's block) and adds a
  reference;
* full-attention groups cache by chained block hash; sliding-window groups hold only their window's blocks.
  Simplification: a sliding group's window is assumed to be retained alongside a full-attention hit (vLLM
  caches and looks those blocks up too); it is re-allocated on the hit, so the pool accounting stays exact;
* an optional CPU tier receives the hashes of evicted blocks (LRU, bounded); a later lookup that misses on the
  GPU but hits there loads the blocks at link bandwidth instead of recomputing them.

Agent contexts run to thousands of blocks per request, freed and hit again every turn, so the pool works on
numpy arrays of block ids: reference counts are one column, and the free queue is an append-only array whose
entries are checked lazily — an entry is live while its block has no reference and the block's ``stamp``
still names that entry's position. vLLM's doubly linked free list gets O(1) removal from the middle (a hit)
the same way: here the stale entry is skipped when the front reaches it. Freeing a 6,000-block request is a
handful of array operations instead of 6,000 list updates. The hash → block index is an array-backed table
too (``_HashIndex``), and a long prefix walk is remembered so that a session's next turn re-checks the blocks
it found instead of probing for them again. One-block operations (a decoding request's next block) go
through memoryviews of the same arrays, which index at about half numpy's per-element cost.

Where a C compiler is at hand, the many-block operations (a prefix walk's probes and checks, caching a run of
blocks, taking from and returning to the free queue, its compaction, an index rebuild) run in sim/poolkernel.c
instead: one loop over the same arrays in place of a dozen numpy passes, element by element in the numpy code's
order, so both give the same results (tests/test_poolkernel.py checks them against each other).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from agentload.capacity.kv import KVLayout
from agentload.errors import SimulationError
from agentload.sim import poolkernel
from agentload.sim.hashchain import HashChain, hash_array
from agentload.sim.poolkernel import PoolKernel
from agentload.sim.poolkernel import address as _at

BlockIds = npt.NDArray[np.int32]


def _one_by_one(array: npt.NDArray[Any]) -> memoryview:
    """A memoryview of ``array``'s buffer: one element reads or writes at about half numpy's cost."""
    return array.data


_NO_BLOCKS: BlockIds = np.zeros(0, dtype=np.int32)
_NO_BLOCKS_AT: int = _NO_BLOCKS.ctypes.data


class BlockList:
    """One request's blocks in one KV cache group, oldest first: a growable array of block ids.

    ``_one`` is a memoryview of the same buffer: it reads and writes one id at half the cost of array indexing
    (the decode path appends one block at a time); ``_p`` is the buffer's address, for the pool kernel.
    """

    __slots__ = ("_buf", "_n", "_one", "_p")

    def __init__(self) -> None:
        self._buf = _NO_BLOCKS
        self._one = _one_by_one(self._buf)
        self._p = _NO_BLOCKS_AT
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self._n:
            if not -self._n <= index < 0:
                raise IndexError(index)
            index += self._n
        item: int = self._one[index]
        return item

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __repr__(self) -> str:
        return f"BlockList({self.tolist()})"

    def tolist(self) -> list[int]:
        out: list[int] = self._buf[: self._n].tolist()
        return out

    def view(self) -> BlockIds:
        """The ids as an array (a view: valid until the list changes)."""
        return self._buf[: self._n]

    def _reserve(self, extra: int) -> None:
        if self._n + extra > len(self._buf):
            # (Room for 64 blocks more than asked: a request's first extend is its prompt, and its reply's blocks
            # then come one at a time — 1,024 tokens of them without growing again.)
            grown = np.empty(max(2 * len(self._buf), self._n + extra + 64), dtype=np.int32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
            self._one = _one_by_one(grown)
            self._p = _at(grown)

    def append(self, block: int) -> None:
        if self._n == len(self._buf):
            self._reserve(1)
        self._one[self._n] = block
        self._n += 1

    def extend(self, blocks: BlockIds) -> None:
        m = len(blocks)
        self._reserve(m)
        self._buf[self._n : self._n + m] = blocks
        self._n += m

    def drop_front(self, count: int) -> BlockIds:
        """Remove and return the ``count`` oldest blocks."""
        out = self._buf[:count].copy()
        self._buf[: self._n - count] = self._buf[count : self._n]
        self._n -= count
        return out

    def clear(self) -> None:
        self._n = 0


BlockTable = list[BlockList]  # a request's blocks, one list per KV cache group


@dataclass(slots=True)
class Lookup:
    """The result of a prefix lookup: blocks hit per full group, and logical blocks loadable from offload."""

    hit_blocks: list[BlockIds]
    offload_blocks: int

    @property
    def num_hit_blocks(self) -> int:
        return len(self.hit_blocks[0]) if self.hit_blocks else 0


@dataclass(slots=True)
class CacheStats:
    evicted_blocks: int = 0  # cached blocks whose content was overwritten
    offload_stored_blocks: int = 0
    offload_loaded_blocks: int = 0


_EMPTY = -1  # hash() never returns -1, so it marks an empty slot
_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: the top bits of hash × 2⁶⁴/φ spread any set of keys
_MASK64 = (1 << 64) - 1
_SCALAR_TAIL = 24  # probing this few keys on is cheaper one by one than with another pass of array calls
_FIND_TAIL = 8  # find reads only: its passes are cheaper, so it goes one by one later
# Sparse on purpose: at most 1/_MAX_LOAD of the slots used, so most keys sit in or next to their home slot and
# a batch resolves in a few array passes. Live entries (≤ the pool's blocks) fill ≤ 1/4 after a rebuild. (8 slots
# per block and a 1/4 cap measured no faster on the fleet benchmark, for twice the memory.)
_SLOTS_PER_BLOCK = 4
_MAX_LOAD = 2
_MEMO_AT = 128  # prefix walks at least this long are remembered, under the hash of this block
_MEMO_ENTRIES = 4096
_RETIRED_TABLES = 1024  # finished requests' tables kept for new ones (each a few pages at most)


class _HashIndex:
    """Block hash → block id for one KV cache group: open addressing (linear probing) in numpy arrays.

    A Python dict of a million entries churned by tens of millions of inserts and deletes (an agent fleet
    re-prefilling past the KV knee) spends its time in cache misses and rehashing; here a whole chain is probed
    per numpy call. Entries are never deleted: the pool's key arrays say whether the block an entry names is
    still cached under that hash, so an eviction costs nothing here, and stale entries are overwritten when
    their hash comes back or dropped when the table is rebuilt.
    """

    def __init__(self, num_blocks: int, kernel: PoolKernel | None = None) -> None:
        self._kernel = kernel
        self._min_bits = max(10, (_SLOTS_PER_BLOCK * num_blocks - 1).bit_length())
        self._resize(self._min_bits)

    def _resize(self, bits: int) -> None:
        self._bits = bits
        self._mask = (1 << bits) - 1
        # Each slot's key and block side by side (two columns of one array): the read that finds a key has
        # brought its block into the cache too. The table is far larger than the CPU caches, so a batch's cost is
        # the cache misses of its random reads, and this halves them for every key found.
        table = np.zeros((1 << bits, 2), dtype=np.int64)
        table[:, 0] = _EMPTY
        self.table = table
        self.table_p = _at(table)
        self.keys = table[:, 0]
        self.blocks = table[:, 1]
        # Memoryviews of the same arrays, for the one-key paths (scalar reads at half numpy's cost).
        self._keys_one = _one_by_one(self.keys)
        self._blocks_one = _one_by_one(self.blocks)
        self.used = 0

    def room_for(self, count: int) -> bool:
        return (self.used + count) * _MAX_LOAD <= len(self.keys)

    def rebuild(self, hashes: npt.NDArray[np.int64], blocks: BlockIds) -> None:
        """Start again from the live entries only."""
        bits = self._min_bits
        while _SLOTS_PER_BLOCK * (len(hashes) + 1) > 1 << bits:
            bits += 1
        self._resize(bits)
        if self._kernel is not None:
            hashes = np.ascontiguousarray(hashes, dtype=np.int64)
            blocks = np.ascontiguousarray(blocks, dtype=np.int32)
            self.used += self._kernel.al_insert(self.table_p, bits, _at(hashes), _at(blocks), len(hashes))
            return
        slots, _ = self.place(hashes)
        self.blocks[slots] = blocks

    def home(self, hashes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        mixed = hashes.view(np.uint64) * np.uint64(_GOLDEN)
        return (mixed >> np.uint64(64 - self._bits)).astype(np.int64)

    def home_one(self, h: int) -> int:
        return ((h & _MASK64) * _GOLDEN & _MASK64) >> (64 - self._bits)

    def find(self, hashes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The block each hash's entry names, −1 where there is no entry."""
        out = np.full(len(hashes), -1, dtype=np.int64)
        pending = np.arange(len(hashes))
        slots = self.home(hashes)
        keys = hashes
        while len(pending) > _FIND_TAIL:
            found = self.keys[slots]
            match = found == keys
            out[pending[match]] = self.blocks[slots[match]]
            more = ~(match | (found == _EMPTY))
            pending, slots, keys = pending[more], (slots[more] + 1) & self._mask, keys[more]
        for i in pending.tolist():
            out[i] = self.find_one(int(hashes[i]))
        return out

    def find_one(self, h: int) -> int:
        slot = self.home_one(h)
        keys = self._keys_one
        while True:
            k = keys[slot]
            if k == h:
                block: int = self._blocks_one[slot]
                return block
            if k == _EMPTY:
                return -1
            slot = (slot + 1) & self._mask

    def place_one(self, h: int, slot: int | None = None) -> tuple[int, bool]:
        """``place`` for one hash, with scalar reads (a decode step caches one block at a time); probing from its
        home slot, or from ``slot`` where a batch left off."""
        if slot is None:
            slot = self.home_one(h)
        keys = self._keys_one
        while True:
            k = keys[slot]
            if k == h:
                return slot, True
            if k == _EMPTY:
                keys[slot] = h
                self.used += 1
                return slot, False
            slot = (slot + 1) & self._mask

    def block_at(self, slot: int) -> int:
        block: int = self._blocks_one[slot]
        return block

    def set_block(self, slot: int, block: int) -> None:
        self._blocks_one[slot] = block

    def place(self, hashes: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Each (distinct) hash's slot, claiming an empty one where it has none; and which already had one.

        Which empty slot a new key claims matters to no one (``find`` needs each key reachable from its home slot
        without crossing an empty one, which linear probing keeps), only that each distinct key claims one.
        """
        out = self.home(hashes)
        table, mask = self.keys, self._mask
        # The first pass, at the home slots, settles most keys: it works on whole arrays, without the index
        # arrays the later passes need.
        found = table[out]
        existed = found == hashes
        settled = existed | (found == _EMPTY)
        claim = np.flatnonzero(settled ^ existed)
        if len(claim):
            # Two new keys may want the same empty slot: write all, and those whose key stuck have it.
            slots, mine = out[claim], hashes[claim]
            table[slots] = mine
            won = table[slots] == mine
            taken = int(np.count_nonzero(won))
            self.used += taken
            if taken < len(claim):
                settled[claim[~won]] = False
        if settled.all():
            return out, existed
        pending = np.flatnonzero(~settled)
        slots = (out[pending] + 1) & mask
        while len(pending) > _SCALAR_TAIL:
            keys = hashes[pending]
            found = table[slots]
            match = found == keys
            out[pending[match]] = slots[match]
            existed[pending[match]] = True
            done = match
            empty = np.flatnonzero(found == _EMPTY)
            if len(empty):
                table[slots[empty]] = keys[empty]
                won = empty[table[slots[empty]] == keys[empty]]
                self.used += len(won)
                out[pending[won]] = slots[won]
                done = match.copy()
                done[won] = True
            more = ~done
            pending, slots = pending[more], (slots[more] + 1) & mask
        for i, slot in zip(pending.tolist(), slots.tolist(), strict=True):
            out[i], existed[i] = self.place_one(int(hashes[i]), slot)
        return out, existed


class KVCacheManager:
    """Owns the block pool; the engine asks it to look up, allocate, register and free a request's blocks."""

    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        *,
        prefix_caching: bool = True,
        offload_blocks: int = 0,
        remember_walks: bool = True,
        use_kernel: bool = True,
    ):
        if num_blocks <= 0:
            raise SimulationError("the KV pool needs at least one block")
        self.layout = layout
        self.block_size = layout.block_size
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.full_groups = [i for i, g in enumerate(layout.groups) if g.window is None]
        self.sliding_groups = [(i, g) for i, g in enumerate(layout.groups) if g.window is not None]
        # Blocks a sliding group holds once its window is full (blocks_for of an unbounded context).
        self._sliding_caps = [(i, g.blocks_for(2**62, self.block_size)) for i, g in self.sliding_groups]
        self._one_group = len(layout.groups) == 1
        # (group, most blocks it holds): unbounded for full attention.
        self._caps = [(i, 2**62) for i in self.full_groups] + self._sliding_caps
        # DeepSeek-V4's sliding groups cover fewer positions per block than the full group (64, 8, 4 vs 256):
        # (group, cap, positions per block) so such a group fills its window on its own scale. Layouts whose
        # groups all share block_size keep the plain loops (nothing changes for them).
        self._mixed = any(g.block_tokens not in (None, self.block_size) for g in layout.groups)
        self._sliding_scaled = [
            (i, cap, layout.groups[i].block_tokens or self.block_size) for i, cap in self._sliding_caps
        ]
        # Per-block state in one row of 32 bytes (reference count, queue stamp, cached hash, group), as it is read
        # together: the count and the stamp say whether a queue entry is live, the hash and the group whether a
        # cached block is what an index entry says, and a turn's passes over its blocks (the prefix walk's check of
        # hash and group, then the allocation's reference counts) follow one another. Block ids are scattered over
        # a pool far larger than the CPU caches, so every pass over a request's blocks costs a cache miss per block
        # and row; in one row, the first pass's miss serves the next (fleet-fits 4-7 % faster than two arrays of
        # pairs, fleet 4-8 %).
        counts = np.zeros((num_blocks, 4), dtype=np.int64)
        keyed = counts[:, 2:]
        # The compiled loops over the same arrays (sim/poolkernel.py), or None: the numpy code below, same results.
        self._k = poolkernel.load() if use_kernel else None
        self._rows = counts
        self._rows_p = _at(counts)
        self._taken = np.empty(1024, dtype=np.int32)  # the kernel's blocks taken from the free queue
        self._taken_p = _at(self._taken)
        self._stage(64)  # the blocks and hashes a decode step caches, for the kernel
        self._retired: list[BlockTable] = []  # finished requests' tables, empty, for new ones
        self._evicted = np.zeros(1, dtype=np.int64)  # the kernel's count of blocks a take evicted
        self._evicted_p = _at(self._evicted)
        self._ref = counts[:, 0]
        # The free queue: live entries are queue[head:tail] whose block is unreferenced and stamped there.
        self._queue = np.empty(4 * num_blocks + 1024, dtype=np.int32)
        self._queue[:num_blocks] = np.arange(num_blocks, dtype=np.int32)
        self._queue_p = _at(self._queue)
        self._stamp = counts[:, 1]
        self._stamp[:] = np.arange(num_blocks)
        self._head = 0
        self._tail = num_blocks
        self._num_free = num_blocks
        # Which cache table holds a block (-1: none) and under which hash.
        self._key_group = keyed[:, 1]
        self._key_group[:] = -1
        self._key_hash = keyed[:, 0]
        # Memoryviews of the per-block arrays for the one-block paths (scalar access at half numpy's cost).
        self._ref_one = _one_by_one(self._ref)
        self._stamp_one = _one_by_one(self._stamp)
        self._queue_one = _one_by_one(self._queue)
        self._key_group_one = _one_by_one(self._key_group)
        self._key_hash_one = _one_by_one(self._key_hash)
        self._index = {gi: _HashIndex(num_blocks, self._k) for gi in self.full_groups}
        # One offload entry stands for a logical block across all full groups.
        self._offload_capacity = offload_blocks // max(1, len(self.full_groups))
        self._offload: OrderedDict[int, None] = OrderedDict()
        # Recent prefix walks, keyed by the hash of their _MEMO_AT-th block: (hash list, blocks hit, their hashes,
        # the blocks per full group). A hint only: every block is checked before it counts.
        self._walks: OrderedDict[int, tuple[list[int], int, npt.NDArray[np.int64], list[BlockIds]]] = OrderedDict()
        self._remember = remember_walks
        self.stats = CacheStats()

    # -- views -------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def single_group(self) -> bool:
        """One KV cache group (a dense model): a request's blocks are one list, and ``grow_one_each`` applies."""
        return self._one_group

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: the share of blocks held by requests (cached-but-free counts as free)."""
        return 1.0 - self._num_free / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return int(np.count_nonzero(self._key_group >= 0))

    @property
    def offload_entries(self) -> int:
        return len(self._offload)

    def new_table(self) -> BlockTable:
        """An empty block table for a new request: a retired one where there is one (its lists' buffers have grown
        to a conversation's size already: an agent's next turn fills them without growing them again)."""
        if self._retired:
            return self._retired.pop()
        return [BlockList() for _ in self.layout.groups]

    def retire(self, held: BlockTable) -> None:
        """``free`` a finished request's blocks and keep its table for ``new_table``: the caller lets go of it."""
        self.free(held)
        if len(self._retired) < _RETIRED_TABLES:
            self._retired.append(held)

    def check_invariants(self) -> None:
        """Free blocks are exactly the unreferenced ones, each live once in the queue; cache keys agree."""
        if (self._ref < 0).any():
            raise SimulationError(f"negative reference count on block {int(np.flatnonzero(self._ref < 0)[0])}")
        live = self._live_entries(self._head, self._tail)
        unreferenced = np.flatnonzero(self._ref == 0)
        if len(live) != self._num_free or len(np.unique(live)) != len(live):
            raise SimulationError(f"{len(live)} live free-queue entries for {self._num_free} free blocks")
        if not np.array_equal(np.sort(live), unreferenced):
            raise SimulationError("the free queue and the unreferenced blocks differ")
        for gi, index in self._index.items():
            keyed = np.flatnonzero(self._key_group == gi).astype(np.int32)
            if not np.array_equal(index.find(self._key_hash[keyed]), keyed):
                raise SimulationError(f"group {gi}: a cached block is not what its hash finds")
        if np.isin(self._key_group[self._key_group >= 0], list(self._index), invert=True).any():
            raise SimulationError("a block is keyed in a group that caches nothing")

    # -- pool primitives ----------------------------------------------------------------------------------
    def _live_entries(self, start: int, stop: int) -> BlockIds:
        entries = self._queue[start:stop]
        live = (self._ref[entries] == 0) & (self._stamp[entries] == np.arange(start, stop))
        out: BlockIds = entries[live]
        return out

    def _set_queue(self, queue: BlockIds) -> None:
        self._queue = queue
        self._queue_one = _one_by_one(queue)
        self._queue_p = _at(queue)

    def _make_room(self, n: int) -> None:
        """Compact the free queue to its live entries if ``n`` more would not fit behind its tail."""
        if self._tail + n <= len(self._queue):
            return
        # Room for four times the live entries: each compaction goes over the whole queue (tens of milliseconds for
        # a million-block pool in numpy), so it should come rarely.
        if self._k is not None:
            count = self._k.al_compact(self._rows_p, self._queue_p, self._head, self._tail, self._queue_p)
            size = max(len(self._queue), 4 * (count + n) + 1024)
            if size > len(self._queue):
                grown = np.empty(size, dtype=np.int32)
                grown[:count] = self._queue[:count]
                self._set_queue(grown)
        else:
            live = self._live_entries(self._head, self._tail)
            count = len(live)
            size = max(len(self._queue), 4 * (count + n) + 1024)
            if size > len(self._queue):
                self._set_queue(np.empty(size, dtype=np.int32))
            self._queue[:count] = live
            self._stamp[live] = np.arange(count)
        self._head, self._tail = 0, count

    def _enqueue(self, blocks: BlockIds) -> None:
        """Append blocks whose last reference just went, in the order they should be evicted."""
        n = len(blocks)
        self._make_room(n)
        t = self._tail
        self._queue[t : t + n] = blocks
        self._stamp[blocks] = np.arange(t, t + n)
        self._tail = t + n
        self._num_free += n

    def _take_one(self) -> int:
        """Take the block at the front of the free queue (a decode step's new block: scalar reads, no arrays)."""
        if not self._num_free:
            raise SimulationError("allocated from an empty pool; the caller must check num_free first")
        queue, ref, stamp = self._queue_one, self._ref_one, self._stamp_one
        head = self._head
        while True:
            b: int = queue[head]
            if ref[b] == 0 and stamp[b] == head:
                break
            head += 1
        self._head = head + 1
        ref[b] = 1
        self._num_free -= 1
        group = self._key_group_one[b]
        if group >= 0:
            self._key_group_one[b] = -1  # its index entry goes stale
            self.stats.evicted_blocks += 1
            if group == self.full_groups[0] and self._offload_capacity:
                self._store_offload([self._key_hash_one[b]])
        return b

    def _take(self, count: int) -> BlockIds:
        """Take ``count`` blocks from the front of the free queue, evicting whatever they cached.

        The kernel's blocks come back in a buffer the next take writes over: each caller copies them at once (into
        a request's block list), which saves a new array and its address for each of a run's ~100,000 takes."""
        if count > self._num_free:
            raise SimulationError("allocated from an empty pool; the caller must check num_free first")
        if self._k is not None and not self._offload_capacity:  # (an offload tier needs the evicted hashes: numpy)
            if len(self._taken) < count:
                self._taken = np.empty(max(count, 2 * len(self._taken)), dtype=np.int32)
                self._taken_p = _at(self._taken)
            self._head = self._k.al_take(self._rows_p, self._queue_p, self._head, count, self._taken_p, self._evicted_p)
            self._num_free -= count
            self.stats.evicted_blocks += int(self._evicted[0])
            return self._taken[:count]
        head = self._head
        entries = self._queue[head : head + count]
        clean = (self._ref[entries] == 0) & (self._stamp[entries] == np.arange(head, head + len(entries)))
        if len(entries) == count and clean.all():
            # The front of the queue holds no stale entry (the usual case): take it as it is.
            self._head = head + count
            return self._took(entries.copy())
        parts = []
        need = count
        window = 2 * count + 32
        while need:
            # Stale entries (blocks hit again since they were queued) can fill long stretches: widen as we go.
            stop = min(self._tail, head + window)
            window *= 2
            entries = self._queue[head:stop]
            live = np.flatnonzero((self._ref[entries] == 0) & (self._stamp[entries] == np.arange(head, stop)))
            if len(live) >= need:
                live = live[:need]
                head += int(live[-1]) + 1
                need = 0
            else:
                head = stop
                need -= len(live)
            parts.append(entries[live])
        self._head = head
        return self._took(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _took(self, taken: BlockIds) -> BlockIds:
        """Blocks just taken from the free queue: referenced, and whatever they cached evicted."""
        self._ref[taken] = 1
        self._num_free -= len(taken)
        groups = self._key_group[taken]
        keyed = groups >= 0
        evicted = taken
        if not keyed.all():  # past the knee every block taken held something: no selection needed
            evicted, groups = taken[keyed], groups[keyed]
        if len(evicted):
            self._key_group[evicted] = -1  # their index entries go stale
            self.stats.evicted_blocks += len(evicted)
            if self._offload_capacity:
                first = evicted[groups == self.full_groups[0]]
                self._store_offload(self._key_hash[first].tolist())
        return taken

    def _store_offload(self, hashes: list[int]) -> None:
        """Evicted blocks' hashes enter the CPU tier, in eviction order; its least recent entries drop out."""
        tier = self._offload
        # A hash stored again moves to the back, as inserting one at a time would.
        for _ in map(tier.pop, hashes, repeat(None)):
            pass
        tier.update(zip(hashes, repeat(None)))
        self.stats.offload_stored_blocks += len(hashes)
        while len(tier) > self._offload_capacity:
            tier.popitem(last=False)

    def _free_in_kernel(self, at: int, n: int, reverse: int) -> None:
        """The kernel's ``_release`` of the ``n`` block ids at address ``at`` (last first if ``reverse``); the
        caller has made room for them in the queue."""
        assert self._k is not None
        freed = self._k.al_free(self._rows_p, self._queue_p, self._tail, at, n, reverse)
        self._tail += freed
        self._num_free += freed

    def _release(self, blocks: BlockIds) -> None:
        """Drop one reference from each block; those left unreferenced join the back of the free queue."""
        if len(blocks) == 0:
            return
        # Room for all of them first, as the kernel queues each as it goes (so a compaction comes at the same
        # moment in both codes; before the references drop, so it keeps only entries that were live before).
        self._make_room(len(blocks))
        if self._k is not None:
            blocks = np.ascontiguousarray(blocks, dtype=np.int32)
            self._free_in_kernel(_at(blocks), len(blocks), 0)
            return
        left = self._ref[blocks] - 1  # one gather instead of two (``-=`` then a read back)
        self._ref[blocks] = left
        freed = blocks[left == 0]
        if len(freed):
            self._enqueue(freed)

    # -- request operations --------------------------------------------------------------------------------
    def lookup(self, hashes: list[int], max_blocks: int) -> Lookup:
        """Walk the chain of ``hashes[:max_blocks]`` and stop at the first miss (then try the offload tier)."""
        groups = self.full_groups
        limit = min(max_blocks, len(hashes))
        if not self.prefix_caching or limit <= 0:
            return Lookup([_NO_BLOCKS for _ in groups], 0)
        hit_hashes: list[npt.NDArray[np.int64]] = []
        columns: list[list[BlockIds]] = [[] for _ in groups]
        i = 0
        # A session's next turn walks the same long prefix again: start from the blocks its last walk found,
        # for as long as they still hold those hashes (the only block that can: one live block per hash).
        memo = self._walks.get(hashes[_MEMO_AT - 1]) if limit >= _MEMO_AT and self._remember else None
        if memo is not None:
            before, n, known, walked = memo
            k = min(n, limit)
            same = before is hashes or before[:k] == hashes[:k]  # compared once: up to thousands of hashes
            if same and self._k is not None:
                # Up to the first block that no longer holds its hash, in any group: one pass each.
                i = k
                at = _at(known)
                for g, remembered in zip(groups, walked, strict=True):
                    i = self._k.al_check(self._rows_p, _at(remembered), at, i, g)
                hit_hashes.append(known[:i])
                for column, remembered in zip(columns, walked, strict=True):
                    column.append(remembered[:i])
            elif same:
                # Up to the first block that no longer holds its hash, checked in doubling pieces: past the knee
                # that comes early (a quarter of the way in, on the fleet benchmark), and each block checked is a
                # cache miss.
                span = _MEMO_AT * 2
                while i < k:
                    j = min(k, i + span)
                    live = np.ones(j - i, dtype=np.bool_)
                    for g, remembered in zip(groups, walked, strict=True):
                        blocks = remembered[i:j]
                        live &= (self._key_group[blocks] == g) & (self._key_hash[blocks] == known[i:j])
                    if not live.all():
                        i += int(np.argmin(live))
                        break
                    i = j
                    span *= 2
                hit_hashes.append(known[:i])
                for column, remembered in zip(columns, walked, strict=True):
                    column.append(remembered[:i])
        # Then probe in growing pieces: past the knee a miss comes early (after the shared system prompt), below
        # it the whole chain hits; either way the work stays within 4× of the blocks walked.
        step = 128
        while i < limit:
            j = min(i + step, limit)
            piece = hash_array(hashes, i, j)
            stop = len(piece)
            for column, g in zip(columns, groups, strict=True):
                if self._k is not None:
                    index = self._index[g]
                    found = np.empty(stop, dtype=np.int32)
                    # (A chain's mirror is read-only to numpy, which the cheap way to its address refuses.)
                    at = hashes.address(j) + 8 * i if isinstance(hashes, HashChain) else _at(piece)
                    stop = self._k.al_find_live(index.table_p, index._bits, self._rows_p, at, stop, g, _at(found))
                    column.append(found[:stop])
                    continue
                candidates = self._index[g].find(piece[:stop])
                safe = np.maximum(candidates, 0)
                live = (candidates >= 0) & (self._key_group[safe] == g) & (self._key_hash[safe] == piece[:stop])
                if not live.all():
                    stop = int(np.argmin(live))  # every full group must hold the block for it to count
                column.append(candidates[:stop].astype(np.int32))
            hit_hashes.append(piece[:stop])
            i += stop
            if stop < len(piece):
                break
            step *= 4
        hits = [np.concatenate(column)[:i] if column else _NO_BLOCKS for column in columns]
        if i >= _MEMO_AT and self._remember:
            walks = self._walks
            walks[hashes[_MEMO_AT - 1]] = (hashes, i, np.concatenate(hit_hashes)[:i], hits)
            walks.move_to_end(hashes[_MEMO_AT - 1])
            if len(walks) > _MEMO_ENTRIES:
                walks.popitem(last=False)
        loads = 0
        if self._offload:
            tier = self._offload
            while i + loads < limit and hashes[i + loads] in tier:
                loads += 1
        return Lookup(hits, loads)

    def blocks_needed(self, held: BlockTable, target_tokens: int, lookup: Lookup | None = None) -> int:
        """Free blocks an allocation to ``target_tokens`` would consume (hits taken out of the free queue too)."""
        hit_free = None if lookup is None else [int(np.count_nonzero(self._ref[b] == 0)) for b in lookup.hit_blocks]
        return self._blocks_needed(held, target_tokens, lookup, hit_free)

    def _blocks_needed(
        self,
        held: BlockTable,
        target_tokens: int,
        lookup: Lookup | None,
        hit_free: list[int] | None,
    ) -> int:
        """``blocks_needed``, given how many of each group's hit blocks have no reference (read once by
        ``allocate``, which then sets them: each read of a long hit is a cache miss per block)."""
        bs = self.block_size
        logical = -(-target_tokens // bs)
        need = 0
        hits = 0
        if lookup is not None and hit_free is not None:
            hits = lookup.num_hit_blocks
            need += sum(hit_free)
        for gi in self.full_groups:
            need += max(0, logical - len(held[gi]) - hits)
        if self._mixed:
            for gi, cap, per in self._sliding_scaled:
                need += max(0, min(-(-target_tokens // per), cap) - len(held[gi]))
            return need
        for gi, cap in self._sliding_caps:
            need += max(0, min(logical, cap) - len(held[gi]))
        return need

    def allocate(self, held: BlockTable, target_tokens: int, lookup: Lookup | None = None) -> bool:
        """Grow ``held`` (per-group block lists) to cover ``target_tokens``; False, changing nothing, if it can't."""
        logical = -(-target_tokens // self.block_size)
        if lookup is None and self._one_group:
            # A running request of a single-group model growing (most calls, by nothing or one block).
            only = held[0]
            need = logical - len(only)
            if need <= 0:
                return True
            if need > self._num_free:
                return False
            if need == 1:
                only.append(self._take_one())
            else:
                only.extend(self._take(need))
            return True
        if lookup is None:
            # A running request growing (by nothing, mostly, or a block in one group): no arrays unless needed.
            wants = []
            total = 0
            if self._mixed:
                for gi, count in self._group_targets(target_tokens, logical):
                    w = count - held[gi]._n
                    if w:
                        wants.append((gi, w))
                        if w > 0:
                            total += w
            else:
                for gi, cap in self._caps:
                    w = (logical if logical < cap else cap) - held[gi]._n
                    if w:
                        wants.append((gi, w))
                        if w > 0:
                            total += w
            if not wants:
                return True
            if total > self._num_free:
                return False
        else:
            if self._k is not None:
                # The hits' references are taken first and given back if the allocation does not fit: one pass
                # over their rows (scattered over the pool: a cache miss each) instead of a count, then the taking.
                k, rows = self._k, self._rows_p
                spans = [(_at(hit), len(hit)) for hit in lookup.hit_blocks if len(hit)]
                hit_free = [k.al_acquire(rows, at, n) for at, n in spans]  # a chain names each block once
                if self._blocks_needed(held, target_tokens, lookup, hit_free) > self._num_free:
                    for at, n in spans:
                        k.al_unacquire(rows, at, n)
                    return False
                self._num_free -= sum(hit_free)
                for gi, hit in zip(self.full_groups, lookup.hit_blocks, strict=True):
                    if len(hit):
                        held[gi].extend(hit)
            else:
                hit_refs = [self._ref[blocks] for blocks in lookup.hit_blocks]
                hit_free = [int(np.count_nonzero(refs == 0)) for refs in hit_refs]
                if self._blocks_needed(held, target_tokens, lookup, hit_free) > self._num_free:
                    return False
                for gi, hit, refs, was_free in zip(
                    self.full_groups, lookup.hit_blocks, hit_refs, hit_free, strict=True
                ):
                    if len(hit):
                        self._ref[hit] = refs + 1  # a chain names each block once
                        self._num_free -= was_free
                        held[gi].extend(hit)
            wants = [(gi, logical - len(held[gi])) for gi in self.full_groups]
            if self._mixed:
                wants += [
                    (gi, min(-(-target_tokens // per), cap) - len(held[gi])) for gi, cap, per in self._sliding_scaled
                ]
            else:
                wants += [(gi, min(logical, cap) - len(held[gi])) for gi, cap in self._sliding_caps]
            total = sum(w for _, w in wants if w > 0)
        if total == 1:
            for gi, w in wants:
                if w == 1:
                    held[gi].append(self._take_one())
        elif total:
            taken = self._take(total)
            at = 0
            for gi, w in wants:
                if w > 0:
                    held[gi].extend(taken[at : at + w])
                    at += w
        for gi, w in wants:
            if w < 0:
                # A window that shrank (never in a growing request): the oldest blocks go back at once.
                self._release(held[gi].drop_front(-w))
        return True

    def grow_one_each(self, lists: list[BlockList]) -> None:
        """One more block for each of ``lists``, in order: ``allocate`` of a single-group model's decoding requests
        whose computed tokens just filled their last block (the engine's members at a block boundary). The blocks
        are taken from the free queue in one pass, the same blocks in the same order as one ``allocate`` after
        another; the caller has checked that ``len(lists)`` blocks are free."""
        if len(lists) == 1:
            lists[0].append(self._take_one())
            return
        for blocks, block in zip(lists, self._take(len(lists)).tolist(), strict=True):
            blocks.append(block)

    def _group_targets(self, target_tokens: int, logical: int) -> list[tuple[int, int]]:
        """(group, blocks it should hold at ``target_tokens``) for a mixed layout, each group on its own scale."""
        out = [(i, logical) for i in self.full_groups]
        out += [(gi, min(-(-target_tokens // per), cap)) for gi, cap, per in self._sliding_scaled]
        return out

    def register(self, held: BlockTable, hashes: list[int], start: int, stop: int) -> None:
        """Cache the full blocks ``start..stop-1`` of a request under their chained hashes."""
        if not self.prefix_caching or stop <= start:
            return
        if stop - start == 1:
            self.register_one(held, hashes[start], start)
            return
        if self._k is not None:
            n = stop - start
            if isinstance(hashes, HashChain):
                chain_at = hashes.address(stop) + 8 * start  # (no view of the mirror: it costs as much as the call)
            else:
                chain = hash_array(hashes, start, stop)
                chain_at = _at(chain)
            for gi in self.full_groups:
                index = self._index[gi]
                if not index.room_for(n):
                    self._rebuild(gi)
                if len(held[gi]) < stop:  # the numpy code would fail on the shapes; C would read past the list
                    raise SimulationError(f"caching blocks up to {stop} of a request that holds {len(held[gi])}")
                index.used += self._k.al_register(
                    index.table_p, index._bits, self._rows_p, held[gi]._p + 4 * start, chain_at, n, gi
                )
            return
        chain = hash_array(hashes, start, stop)
        for gi in self.full_groups:
            index = self._index[gi]
            blocks = held[gi].view()[start:stop]
            mine = chain
            if not index.room_for(len(mine)):
                self._rebuild(gi)
            slots, existed = index.place(mine)
            if existed.any():
                # The first block cached under a hash keeps it; stale entries (evicted blocks) are taken over.
                current = index.blocks[slots]
                live = existed & (self._key_group[current] == gi) & (self._key_hash[current] == mine)
                if live.any():
                    new = ~live
                    slots, blocks, mine = slots[new], blocks[new], mine[new]
            index.blocks[slots] = blocks
            self._key_group[blocks] = gi
            self._key_hash[blocks] = mine

    def register_one(self, held: BlockTable, h: int, position: int) -> None:
        """``register`` of the one block at ``position`` under hash ``h``: a decoding request's newly full block.

        ``_HashIndex.place_one`` inlined, with scalar reads only: a decode fleet caches a block per request every
        ``block_size`` steps, so this runs hundreds of thousands of times in a long run.
        """
        if not self.prefix_caching:
            return
        key_group, key_hash = self._key_group_one, self._key_hash_one
        wrapped = (h & _MASK64) * _GOLDEN & _MASK64
        for gi in self.full_groups:
            index = self._index[gi]
            if (index.used + 1) * _MAX_LOAD > len(index.keys):
                self._rebuild(gi)
            keys, mask = index._keys_one, index._mask
            slot = wrapped >> (64 - index._bits)
            while True:
                k = keys[slot]
                if k == h:
                    owner = index._blocks_one[slot]
                    if key_group[owner] == gi and key_hash[owner] == h:
                        break  # the first block cached under a hash keeps it
                    k = _EMPTY  # a stale entry (its block was evicted): taken over
                if k == _EMPTY:
                    if keys[slot] != h:
                        keys[slot] = h
                        index.used += 1
                    b = held[gi][position]
                    index._blocks_one[slot] = b
                    key_group[b] = gi
                    key_hash[b] = h
                    break
                slot = (slot + 1) & mask

    def register_each(self, held: list[BlockTable], hashes: list[int], positions: list[int]) -> None:
        """``register_one(held[i], hashes[i], positions[i])`` for each i in turn: the blocks one decode step filled,
        a few requests' each. With the kernel and one full-attention group, staged in two arrays through their
        memoryviews and cached in one kernel pass (a few blocks a step: the call costs less than probing for one
        block in Python); the index makes room for all of them first, where ``register_one`` would rebuild it before
        the one that did not fit (the same entries either way)."""
        if not self.prefix_caching or not hashes:
            return
        if self._k is None or len(self.full_groups) != 1:
            for table, h, position in zip(held, hashes, positions, strict=True):
                self.register_one(table, h, position)
            return
        gi = self.full_groups[0]
        index = self._index[gi]
        n = len(hashes)
        if (index.used + n) * _MAX_LOAD > len(index.keys):
            self._rebuild(gi)
        if n > len(self._staged_hashes):
            self._stage(2 * n)
        blocks, chain = self._staged_blocks_one, self._staged_hashes_one
        for i, (table, h, position) in enumerate(zip(held, hashes, positions, strict=True)):
            held_blocks = table[gi]
            if position >= held_blocks._n:
                raise SimulationError(f"caching block {position} of a request that holds {held_blocks._n}")
            blocks[i] = held_blocks._one[position]
            chain[i] = h
        index.used += self._k.al_register(
            index.table_p, index._bits, self._rows_p, self._staged_blocks_p, self._staged_hashes_p, n, gi
        )

    def _stage(self, n: int) -> None:
        self._staged_blocks = np.empty(n, dtype=np.int32)
        self._staged_hashes = np.empty(n, dtype=np.int64)
        self._staged_blocks_one, self._staged_hashes_one = (
            _one_by_one(a) for a in (self._staged_blocks, self._staged_hashes)
        )
        self._staged_blocks_p, self._staged_hashes_p = _at(self._staged_blocks), _at(self._staged_hashes)

    def _rebuild(self, gi: int) -> None:
        keyed = np.flatnonzero(self._key_group == gi).astype(np.int32)
        self._index[gi].rebuild(self._key_hash[keyed], keyed)

    def note_offload_load(self, hashes: list[int], start: int, count: int) -> None:
        """Record a load from the CPU tier (the blocks were allocated as misses and are registered as computed)."""
        for h in hashes[start : start + count]:
            if h in self._offload:
                self._offload.move_to_end(h)
        self.stats.offload_loaded_blocks += count * len(self.full_groups)

    def free(self, held: BlockTable) -> None:
        """Release a request's blocks, tail first, so its shared head stays cached longest."""
        if self._k is not None:
            # Group by group, each block queued as its last reference goes: the numpy code's order and queue. Room
            # is made for all of them first (the compaction may come a little earlier than the numpy code's: the
            # same live entries in the same order).
            self._make_room(sum(blocks._n for blocks in held))
            for blocks in held:
                if blocks._n:
                    self._free_in_kernel(blocks._p, blocks._n, 1)
                blocks.clear()
            return
        parts = [blocks.view()[::-1] for blocks in held if len(blocks)]
        if parts:
            self._release(parts[0] if len(parts) == 1 else np.concatenate(parts))
        for blocks in held:
            blocks.clear()
