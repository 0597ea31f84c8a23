"""The model and GPU catalogues, and Hugging Face config.json files read from disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentload.capacity import catalog
from agentload.capacity.hfconfig import load_hf_config, model_from_hf_config
from agentload.capacity.kv import KVDtype, kv_layout
from agentload.capacity.models import AttentionKind
from agentload.errors import ConfigError, UnknownNameError

KIB = 1024

ISSUE_MODELS = [
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen3-32b",
    "qwen3-235b-a22b",
    "qwen2.5-0.5b",
    "deepseek-v3",
    "deepseek-v3.2",
    "gpt-oss-120b",
    "gemma-3-27b",
]


def test_every_model_the_issue_names_is_in_the_catalogue() -> None:
    assert set(ISSUE_MODELS) <= set(catalog.models())


# (name, memory GB, bandwidth GB/s, dense bf16 TFLOP/s) from docs/background.md §6.
DOMAIN_GPUS = [
    ("h100", 80, 3350, 989),
    ("h200", 141, 4800, 989),
    ("b200", 180, 8000, 2250),
    ("gb200", 186, 8000, 2500),
    ("gb300", 288, 8000, 2500),
    ("dgx-station-gb300", 252, 8000, 2500),
    ("rtx-pro-6000", 96, 1790, 500),
    ("l40s", 48, 864, 362),
    ("a100-80gb", 80, 2039, 312),
]


@pytest.mark.parametrize(("name", "memory", "bandwidth", "tflops"), DOMAIN_GPUS)
def test_gpu_datasheet_figures(name: str, memory: float, bandwidth: float, tflops: float) -> None:
    gpu = catalog.get_gpu(name)
    assert (gpu.memory_gb, gpu.bandwidth_gbps, gpu.tflops_bf16) == (memory, bandwidth, tflops)


def test_dgx_station_reaches_its_lpddr5x_at_396_gb_s() -> None:
    station = catalog.get_gpu("dgx-station-gb300")
    assert (station.host_memory_gb, station.host_link_gbps) == (496, 396)


def test_a100_has_no_fp8_and_hopper_doubles_bf16() -> None:
    assert catalog.get_gpu("a100").tflops_fp8 is None
    assert catalog.get_gpu("h100").tflops_fp8 == 1979


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b"),
        ("google/gemma-3-27b-it", "gemma-3-27b"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek-v3.2"),
    ],
)
def test_models_are_found_by_their_hugging_face_ids(alias: str, name: str) -> None:
    assert catalog.get_model(alias).name == name


@pytest.mark.parametrize(("alias", "name"), [("RTX PRO 6000 Blackwell", "rtx-pro-6000"), ("H100_SXM", "h100")])
def test_gpus_are_found_by_other_spellings(alias: str, name: str) -> None:
    assert catalog.get_gpu(alias).name == name


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        catalog.get_model("llama-9")
    message = str(info.value)
    assert "'llama-9'" in message
    assert all(name in message for name in ISSUE_MODELS)


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"known: .*gb300.*h100"):
        catalog.get_gpu("tpu-v5")


def test_published_dtypes_decide_the_default_weight_format() -> None:
    assert catalog.get_model("deepseek-v3").checkpoint_dtype == "fp8"
    assert catalog.get_model("gpt-oss-120b").checkpoint_dtype == "fp4"
    assert catalog.get_model("qwen3-235b-a22b").checkpoint_dtype == "bf16"


# -- config.json --------------------------------------------------------------------------------------------------
# Trimmed copies of the published config.json files (the fields that matter, with their real values).

LLAMA_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
QWEN3_235B: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 94,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 40960,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"},
}
GPT_OSS_120B: dict[str, Any] = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "vocab_size": 201088,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4"},
}
# Gemma 3's published config nests the language model and leaves vocab size, context and window pattern to the
# transformers class defaults.
GEMMA3_27B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "sliding_window": 1024,
    },
    "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
    "torch_dtype": "bfloat16",
}
QWEN25_05B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def _write(tmp_path: Path, config: dict[str, Any], folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_llama_config_matches_the_catalogue(tmp_path: Path) -> None:
    loaded = load_hf_config(_write(tmp_path, LLAMA_8B, "Llama-3.1-8B-Instruct"))
    spec = loaded.spec
    assert spec.name == "llama-3.1-8b-instruct"
    assert kv_layout(spec, KVDtype.BF16).bytes_per_token == 128 * KIB
    assert spec.total_params == pytest.approx(8.03e9, rel=0.01)
    assert spec.max_position_embeddings == 131072
    assert spec.checkpoint_dtype == "bf16"
    assert any("estimated from the layer shapes" in note for note in loaded.notes)


def test_a_folder_holding_config_json_works(tmp_path: Path) -> None:
    path = _write(tmp_path, LLAMA_8B, "ckpt")
    assert load_hf_config(path.parent).spec == load_hf_config(path).spec


def test_qwen3_moe_config(tmp_path: Path) -> None:
    spec = load_hf_config(_write(tmp_path, QWEN3_235B)).spec
    assert kv_layout(spec, KVDtype.BF16).bytes_per_token == 188 * KIB
    assert (spec.num_experts, spec.experts_per_token) == (128, 8)
    assert spec.total_params == pytest.approx(235e9, rel=0.01)
    assert spec.active_params == pytest.approx(22e9, rel=0.03)
    assert spec.attention is AttentionKind.DENSE  # sliding_window is null


def test_deepseek_mla_config(tmp_path: Path) -> None:
    spec = load_hf_config(_write(tmp_path, DEEPSEEK_V3)).spec
    assert spec.attention is AttentionKind.MLA
    assert kv_layout(spec, KVDtype.BF16).bytes_per_token / KIB == pytest.approx(68.6, abs=0.05)
    assert spec.head_dim == 192
    assert spec.total_params == pytest.approx(671e9, rel=0.01)
    assert spec.active_params == pytest.approx(37e9, rel=0.03)
    assert spec.checkpoint_dtype == "fp8"
    assert spec.sparse_read_tokens is None


def test_deepseek_v32_sparse_attention_reads_index_topk(tmp_path: Path) -> None:
    spec = load_hf_config(_write(tmp_path, {**DEEPSEEK_V3, "model_type": "deepseek_v32", "index_topk": 2048})).spec
    assert spec.sparse_read_tokens == 2048
    assert kv_layout(spec, KVDtype.FP8).bytes_per_token / KIB == pytest.approx(34.3, abs=0.05)


def test_gpt_oss_layer_types_make_it_hybrid(tmp_path: Path) -> None:
    spec = load_hf_config(_write(tmp_path, GPT_OSS_120B)).spec
    assert spec.attention is AttentionKind.HYBRID
    assert (spec.num_sliding_layers, spec.sliding_window) == (18, 128)
    assert kv_layout(spec, KVDtype.BF16).growing_bytes_per_token == 36 * KIB
    assert spec.total_params == pytest.approx(117e9, rel=0.01)
    assert spec.checkpoint_dtype == "fp4"


def test_gemma3_nested_config_with_class_defaults(tmp_path: Path) -> None:
    spec = load_hf_config(_write(tmp_path, GEMMA3_27B)).spec
    assert spec.attention is AttentionKind.HYBRID
    assert (spec.num_sliding_layers, spec.sliding_window) == (52, 1024)
    assert kv_layout(spec, KVDtype.BF16).growing_bytes_per_token == 80 * KIB
    assert spec.max_position_embeddings == 131072
    # The language model only: the published 27.4B includes a ≈0.4B vision tower.
    assert spec.total_params == pytest.approx(27.0e9, rel=0.02)


def test_explicit_layer_types_override_the_gemma_pattern(tmp_path: Path) -> None:
    text = {**GEMMA3_27B["text_config"], "layer_types": ["sliding_attention"] * 31 + ["full_attention"] * 31}
    spec = load_hf_config(_write(tmp_path, {**GEMMA3_27B, "text_config": text})).spec
    assert spec.num_sliding_layers == 31


def test_qwen2_sliding_window_switched_off_is_dense(tmp_path: Path) -> None:
    spec = load_hf_config(_write(tmp_path, QWEN25_05B)).spec
    assert spec.attention is AttentionKind.DENSE
    assert kv_layout(spec, KVDtype.BF16).bytes_per_token == 12 * KIB
    assert spec.total_params == pytest.approx(0.494e9, rel=0.01)


def test_every_layer_sliding_is_planned_as_full_attention(tmp_path: Path) -> None:
    mistral = {**LLAMA_8B, "model_type": "mistral", "sliding_window": 4096, "max_position_embeddings": 32768}
    loaded = load_hf_config(_write(tmp_path, mistral))
    assert loaded.spec.attention is AttentionKind.DENSE
    assert any("every layer uses a sliding window" in note for note in loaded.notes)


def test_missing_kv_heads_means_multi_head_attention() -> None:
    config = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    loaded = model_from_hf_config(config, name="mha", source="config.json")
    assert loaded.spec.num_kv_heads == 32
    assert any("multi-head" in note for note in loaded.notes)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({k: v for k, v in LLAMA_8B.items() if k != "num_hidden_layers"}, "num_hidden_layers"),
        ({k: v for k, v in LLAMA_8B.items() if k != "hidden_size"}, "hidden_size"),
        ({k: v for k, v in LLAMA_8B.items() if k != "vocab_size"}, "vocab_size"),
        ({k: v for k, v in LLAMA_8B.items() if k != "intermediate_size"}, "intermediate_size"),
        ({k: v for k, v in DEEPSEEK_V3.items() if k != "qk_rope_head_dim"}, "qk_rope_head_dim"),
        ({k: v for k, v in QWEN3_235B.items() if k != "num_experts_per_tok"}, "num_experts_per_tok"),
        ({k: v for k, v in GPT_OSS_120B.items() if k != "sliding_window"}, "sliding_window"),
        ({**LLAMA_8B, "num_hidden_layers": "32"}, "num_hidden_layers"),
        ({**LLAMA_8B, "layer_types": ["full_attention"] * 3}, "layer_types"),
    ],
)
def test_malformed_config_names_the_field(tmp_path: Path, config: dict[str, Any], field: str) -> None:
    path = _write(tmp_path, config)
    with pytest.raises(ConfigError, match=f"'{field}'") as info:
        load_hf_config(path)
    assert str(path) in str(info.value)


def test_config_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_config(path)


def test_folder_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path)
