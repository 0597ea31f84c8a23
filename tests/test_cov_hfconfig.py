"""config.json reading, past what ``test_catalog`` covers: the parameter estimate against published totals for
shapes the catalogue does not hold (a shared-expert MoE, a dense model without a catalogue entry), Gemma 2's
alternation, the weight format from ``quantization_config`` / ``torch_dtype``, the model's name, and the integer
rules a hostile or broken config meets (bool, zero, past the cap, a layer list that is not one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentload.capacity.hfconfig import load_hf_config, looks_like_config_path, model_from_hf_config
from agentload.capacity.models import MAX_LAYERS, AttentionKind
from agentload.errors import ConfigError

# Qwen/Qwen1.5-MoE-A2.7B's config.json (the fields the reader uses). Qwen's model card: 14.3B parameters in all,
# 2.7B activated — a MoE with both routed experts (moe_intermediate_size) and a shared expert
# (shared_expert_intermediate_size), which no catalogue model has.
QWEN15_MOE = {
    "model_type": "qwen2_moe",
    "num_hidden_layers": 24,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}

# mistralai/Mistral-7B-v0.1's config.json; Mistral's paper and model card: 7.24B parameters (7,241,732,096).
MISTRAL_7B = {
    "model_type": "mistral",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
}

# google/gemma-2-9b's config.json: 42 layers alternating local (4096-token window) and global attention,
# the even-numbered layers local (transformers' Gemma2 ``layer_idx % 2 == 0`` → sliding).
GEMMA2_9B = {
    "model_type": "gemma2",
    "num_hidden_layers": 42,
    "hidden_size": 3584,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "intermediate_size": 14336,
    "vocab_size": 256000,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "torch_dtype": "float32",
}


def _write(tmp_path: Path, config: Any, folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_shared_expert_moe_lands_on_the_published_total_and_active_counts() -> None:
    spec = model_from_hf_config(QWEN15_MOE, name="qwen1.5-moe", source="config.json").spec
    assert spec.total_params == pytest.approx(14.3e9, rel=0.01)
    assert spec.active_params == pytest.approx(2.7e9, rel=0.01)
    assert (spec.num_experts, spec.experts_per_token) == (60, 4)


def test_without_the_shared_expert_the_moe_estimate_drops_by_its_weights() -> None:
    # The shared expert is 3 × 2048 × 5632 = 34,603,008 weights per layer, × 24 layers = 830,472,192, in both
    # totals (it runs for every token).
    full = model_from_hf_config(QWEN15_MOE, name="a", source="c").spec
    bare = {k: v for k, v in QWEN15_MOE.items() if k != "shared_expert_intermediate_size"}
    less = model_from_hf_config(bare, name="b", source="c").spec
    assert full.total_params - less.total_params == 830_472_192
    assert full.active_params - less.active_params == 830_472_192


def test_decoder_sparse_step_makes_the_other_layers_dense() -> None:
    # Step 2: layers 1, 3, 5, ... are MoE, 0, 2, 4, ... dense; half the layers trade 60 experts + shared + router
    # for one MLP of intermediate_size, so the total falls and the model still counts as MoE.
    every = model_from_hf_config(QWEN15_MOE, name="a", source="c").spec
    half = model_from_hf_config({**QWEN15_MOE, "decoder_sparse_step": 2}, name="b", source="c").spec
    # Per MoE layer: 60 × 8,650,752 + 34,603,008 + 122,880 = 553,771,008; a dense MLP is 34,603,008.
    assert every.total_params - half.total_params == 12 * (553_771_008 - 34_603_008)


def test_mistral_7b_all_sliding_is_planned_dense_at_its_published_size() -> None:
    loaded = model_from_hf_config(MISTRAL_7B, name="mistral-7b", source="config.json")
    assert loaded.spec.attention is AttentionKind.DENSE
    assert loaded.spec.num_sliding_layers == 0
    assert loaded.spec.total_params == pytest.approx(7.24e9, rel=0.005)
    assert loaded.spec.active_params == loaded.spec.total_params


def test_gemma2_alternates_sliding_and_global_layers() -> None:
    spec = model_from_hf_config(GEMMA2_9B, name="gemma-2-9b", source="config.json").spec
    assert spec.attention is AttentionKind.HYBRID
    assert (spec.num_sliding_layers, spec.sliding_window) == (21, 4096)
    assert spec.head_dim == 256  # stated, not 3584 / 16 = 224


def test_tied_embeddings_count_once() -> None:
    # Untying adds one more vocab × hidden matrix: 32000 × 4096 = 131,072,000 weights.
    tied = model_from_hf_config({**MISTRAL_7B, "tie_word_embeddings": True}, name="a", source="c").spec
    untied = model_from_hf_config(MISTRAL_7B, name="b", source="c").spec
    assert untied.total_params - tied.total_params == 131_072_000


@pytest.mark.parametrize(
    ("extra", "dtype"),
    [
        ({"quantization_config": {"quant_method": "mxfp4"}}, "fp4"),  # gpt-oss
        ({"quantization_config": {"quant_method": "modelopt_fp4"}}, "fp4"),
        ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}, "fp8"),  # DeepSeek-V3
        ({"quantization_config": {"quant_method": "compressed-tensors_fp8"}}, "fp8"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "int4"),
        ({"quantization_config": {"quant_method": "gptq", "bits": 8}}, "int8"),
        ({"torch_dtype": "float16"}, "fp16"),
        ({"torch_dtype": "float32"}, "fp16"),  # vLLM's dtype "auto" serves fp32 checkpoints in fp16
        ({"torch_dtype": None, "dtype": "bfloat16"}, "bf16"),  # transformers ≥ 4.56 writes "dtype"
        ({"torch_dtype": None}, "bf16"),
    ],
)
def test_weight_format_from_the_config(extra: dict[str, Any], dtype: str) -> None:
    loaded = model_from_hf_config({**MISTRAL_7B, **extra}, name="m", source="c")
    assert loaded.spec.checkpoint_dtype == dtype
    assert not any("not recognised" in note for note in loaded.notes)


def test_an_unknown_quantization_is_assumed_bf16_and_says_so() -> None:
    loaded = model_from_hf_config(
        {**MISTRAL_7B, "quantization_config": {"quant_method": "hqq", "bits": 3}}, name="m", source="c"
    )
    assert loaded.spec.checkpoint_dtype == "bf16"
    assert any("'hqq' not recognised" in note for note in loaded.notes)


def test_the_name_comes_from_name_or_path_else_the_folder(tmp_path: Path) -> None:
    saved = _write(tmp_path, {**MISTRAL_7B, "_name_or_path": "/models/mistralai/Mistral-7B-v0.1/"}, "a")
    assert load_hf_config(saved).spec.name == "mistral-7b-v0.1"
    blank = _write(tmp_path, {**MISTRAL_7B, "_name_or_path": " / "}, "My-Checkpoint")
    assert load_hf_config(blank).spec.name == "my-checkpoint"


def test_a_config_that_is_not_an_object_is_one_error(tmp_path: Path) -> None:
    path = _write(tmp_path, [MISTRAL_7B])
    with pytest.raises(ConfigError, match="expected a JSON object at the top level"):
        load_hf_config(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": True}, "'num_hidden_layers' must be a positive integer, got True"),
        ({"hidden_size": 0}, "'hidden_size' must be a positive integer, got 0"),
        ({"num_attention_heads": -8}, "'num_attention_heads' must be a positive integer"),
        ({"intermediate_size": 14336.0}, "'intermediate_size' must be a positive integer"),
        ({"num_hidden_layers": MAX_LAYERS + 1}, "'num_hidden_layers' is .*agentload reads at most"),
        ({"vocab_size": 2**40 + 1}, "'vocab_size' is 1,099,511,627,777; agentload reads at most 1,099,511,627,776"),
        ({"layer_types": "sliding_attention"}, "'layer_types' must list one type per layer"),
        ({"num_attention_heads": 24, "hidden_size": 4000}, "missing field 'head_dim'.*not whole"),
    ],
)
def test_integer_fields_are_checked_and_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        model_from_hf_config({**MISTRAL_7B, **change}, name="m", source="cfg.json")


def test_layer_list_fields_must_hold_layer_numbers() -> None:
    config = {**QWEN15_MOE, "mlp_only_layers": [0, "1"]}
    with pytest.raises(ConfigError, match="'mlp_only_layers' must be a list of layer numbers"):
        model_from_hf_config(config, name="m", source="c")
    dense_first = model_from_hf_config({**QWEN15_MOE, "mlp_only_layers": [0, 1]}, name="m", source="c").spec
    every = model_from_hf_config(QWEN15_MOE, name="m", source="c").spec
    assert dense_first.total_params < every.total_params  # two layers became dense


def test_sliding_layer_types_without_a_window_size_are_refused() -> None:
    config = {k: v for k, v in MISTRAL_7B.items() if k != "sliding_window"}
    config["layer_types"] = ["sliding_attention", "full_attention"] * 16
    with pytest.raises(ConfigError, match="'sliding_window'"):
        model_from_hf_config(config, name="m", source="c")


def test_deepseek_v4_compress_ratios_must_cover_every_layer() -> None:
    config = {
        **MISTRAL_7B,
        "num_hidden_layers": 4,
        "head_dim": 512,
        "compress_ratios": [4, 128, 4],  # three entries for four layers: neither the main layers nor main + MTP
        "qk_rope_head_dim": 64,
        "index_head_dim": 128,
        "q_lora_rank": 1024,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "num_nextn_predict_layers": 1,
    }
    with pytest.raises(ConfigError, match="'compress_ratios' has 3 entries for 4 layers and 0 MTP layers"):
        model_from_hf_config(config, name="v4", source="c")
    # Four main layers and one MTP layer: the MTP entry is dropped, as vLLM serves the main layers' cache.
    spec = model_from_hf_config({**config, "compress_ratios": [4, 128, 4, 128, 1]}, name="v4", source="c").spec
    assert spec.attention is AttentionKind.DEEPSEEK_V4
    assert spec.compress_ratios == (4, 128, 4, 128)


def test_config_path_detection(tmp_path: Path) -> None:
    assert looks_like_config_path("some/where/config.json")  # named like one, even if absent
    assert looks_like_config_path(str(tmp_path))  # an existing folder
    assert not looks_like_config_path("llama-3.1-8b")  # a catalogue name
