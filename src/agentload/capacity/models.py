"""What a model's architecture means for serving: the config.json fields that set KV size and step time.

Only the fields that matter for capacity are kept. ``ModelSpec`` is immutable and validated by pydantic, so a
catalogue entry or a Hugging Face config.json with a missing or impossible field fails with the field's name.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Bytes per parameter of each weight format. fp4/int4 ignore the per-group scales (≈ +3-6%), which is inside the
# error of a memory estimate anyway.
# Upper bounds on a model's shape (user input), far past any published model (126 layers, 18,432 wide, 256 experts).
MAX_LAYERS = 10_000
MAX_WIDTH = 1_048_576
MAX_HEADS = 65_536
MAX_EXPERTS = 65_536
MAX_CONTEXT = 2**31 - 1
MAX_PARAMS = 1e15

WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5}


class AttentionKind(StrEnum):
    DENSE = "dense"  # MHA or GQA: every layer keeps K and V for every token
    MLA = "mla"  # multi-head latent attention (DeepSeek V2/V3): one compressed latent per token per layer
    HYBRID = "hybrid"  # some layers full attention, the others a sliding window
    # DeepSeek-V4: every layer keeps a sliding window of raw entries; "C4A" layers also keep one compressed entry
    # per 4 positions (plus an indexer key), "C128A" layers one per 128; compressor state rides along
    # (docs/deepseek-v4.md)
    DEEPSEEK_V4 = "deepseek-v4"


class ModelSpec(BaseModel):
    """A model as the serving engine sees it."""

    # Finite and bounded: a profile's [model] table and a config.json are user input, and the layer
    # count drives loops. Each bound is ~100x the largest published model's figure.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: int = Field(gt=0, le=MAX_WIDTH)
    num_attention_heads: int = Field(gt=0, le=MAX_HEADS)
    num_kv_heads: int = Field(gt=0, le=MAX_HEADS)
    head_dim: int = Field(gt=0, le=MAX_WIDTH)
    attention: AttentionKind = AttentionKind.DENSE
    # MLA: per-token latent = kv_lora_rank + qk_rope_head_dim values per layer.
    kv_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    # Hybrid: this many layers use a sliding window of ``sliding_window`` tokens; the rest attend to everything.
    sliding_window: int | None = Field(default=None, gt=0, le=MAX_CONTEXT)
    num_sliding_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    # Sparse-read attention (DeepSeek V3.2 DSA) limits what each step *reads*, not what is stored.
    sparse_read_tokens: int | None = Field(default=None, gt=0, le=MAX_CONTEXT)
    # DeepSeek-V4: config.json's compress_ratios for the main layers (0 = sliding window only, 4, 128), without
    # the trailing MTP layer's entry; the indexer's key width (index_head_dim).
    compress_ratios: tuple[int, ...] | None = None
    index_head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    total_params: float = Field(gt=0, le=MAX_PARAMS, description="all parameters, in parameters (not billions)")
    active_params: float = Field(
        gt=0, le=MAX_PARAMS, description="parameters used per token (MoE: shared + routed experts)"
    )
    num_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    experts_per_token: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    # Not bounded by MAX_CONTEXT: configs state rope limits far past what is served; max_model_len is bounded.
    max_position_embeddings: int | None = Field(default=None, gt=0)
    hf_id: str | None = Field(default=None, description="Hugging Face repository id, for the serve command")
    checkpoint_dtype: str = Field(
        default="bf16", description="what the published checkpoint stores most weights in (vLLM's default)"
    )

    @field_validator("checkpoint_dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in WEIGHT_BYTES:
            raise ValueError(f"must be one of {', '.join(WEIGHT_BYTES)}")
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSpec:
        if self.attention is AttentionKind.MLA and (self.kv_lora_rank is None or self.qk_rope_head_dim is None):
            raise ValueError("attention 'mla' needs kv_lora_rank and qk_rope_head_dim")
        if self.attention is AttentionKind.HYBRID:
            if self.sliding_window is None or self.num_sliding_layers == 0:
                raise ValueError("attention 'hybrid' needs sliding_window and num_sliding_layers > 0")
            if self.num_sliding_layers >= self.num_layers:
                raise ValueError("num_sliding_layers must leave at least one full-attention layer")
        if self.attention is AttentionKind.DEEPSEEK_V4:
            ratios = self.compress_ratios
            if ratios is None or len(ratios) != self.num_layers:
                raise ValueError("attention 'deepseek-v4' needs compress_ratios with one entry per layer")
            if any(r not in (0, 4, 128) for r in ratios):
                raise ValueError("compress_ratios entries must be 0, 4 or 128 (the ratios vLLM's layout knows)")
            if self.sliding_window is None or self.qk_rope_head_dim is None or self.index_head_dim is None:
                raise ValueError("attention 'deepseek-v4' needs sliding_window, qk_rope_head_dim and index_head_dim")
            if self.qk_rope_head_dim >= self.head_dim:
                raise ValueError("qk_rope_head_dim must be smaller than head_dim")
        elif self.compress_ratios is not None:
            raise ValueError("compress_ratios is only read for attention 'deepseek-v4'")
        if self.active_params > self.total_params:
            raise ValueError("active_params cannot exceed total_params")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError("experts_per_token must be in 1..num_experts for a MoE model")
        return self

    @property
    def num_full_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers

    def layers_with_ratio(self, ratio: int) -> int:
        """DeepSeek-V4: how many main layers compress by ``ratio`` (0: sliding window only)."""
        return sum(1 for r in self.compress_ratios or () if r == ratio)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def kv_values_per_token_per_layer(self) -> int:
        """K and V values one token leaves in one layer's cache."""
        if self.attention is AttentionKind.DEEPSEEK_V4:
            return self.head_dim  # one shared K/V vector per entry (448 NoPE + 64 RoPE)
        if self.attention is AttentionKind.MLA:
            assert self.kv_lora_rank is not None
            assert self.qk_rope_head_dim is not None
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def expert_split(self) -> tuple[float, float]:
        """(always-read parameters, parameters of one routed expert summed over layers).

        Derived from total and active counts: total = shared + E·e and active = shared + k·e.
        """
        if not self.is_moe:
            return self.total_params, 0.0
        per_expert = (self.total_params - self.active_params) / (self.num_experts - self.experts_per_token)
        shared = self.active_params - self.experts_per_token * per_expert
        return max(shared, 0.0), per_expert
