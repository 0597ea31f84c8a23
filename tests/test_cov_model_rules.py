"""A model's shape is checked as vLLM would refuse it: inconsistent attention fields, active > total parameters,
heads that do not split over the tensor-parallel GPUs; and the per-GPU KV figures under tensor parallelism
(a KV head is split, or replicated when there are more GPUs than KV heads; MLA's latent is on every rank)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agentload.capacity.catalog import get_model
from agentload.capacity.hardware import GpuSpec
from agentload.capacity.kv import KVDtype, kv_layout, parse_kv_dtype
from agentload.capacity.models import AttentionKind, ModelSpec
from agentload.errors import ConfigError

KIB = 1024

# A small dense shape: 4 layers, 8 heads of 64, 2 KV heads.
BASE: dict[str, Any] = {
    "name": "toy",
    "num_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "head_dim": 64,
    "total_params": 1e8,
    "active_params": 1e8,
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention": "mla", "kv_lora_rank": 512}, "attention 'mla' needs kv_lora_rank and qk_rope_head_dim"),
        ({"attention": "hybrid", "sliding_window": 128}, "attention 'hybrid' needs sliding_window"),
        ({"attention": "hybrid", "num_sliding_layers": 2}, "attention 'hybrid' needs sliding_window"),
        (
            {"attention": "hybrid", "sliding_window": 128, "num_sliding_layers": 4},
            "must leave at least one full-attention layer",
        ),
        ({"compress_ratios": [4, 4, 4, 4]}, "compress_ratios is only read for attention 'deepseek-v4'"),
        ({"attention": "deepseek-v4", "compress_ratios": [4, 4]}, "one entry per layer"),
        ({"attention": "deepseek-v4", "compress_ratios": [4, 8, 4, 128]}, "must be 0, 4 or 128"),
        ({"attention": "deepseek-v4", "compress_ratios": [0, 4, 128, 4]}, "needs sliding_window, qk_rope_head_dim"),
        (
            {
                "attention": "deepseek-v4",
                "compress_ratios": [0, 4, 128, 4],
                "sliding_window": 128,
                "qk_rope_head_dim": 64,
                "index_head_dim": 128,
            },
            "qk_rope_head_dim must be smaller than head_dim",
        ),
        ({"active_params": 2e8}, "active_params cannot exceed total_params"),
        ({"num_experts": 8, "experts_per_token": 0}, "experts_per_token must be in 1..num_experts"),
        ({"num_experts": 8, "experts_per_token": 9}, "experts_per_token must be in 1..num_experts"),
        ({"checkpoint_dtype": "int3"}, "must be one of"),
        ({"num_layers": 0}, "num_layers"),
    ],
)
def test_an_inconsistent_model_is_refused_with_the_rule(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelSpec(**{**BASE, **change})


def test_a_consistent_hybrid_and_moe_model_is_taken() -> None:
    spec = ModelSpec(
        **{**BASE, "attention": "hybrid", "sliding_window": 128, "num_sliding_layers": 3, "num_experts": 8},
        experts_per_token=2,
    )
    assert (spec.num_full_layers, spec.is_moe) == (1, True)
    assert spec.attention is AttentionKind.HYBRID


def test_dense_kv_per_token_is_two_values_per_kv_head_and_layer() -> None:
    # 4 layers × 2 (K and V) × 2 KV heads × 64 dims × 2 bytes (bf16) = 2,048 bytes per token.
    assert kv_layout(ModelSpec(**BASE), KVDtype.BF16).bytes_per_token == 2048
    assert kv_layout(ModelSpec(**BASE), KVDtype.FP8).bytes_per_token == 1024


def test_llama_70b_splits_its_kv_heads_over_8_gpus_and_replicates_them_over_16() -> None:
    model = get_model("llama-3.1-70b")  # 80 layers, 64 heads, 8 KV heads of 128
    # 80 layers × 2 (K, V) × 8 KV heads × 128 × 2 bytes = 327,680 bytes = 320 KiB per token in bf16.
    one = kv_layout(model, KVDtype.BF16)
    assert one.bytes_per_token == 320 * KIB
    # TP 8: one KV head per GPU, each token's KV stored once across the ranks.
    assert kv_layout(model, KVDtype.BF16, tensor_parallel=8).replication == 1.0
    # TP 16: more GPUs than KV heads — vLLM replicates each head on 16 / 8 = 2 GPUs: twice the KV in all.
    assert kv_layout(model, KVDtype.BF16, tensor_parallel=16).replication == 2.0


def test_heads_that_do_not_split_are_refused_as_vllm_refuses_them() -> None:
    model = get_model("qwen2.5-0.5b")  # 14 heads, 2 KV heads
    assert kv_layout(model, KVDtype.BF16, tensor_parallel=2).replication == 1.0
    with pytest.raises(ConfigError, match="14 attention heads do not split over 4 GPUs"):
        kv_layout(model, KVDtype.BF16, tensor_parallel=4)
    # 14 heads split over 7, but 2 KV heads neither split over 7 nor replicate a whole number of times.
    with pytest.raises(ConfigError, match="2 KV heads do not split over \\(or replicate across\\) 7 GPUs"):
        kv_layout(model, KVDtype.BF16, tensor_parallel=7)


def test_mla_latent_is_stored_on_every_rank() -> None:
    model = get_model("deepseek-v3")
    # DeepSeek-V3: 61 layers × (512 latent + 64 rope) × 2 bytes = 70,272 bytes per token in bf16.
    assert kv_layout(model, KVDtype.BF16).bytes_per_token == 61 * 576 * 2
    assert kv_layout(model, KVDtype.BF16, tensor_parallel=8).replication == 8.0


@pytest.mark.parametrize(
    ("block", "tp", "message"), [(0, 1, "block size must be positive"), (16, 0, "tensor parallel")]
)
def test_a_layout_needs_a_positive_block_and_gpu_count(block: int, tp: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kv_layout(ModelSpec(**BASE), KVDtype.BF16, block_size=block, tensor_parallel=tp)


@pytest.mark.parametrize(
    ("text", "dtype"),
    [("auto", "bf16"), ("BFloat16", "bf16"), (" half ", "fp16"), ("float16", "fp16"), ("fp8_e4m3", "fp8"),
     ("fp8_e5m2", "fp8"), ("fp8", "fp8")],
)  # fmt: skip
def test_vllm_kv_cache_dtype_spellings(text: str, dtype: str) -> None:
    assert parse_kv_dtype(text).value == dtype


def test_an_unknown_kv_dtype_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown kv cache dtype 'int4'; use bf16, fp16 or fp8"):
        parse_kv_dtype("int4")


@pytest.mark.parametrize(
    "change",
    [{"memory_gb": 0}, {"bandwidth_gbps": float("inf")}, {"tflops_bf16": float("nan")}, {"memory_gb": 1e9},
     {"tflops_fp8": -1}, {"host_memory_gb": -1}, {"vendor": "x"}],
)  # fmt: skip
def test_a_gpu_table_from_a_profile_is_bounded_and_finite(change: dict[str, Any]) -> None:
    base = {"name": "g", "memory_gb": 80, "bandwidth_gbps": 3350, "tflops_bf16": 989}
    GpuSpec(**base)  # the H100 SXM's datasheet figures are fine
    with pytest.raises(ValidationError):
        GpuSpec(**{**base, **change})
