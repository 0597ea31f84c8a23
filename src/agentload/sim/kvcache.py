"""Paged KV cache: a fixed block pool, prefix caching with an LRU of freed-but-cached blocks, an offload tier.

Mirrors vLLM V1's KVCacheManager / BlockPool (domain.md §3):

* every block id lives in the pool; a block with no reference sits in the free queue (an ``OrderedDict`` used
  as an LRU: the front is evicted first) and keeps its hash until it is taken for new data;
* a request's blocks are freed in reverse order, so a conversation's tail is evicted before its shared head;
* a prefix hit pulls a cached block out of the free queue (or shares a running request's block) and adds a
  reference;
* full-attention groups cache by chained block hash; sliding-window groups hold only their window's blocks.
  Simplification: a sliding group's window is assumed to be retained alongside a full-attention hit (vLLM
  caches and looks those blocks up too); it is re-allocated on the hit, so the pool accounting stays exact;
* an optional CPU tier receives the hashes of evicted blocks (LRU, bounded); a later lookup that misses on the
  GPU but hits there loads the blocks at link bandwidth instead of recomputing them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from agentload.capacity.kv import KVLayout
from agentload.errors import SimulationError


@dataclass(slots=True)
class Lookup:
    """The result of a prefix lookup: blocks hit per full group, and logical blocks loadable from offload."""

    hit_blocks: list[list[int]]
    offload_blocks: int

    @property
    def num_hit_blocks(self) -> int:
        return len(self.hit_blocks[0]) if self.hit_blocks else 0


@dataclass(slots=True)
class CacheStats:
    evicted_blocks: int = 0  # cached blocks whose content was overwritten
    offload_stored_blocks: int = 0
    offload_loaded_blocks: int = 0


class KVCacheManager:
    """Owns the block pool; the engine asks it to look up, allocate, register and free a request's blocks."""

    def __init__(self, layout: KVLayout, num_blocks: int, *, prefix_caching: bool = True, offload_blocks: int = 0):
        if num_blocks <= 0:
            raise SimulationError("the KV pool needs at least one block")
        self.layout = layout
        self.block_size = layout.block_size
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.full_groups = [i for i, g in enumerate(layout.groups) if g.window is None]
        self.sliding_groups = [(i, g) for i, g in enumerate(layout.groups) if g.window is not None]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._ref = [0] * num_blocks
        self._key: list[tuple[int, int] | None] = [None] * num_blocks
        self._cached: list[dict[int, int]] = [{} for _ in layout.groups]
        # One offload entry stands for a logical block across all full groups.
        self._offload_capacity = offload_blocks // max(1, len(self.full_groups))
        self._offload: OrderedDict[int, None] = OrderedDict()
        self.stats = CacheStats()

    # -- views -------------------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: the share of blocks held by requests (cached-but-free counts as free)."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(c) for c in self._cached)

    @property
    def offload_entries(self) -> int:
        return len(self._offload)

    def check_invariants(self) -> None:
        """Every block is either free with no reference or referenced and not free (used by tests)."""
        for b in range(self.num_blocks):
            if (b in self._free) != (self._ref[b] == 0):
                raise SimulationError(f"block {b}: ref {self._ref[b]} but free={b in self._free}")
        for gi, table in enumerate(self._cached):
            for h, b in table.items():
                if self._key[b] != (gi, h):
                    raise SimulationError(f"cache entry {h:#x} -> block {b} whose key is {self._key[b]}")

    # -- pool primitives ----------------------------------------------------------------------------------
    def _take(self) -> int:
        try:
            block, _ = self._free.popitem(last=False)
        except KeyError as exc:
            raise SimulationError("allocated from an empty pool; the caller must check num_free first") from exc
        key = self._key[block]
        if key is not None:
            group, h = key
            if self._cached[group].get(h) == block:
                del self._cached[group][h]
                self.stats.evicted_blocks += 1
                if group == self.full_groups[0] and self._offload_capacity:
                    self._offload[h] = None
                    self._offload.move_to_end(h)
                    self.stats.offload_stored_blocks += 1
                    if len(self._offload) > self._offload_capacity:
                        self._offload.popitem(last=False)
            self._key[block] = None
        self._ref[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            self._free[block] = None

    # -- request operations --------------------------------------------------------------------------------
    def lookup(self, hashes: list[int], max_blocks: int) -> Lookup:
        """Walk the chain of ``hashes[:max_blocks]`` and stop at the first miss (then try the offload tier)."""
        groups = self.full_groups
        hit: list[list[int]] = [[] for _ in groups]
        if not self.prefix_caching or max_blocks <= 0:
            return Lookup(hit, 0)
        first = self._cached[groups[0]]
        others = [self._cached[g] for g in groups[1:]]
        i = 0
        limit = min(max_blocks, len(hashes))
        while i < limit:
            h = hashes[i]
            b = first.get(h)
            if b is None:
                break
            if others:
                rest = [t.get(h) for t in others]
                if any(x is None for x in rest):
                    break
                for lst, x in zip(hit[1:], rest, strict=True):
                    lst.append(x)  # type: ignore[arg-type]  # None excluded just above
            hit[0].append(b)
            i += 1
        loads = 0
        if self._offload:
            while i + loads < limit and hashes[i + loads] in self._offload:
                loads += 1
        return Lookup(hit, loads)

    def blocks_needed(self, held: list[list[int]], target_tokens: int, lookup: Lookup | None = None) -> int:
        """Free blocks an allocation to ``target_tokens`` would consume (hits taken out of the free queue too)."""
        bs = self.block_size
        logical = -(-target_tokens // bs)
        need = 0
        hits = lookup.num_hit_blocks if lookup else 0
        if lookup:
            for lst in lookup.hit_blocks:
                need += sum(1 for b in lst if self._ref[b] == 0)
        for gi in self.full_groups:
            need += max(0, logical - len(held[gi]) - hits)
        for gi, g in self.sliding_groups:
            need += max(0, g.blocks_for(target_tokens, bs) - len(held[gi]))
        return need

    def allocate(self, held: list[list[int]], target_tokens: int, lookup: Lookup | None = None) -> bool:
        """Grow ``held`` (per-group block lists) to cover ``target_tokens``; False, changing nothing, if it can't."""
        if self.blocks_needed(held, target_tokens, lookup) > len(self._free):
            return False
        bs = self.block_size
        if lookup is not None:
            for gi, lst in zip(self.full_groups, lookup.hit_blocks, strict=True):
                for b in lst:
                    if self._ref[b] == 0:
                        del self._free[b]
                    self._ref[b] += 1
                held[gi].extend(lst)
        logical = -(-target_tokens // bs)
        for gi in self.full_groups:
            blocks = held[gi]
            for _ in range(logical - len(blocks)):
                blocks.append(self._take())
        for gi, g in self.sliding_groups:
            blocks = held[gi]
            want = g.blocks_for(target_tokens, bs)
            for _ in range(want - len(blocks)):
                blocks.append(self._take())
            # Blocks that slid out of the window go back to the pool at once, oldest first.
            while len(blocks) > want:
                self._release(blocks.pop(0))
        return True

    def register(self, held: list[list[int]], hashes: list[int], start: int, stop: int) -> None:
        """Cache the full blocks ``start..stop-1`` of a request under their chained hashes."""
        if not self.prefix_caching:
            return
        for gi in self.full_groups:
            table = self._cached[gi]
            blocks = held[gi]
            for i in range(start, stop):
                h = hashes[i]
                if h not in table:
                    b = blocks[i]
                    table[h] = b
                    self._key[b] = (gi, h)

    def note_offload_load(self, hashes: list[int], start: int, count: int) -> None:
        """Record a load from the CPU tier (the blocks were allocated as misses and are registered as computed)."""
        for h in hashes[start : start + count]:
            if h in self._offload:
                self._offload.move_to_end(h)
        self.stats.offload_loaded_blocks += count * len(self.full_groups)

    def free(self, held: list[list[int]]) -> None:
        """Release a request's blocks, tail first, so its shared head stays cached longest."""
        for blocks in held:
            for b in reversed(blocks):
                self._release(b)
            blocks.clear()
