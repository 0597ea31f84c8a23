"""The one place that computes KV bytes per token, the block layout, pool blocks and blocks per session.

vLLM's hybrid allocator splits layers into KV cache groups of equal size; every group draws blocks from one
shared pool, and a block of group g holds ``block_size`` tokens for all of g's layers. A full-attention group
needs ceil(ctx / block_size) blocks per request; a sliding-window group only about ceil((W - 1) / block_size) + 1
(``vllm/v1/core/kv_cache_utils.py``; docs/background.md §3). Dense and MLA models have a single full-attention
group holding every layer. Sparse-read attention (DSA) limits what is read, not what is stored, so it does not
change anything here.

Tensor parallelism splits KV heads across ranks, but a rank never holds less than one head: with more ranks than
KV heads vLLM replicates heads (``num_kv_head_replicas``), and MLA's latent is shared by all heads, so every rank
stores all of it. ``KVLayout.replication`` is how many copies of each token's KV the ranks hold together; the
pool in blocks is the memory of all ranks divided by the bytes one block really costs across them.

DeepSeek-V4 has its own layout in vLLM (several page kinds, per-group positions per page, one slab per block id;
``hybrid_kv``): ``KVLayout.v4`` carries it, its groups state their own ``block_tokens``, and the logged pool and
maximum concurrency follow vLLM's hybrid formula for the layout's ``max_model_len``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from agentload.capacity.hybrid_kv import LOGICAL_BLOCK, ConcurrencyFormula, DeepSeekV4Layout, deepseek_v4_layout
from agentload.capacity.models import AttentionKind, ModelSpec
from agentload.errors import ConfigError

DEFAULT_BLOCK_SIZE = 16
DEFAULT_BATCHED_TOKENS = 8192  # vLLM's max_num_batched_tokens on big GPUs (vllm/engine/arg_utils.py)


class KVDtype(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"

    @property
    def nbytes(self) -> int:
        return 1 if self is KVDtype.FP8 else 2


def parse_kv_dtype(text: str) -> KVDtype:
    """Accept vLLM's spellings (auto, bfloat16, fp8, fp8_e4m3, ...)."""
    t = text.strip().lower()
    if t in ("auto", "bf16", "bfloat16"):
        return KVDtype.BF16
    if t in ("fp16", "float16", "half"):
        return KVDtype.FP16
    if t.startswith("fp8"):
        return KVDtype.FP8
    raise ConfigError(f"unknown kv cache dtype {text!r}; use bf16, fp16 or fp8")


@dataclass(frozen=True, slots=True)
class KVGroup:
    """One KV cache group: ``window`` is None for full attention, else the sliding window in tokens.

    ``block_tokens`` is set when the group's pages cover other than the layout's ``block_size`` positions
    (DeepSeek-V4's sliding window and compressor state); a block of any group is one block id of the pool.
    """

    layers: int
    window: int | None
    block_tokens: int | None = None

    def blocks_for(self, tokens: int, block_size: int) -> int:
        """Blocks a request with ``tokens`` of computed context holds in this group."""
        block_size = self.block_tokens or block_size
        full = -(-tokens // block_size)
        if self.window is None:
            return full
        return min(full, -(-(self.window - 1) // block_size) + 1)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """How a model's KV cache is laid out in blocks for one dtype and block size."""

    model: ModelSpec
    dtype: KVDtype
    block_size: int
    groups: tuple[KVGroup, ...]
    layers_per_group: int
    tensor_parallel: int = 1
    v4: DeepSeekV4Layout | None = None  # DeepSeek-V4's page kinds and slab (hybrid_kv)
    max_model_len: int | None = None  # what v4's logged figures are for (vLLM logs them for max_model_len)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.model.kv_values_per_token_per_layer() * self.dtype.nbytes

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one more token of context costs when every layer keeps it (the dense figure).

        DeepSeek-V4: what the compressed entries and indexer keys of one token store (full group page ÷ 256).
        """
        if self.v4 is not None:
            return self.v4.full.page_bytes // LOGICAL_BLOCK
        return self.bytes_per_token_per_layer * self.model.num_layers

    @property
    def growing_bytes_per_token(self) -> int:
        """KV bytes one more token costs once sliding windows are full (full-attention layers only).

        DeepSeek-V4: what the pool charges per token, one slab per 256 positions.
        """
        if self.v4 is not None:
            return self.v4.slab_bytes // LOGICAL_BLOCK
        return self.bytes_per_token_per_layer * self.model.num_full_layers

    @property
    def fixed_bytes_per_session(self) -> int:
        """Bytes a long session's sliding-window layers hold regardless of context length."""
        if self.v4 is not None:
            return sum(g.blocks_for(10**12, self.block_size) for g in self.groups if g.window) * self.page_bytes
        if self.model.attention is not AttentionKind.HYBRID:
            return 0
        assert self.model.sliding_window is not None
        blocks = KVGroup(1, self.model.sliding_window).blocks_for(10**12, self.block_size)
        return blocks * self.block_size * self.bytes_per_token_per_layer * self.model.num_sliding_layers

    @property
    def page_bytes(self) -> int:
        """Bytes of one block (one group's layers, ``block_size`` tokens); DeepSeek-V4: one slab."""
        if self.v4 is not None:
            return self.v4.slab_bytes
        return self.block_size * self.layers_per_group * self.bytes_per_token_per_layer

    @property
    def replication(self) -> float:
        """Copies of each token's KV that ``tensor_parallel`` ranks store together (1 when heads split evenly)."""
        tp = self.tensor_parallel
        if self.model.attention in (AttentionKind.MLA, AttentionKind.DEEPSEEK_V4):
            return float(tp)
        heads = self.model.num_kv_heads
        return tp * max(1, heads // tp) / heads

    @property
    def stored_page_bytes(self) -> float:
        """Bytes one block costs summed over all ranks (``page_bytes`` × ``replication``)."""
        return self.page_bytes * self.replication

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def full_groups(self) -> int:
        return sum(1 for g in self.groups if g.window is None)

    def blocks_per_request(self, tokens: int) -> int:
        """Blocks across all groups that one request with ``tokens`` of context holds."""
        return sum(g.blocks_for(tokens, self.block_size) for g in self.groups)

    def num_blocks_for_bytes(self, pool_bytes: float) -> int:
        """Blocks that ``pool_bytes`` of KV memory (summed over all ranks) holds."""
        return max(0, int(pool_bytes // self.stored_page_bytes))

    def _v4_len(self) -> int:
        if self.max_model_len is None:
            raise ConfigError("a DeepSeek-V4 layout needs max_model_len for vLLM's logged pool")
        return self.max_model_len

    def num_blocks_for_logged_tokens(self, pool_tokens: int) -> int:
        """Inverse of vLLM's logged 'KV cache size: N tokens' (= num_blocks // num_groups * block_size)."""
        if self.v4 is not None:
            return self.v4.num_blocks_for_logged_tokens(pool_tokens, self._v4_len())
        return (pool_tokens // self.block_size) * self.num_groups

    def logged_pool_tokens(self, num_blocks: int) -> int:
        """What vLLM prints as 'GPU KV cache size: N tokens' for a pool of ``num_blocks`` blocks.

        DeepSeek-V4 (vLLM 0.22): int(max concurrency × max_model_len), which grows with max_model_len.
        """
        if self.v4 is not None:
            return self.v4.logged_tokens(num_blocks, self._v4_len())
        return num_blocks // self.num_groups * self.block_size

    def max_concurrency(
        self, num_blocks: int, tokens_per_request: int, formula: ConcurrencyFormula = ConcurrencyFormula.V0_22
    ) -> float:
        """vLLM's 'Maximum concurrency for L tokens per request' (blocks ÷ blocks one full request needs).

        DeepSeek-V4: its worst-case reservation (sliding groups sized for a whole prefill chunk in flight).
        """
        if self.v4 is not None:
            return self.v4.max_concurrency(num_blocks, tokens_per_request, formula)
        return num_blocks / self.blocks_per_request(tokens_per_request)

    def sessions_sharing_prefix(self, num_blocks: int, context: int, shared_tokens: int) -> float:
        """Sessions that fit when all of them start with the same ``shared_tokens`` (a system prompt).

        Prefix caching stores the shared full blocks once per full-attention group; sliding groups share nothing
        (their window moves on), so only the rest of each session counts against the pool.
        """
        shared = min(shared_tokens, context) // self.block_size * self.full_groups
        return (num_blocks - shared) / (self.blocks_per_request(context) - shared)

    def naive_sessions(self, num_blocks: int, context: int) -> float:
        """The article's rule: logged pool tokens ÷ context per session (exact only for dense attention)."""
        return self.logged_pool_tokens(num_blocks) / context


def kv_layout(
    model: ModelSpec,
    dtype: KVDtype,
    block_size: int = DEFAULT_BLOCK_SIZE,
    tensor_parallel: int = 1,
    *,
    max_model_len: int | None = None,
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
) -> KVLayout:
    """Group the model's layers the way vLLM's hybrid KV cache manager does (equal-sized groups).

    ``max_model_len`` and ``max_num_batched_tokens`` only matter for DeepSeek-V4, whose logged figures depend
    on them; its block size is vLLM's forced 256 whatever ``block_size`` says.
    """
    if block_size <= 0:
        raise ConfigError(f"block size must be positive, got {block_size}")
    if tensor_parallel <= 0:
        raise ConfigError(f"tensor parallel size must be positive, got {tensor_parallel}")
    tp = tensor_parallel
    # vLLM refuses these splits at startup (heads must divide evenly, or be replicated a whole number of times).
    if model.num_attention_heads % tp:
        raise ConfigError(f"{model.num_attention_heads} attention heads do not split over {tp} GPUs")
    if model.attention is AttentionKind.DEEPSEEK_V4:
        if dtype is not KVDtype.FP8:
            raise ConfigError(
                f"{model.name}: only vLLM's fp8 layout for DeepSeek-V4 (fp8_ds_mla) is modelled; pass "
                "--kv-cache-dtype fp8"
            )
        v4 = deepseek_v4_layout(model, max_num_batched_tokens)
        v4_groups = tuple(
            KVGroup(g.layers, g.window, None if g.block_tokens == LOGICAL_BLOCK else g.block_tokens) for g in v4.groups
        )
        return KVLayout(model, dtype, LOGICAL_BLOCK, v4_groups, v4.tuple_len, tp, v4, max_model_len)
    if model.attention is not AttentionKind.MLA and model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ConfigError(f"{model.num_kv_heads} KV heads do not split over (or replicate across) {tp} GPUs")
    if model.attention is not AttentionKind.HYBRID:
        return KVLayout(model, dtype, block_size, (KVGroup(model.num_layers, None),), model.num_layers, tp)
    full, sliding = model.num_full_layers, model.num_sliding_layers
    # vLLM picks the smaller layer count as the group size, so each group has the same page size; the larger
    # kind is split into ceil(n / size) groups (the last one padded).
    size = min(full, sliding)
    groups = [KVGroup(size, None) for _ in range(math.ceil(full / size))]
    groups += [KVGroup(size, model.sliding_window) for _ in range(math.ceil(sliding / size))]
    return KVLayout(model, dtype, block_size, tuple(groups), size, tp)
