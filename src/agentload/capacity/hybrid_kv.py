"""vLLM's KV layout for DeepSeek-V4 (fp8), and the pool accounting vLLM logs for it (docs/deepseek-v4.md).

DeepSeek-V4 keeps several kinds of cache per layer, each with its own page size and its own positions per page:

* main MLA entries: one 512-d vector per entry (448 NoPE values in fp8, 64 RoPE in bf16, 8 bytes of scales:
  584 B), stored for every 4th position on "C4A" layers and every 128th on "C128A" layers, plus on C4A layers
  an indexer key (128 fp8 values + a 4-byte scale: 132 B). These grow with the context: one page covers the
  256-position logical block (vLLM forces block size 256 for ``fp8_ds_mla``);
* a sliding window of raw entries on every layer (W = 128), in 64-token pages;
* the compressors' running state (fp32), kept as sliding-window KV: C4 layers a window of 8 in blocks of 4,
  C128 layers a window of 128 in blocks of 8.

Every page is padded to the 576-byte alignment of the fp8_ds_mla kernels. vLLM groups the layers into KV cache
groups whose layer tuples are the same length (22 for Flash: the 43 sliding layers split 22 + 21), and all groups
draw block ids from one pool whose slab per block id is that tuple length × the bytes of one C4A + indexer +
C128A slot: ``num_blocks = available KV memory ÷ slab``. A block id of any group costs one slab.

What vLLM logs at startup, ``GPU KV cache size: N tokens`` and ``Maximum concurrency for L tokens per request:
X.XXx``, is derived from each group's worst-case reservation for one request of ``max_model_len`` L: full
groups ⌈L/256⌉ pages, sliding groups ⌈min(W − 1 + T, L)/block⌉ + 1 pages with T = max_num_batched_tokens (a
whole prefill chunk in flight). Two versions of the formula are known (``ConcurrencyFormula``). Neither is what
a decoding request holds: that is ⌈context/256⌉ full pages plus about ⌈W/block⌉ + 1 pages per sliding group,
26 block ids in all for Flash, which is what decides how many agents fit (``decode_blocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from agentload.capacity.models import AttentionKind, ModelSpec
from agentload.errors import ConfigError

LOGICAL_BLOCK = 256  # vLLM forces block size 256 for DeepSeek-V4's fp8_ds_mla cache
SWA_BLOCK = 64  # raw sliding-window entries per page
ALIGN = 576  # fp8_ds_mla page alignment
SCALE_BYTES = 8  # per main entry: one UE8M0 scale per 64 NoPE values (7), padded to 8
INDEXER_SCALE_BYTES = 4  # one fp32 scale per indexer key
# Compressor state pages (fp32 running sums), as vLLM sizes them: 32,832 B before padding to the page bucket of
# the group they share tensors with (docs/deepseek-v4.md). C4: 4 positions per page, window 8; C128: 8 per page, 128.
STATE_BYTES = 32_832
C4_STATE_BLOCK, C4_STATE_WINDOW = 4, 8
C128_STATE_BLOCK, C128_STATE_WINDOW = 8, 128


class ConcurrencyFormula(StrEnum):
    """Which vLLM computes the logged figures.

    ``V0_22``: blocks per request = ⌈Σ_g pages_g · page_g ÷ page of the full group⌉ (memory-weighted), logged
    tokens = int(max_concurrency × L). Reproduces the source article's two log lines and a third-party vLLM
    0.22.1rc1 log exactly (tests/test_hybrid_kv.py), so it is what vLLM 0.22.x prints.
    ``PER_GROUP``: blocks per request = Σ_g ⌈mem_g ÷ page_g⌉ (each group's pages counted as block ids, which
    is what the shared pool really hands out); later vLLM releases compute it this way. Not checked against a
    log here. vLLM 0.27+ packs the layout differently (a 917,568-B stride, 2·T in flight): not modelled.
    """

    V0_22 = "v0.22"
    PER_GROUP = "per-group"


def _pad(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclass(frozen=True, slots=True)
class V4Group:
    """One KV cache group: ``window`` None grows with the context; else a sliding window of ``window`` positions."""

    name: str
    layers: int
    page_bytes: int  # what one page of this group holds, over its layers
    block_tokens: int  # positions one page covers
    window: int | None

    def reserved_pages(self, max_model_len: int, in_flight: int) -> int:
        """vLLM's worst case for one request of ``max_model_len`` with ``in_flight`` tokens being computed."""
        if self.window is None:
            return -(-max_model_len // self.block_tokens)
        return -(-min(self.window - 1 + in_flight, max_model_len) // self.block_tokens) + 1

    def held_pages(self, context: int, in_flight: int = 1) -> int:
        """Pages a request holds while computing its last ``in_flight`` of ``context`` tokens (1: decoding)."""
        upto = -(-context // self.block_tokens)
        if self.window is None:
            return upto
        return min(upto, -(-(self.window - 1 + in_flight) // self.block_tokens) + 1)


@dataclass(frozen=True, slots=True)
class DeepSeekV4Layout:
    """The groups, the slab per block id, and vLLM's accounting for one model at fp8."""

    groups: tuple[V4Group, ...]
    tuple_len: int  # layers per group tuple
    slot_bytes: int  # one layer slot of the slab: C4A main + indexer + C128A main pages
    max_num_batched_tokens: int

    @property
    def slab_bytes(self) -> int:
        """What one block id costs: the pool is ``available ÷ slab_bytes`` block ids."""
        return self.tuple_len * self.slot_bytes

    @property
    def full(self) -> V4Group:
        return next(g for g in self.groups if g.window is None)

    def num_blocks_for_bytes(self, available_bytes: float) -> int:
        return max(0, int(available_bytes // self.slab_bytes))

    def reserved_pages(self, max_model_len: int) -> dict[str, int]:
        return {g.name: g.reserved_pages(max_model_len, self.max_num_batched_tokens) for g in self.groups}

    def constant_reservation_bytes(self, max_model_len: int) -> int:
        """The sliding groups' part of one request's worst-case reservation (independent of L once L ≥ W−1+T)."""
        t = self.max_num_batched_tokens
        return sum(g.reserved_pages(max_model_len, t) * g.page_bytes for g in self.groups if g.window is not None)

    def blocks_per_request(self, max_model_len: int, formula: ConcurrencyFormula = ConcurrencyFormula.V0_22) -> int:
        t = self.max_num_batched_tokens
        if formula is ConcurrencyFormula.V0_22:
            memory = sum(g.reserved_pages(max_model_len, t) * g.page_bytes for g in self.groups)
            return -(-memory // self.full.page_bytes)
        return sum(g.reserved_pages(max_model_len, t) for g in self.groups)

    def max_concurrency(
        self, num_blocks: int, max_model_len: int, formula: ConcurrencyFormula = ConcurrencyFormula.V0_22
    ) -> float:
        return num_blocks / self.blocks_per_request(max_model_len, formula)

    def logged_tokens(
        self, num_blocks: int, max_model_len: int, formula: ConcurrencyFormula = ConcurrencyFormula.V0_22
    ) -> int:
        """'GPU KV cache size: N tokens': int(max_concurrency × L), an accounting figure, not a capacity."""
        return int(self.max_concurrency(num_blocks, max_model_len, formula) * max_model_len)

    def num_blocks_for_logged_tokens(
        self, tokens: int, max_model_len: int, formula: ConcurrencyFormula = ConcurrencyFormula.V0_22
    ) -> int:
        """The smallest pool whose logged token count is ``tokens`` (the log line's inverse)."""
        bpr = self.blocks_per_request(max_model_len, formula)
        n = max(1, (tokens * bpr) // max_model_len)
        while self.logged_tokens(n, max_model_len, formula) < tokens:
            n += 1
        while n > 1 and self.logged_tokens(n - 1, max_model_len, formula) >= tokens:
            n -= 1
        return n

    def decode_blocks(self, context: int) -> int:
        """Block ids one request with ``context`` tokens holds while decoding (one token in flight)."""
        return sum(g.held_pages(context) for g in self.groups)

    def prefill_extra_blocks(self, context: int) -> int:
        """Extra block ids a request holds while it prefills a full chunk of T tokens instead of decoding."""
        t = self.max_num_batched_tokens
        return sum(g.held_pages(context, min(t, context)) - g.held_pages(context) for g in self.groups)


def deepseek_v4_layout(model: ModelSpec, max_num_batched_tokens: int) -> DeepSeekV4Layout:
    """vLLM's fp8 layout for a DeepSeek-V4 model (``--kv-cache-dtype fp8`` becomes ``fp8_ds_mla``)."""
    if model.attention is not AttentionKind.DEEPSEEK_V4:
        raise ConfigError(f"{model.name} is not a DeepSeek-V4 model")
    assert model.qk_rope_head_dim is not None
    assert model.index_head_dim is not None
    assert model.sliding_window is not None
    if max_num_batched_tokens <= 0:
        raise ConfigError(f"max_num_batched_tokens must be positive, got {max_num_batched_tokens}")
    rope = model.qk_rope_head_dim
    entry = (model.head_dim - rope) + 2 * rope + SCALE_BYTES  # fp8 NoPE, bf16 RoPE, scales: 584 for 512-d
    index_entry = model.index_head_dim + INDEXER_SCALE_BYTES  # 132 for 128-d
    c4_main = _pad(LOGICAL_BLOCK // 4 * entry)  # 37,440
    c4_index = _pad(LOGICAL_BLOCK // 4 * index_entry)  # 8,640
    c128_main = _pad(LOGICAL_BLOCK // 128 * entry)  # 1,728
    swa = _pad(SWA_BLOCK * entry)  # 37,440
    # Compressor state shares tensors with the main pages, so it is padded up to their bucket.
    c4_state, c4_index_state = max(STATE_BYTES, c4_main), c4_index
    c128_state = max(STATE_BYTES, c4_main)
    n4, n128 = model.layers_with_ratio(4), model.layers_with_ratio(128)
    layers = model.num_layers
    # Tuples of equal length: the sliding window is on every layer, and it splits into two groups.
    tuple_len = max(n4, n128, -(-layers // 2))
    swa_groups = math.ceil(layers / tuple_len)
    groups = [
        V4Group(
            "full (compressed MLA + indexer)",
            n4 + n128,
            n4 * (c4_main + c4_index) + n128 * c128_main,
            LOGICAL_BLOCK,
            None,
        ),
    ]
    left = layers
    for i in range(swa_groups):
        n = min(tuple_len, left)
        left -= n
        groups.append(V4Group(f"sliding window {chr(ord('a') + i)}", n, n * swa, SWA_BLOCK, model.sliding_window))
    if n4:
        groups.append(
            V4Group("C4 compressor state", n4, n4 * (c4_state + c4_index_state), C4_STATE_BLOCK, C4_STATE_WINDOW)
        )
    if n128:
        groups.append(V4Group("C128 compressor state", n128, n128 * c128_state, C128_STATE_BLOCK, C128_STATE_WINDOW))
    return DeepSeekV4Layout(tuple(groups), tuple_len, c4_main + c4_index + c128_main, max_num_batched_tokens)
