"""A Hugging Face ``config.json`` read from a local path into a ``ModelSpec`` — never downloaded.

The fields that decide KV size and step time, by family:

* every decoder: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``; ``num_key_value_heads``
  (absent means multi-head attention, as in transformers); ``head_dim`` (absent: hidden_size ÷ heads);
* mixture of experts: ``num_experts`` (Qwen), ``num_local_experts`` (Mixtral, gpt-oss) or ``n_routed_experts``
  (DeepSeek), with ``num_experts_per_tok`` (``experts_per_token`` in gpt-oss);
* DeepSeek MLA: ``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim`` (the q/k head is nope + rope);
  DeepSeek V3.2's sparse attention: ``index_topk`` tokens read per query;
* DeepSeek-V4: ``compress_ratios`` (one per layer, then one per MTP layer, which is dropped: vLLM serves the
  main layers' cache), ``sliding_window``, ``head_dim`` (one shared K/V vector), ``qk_rope_head_dim``,
  ``index_head_dim`` and ``index_topk``; attention weights from ``q_lora_rank``, ``o_groups``, ``o_lora_rank``;
* sliding window / hybrid: ``sliding_window`` plus ``layer_types`` (gpt-oss, recent Gemma 3 and Qwen configs),
  or Gemma 3's ``sliding_window_pattern`` (every n-th layer global, default 6) and Gemma 2's alternation.
  A config where every layer slides (Mistral 7B v0.1) is planned as full attention: the engine model needs at
  least one full-attention group, and counting the whole context overstates KV, so the plan errs low.

Multimodal configs (Gemma 3) keep the language model in ``text_config``; only that part is read, so the vision
tower (≈ 0.4B parameters for Gemma 3) is left out of the weights. Checkpoints may leave out fields whose
transformers class default applies (Gemma 3's ``text_config`` has no ``vocab_size``, context length or window
pattern); ``CLASS_DEFAULTS`` supplies those for the families that need it, anything else missing is an error.

Parameter counts are not in config.json, so they are estimated from the shapes (see ``estimate_params``): the
matrices of attention, MLP or experts, router and embeddings; norms and biases are left out (< 0.1%). On the
catalogue models the estimate lands within 1% of the published totals (235B, 671B, 117B, 8.03B).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentload.capacity import catalog
from agentload.capacity.models import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS, MAX_WIDTH, AttentionKind, ModelSpec
from agentload.errors import ConfigError
from agentload.inputs import parse_json, read_text

CONFIG_NAME = "config.json"

# Upper bounds on integer fields (config.json is user input), the model's own where it has one: the layer count sizes
# loops here (``num_hidden_layers: 1e9`` looped for minutes) and every figure sizes a product. Any other integer field
# is capped at ``MAX_INT``, far past any vocabulary, MLP width or context length.
MAX_INT = 2**40
FIELD_MAX = {
    "num_hidden_layers": MAX_LAYERS,
    "hidden_size": MAX_WIDTH,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "head_dim": MAX_WIDTH,
    "num_experts": MAX_EXPERTS,
    "num_local_experts": MAX_EXPERTS,
    "n_routed_experts": MAX_EXPERTS,
    "n_shared_experts": MAX_EXPERTS,
    "num_experts_per_tok": MAX_EXPERTS,
    "experts_per_token": MAX_EXPERTS,
}

# transformers' defaults for fields a published config.json omits, by ``model_type`` (Gemma3TextConfig).
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
}


@dataclass(frozen=True, slots=True)
class HFModel:
    """A model read from a config.json, with what had to be assumed to read it."""

    spec: ModelSpec
    source: str
    notes: tuple[str, ...]


def looks_like_config_path(text: str) -> bool:
    """True for an existing file or folder, or anything named like a JSON file (a catalogue name never is)."""
    return text.endswith(".json") or Path(text).exists()


def load_hf_config(path: str | Path) -> HFModel:
    """Read ``config.json`` (or the one inside a folder) from disk and turn it into a ``ModelSpec``."""
    p = Path(path)
    if p.is_dir():
        p = p / CONFIG_NAME
    raw = parse_json(read_text(p, "model config"), str(p))
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: expected a JSON object at the top level")
    return model_from_hf_config(raw, name=_model_name(raw, p), source=str(p))


def _model_name(raw: Mapping[str, Any], path: Path) -> str:
    """A name for the plan: the checkpoint's ``_name_or_path`` if saved, else the folder (usually the repo name)."""
    saved = raw.get("_name_or_path")
    if isinstance(saved, str) and saved.strip("/ "):
        return saved.strip("/ ").split("/")[-1].lower()
    folder = path.resolve().parent.name
    return folder.lower() or "model"


class _Fields:
    """Typed access to config fields that names the field (and the file) when one is missing or wrong."""

    def __init__(self, cfg: Mapping[str, Any], source: str) -> None:
        self.cfg = cfg
        self.source = source

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def int_(self, key: str, default: int | None = None) -> int:
        value = self.cfg.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self.source}: missing field {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{self.source}: field {key!r} must be a positive integer, got {value!r}")
        top = FIELD_MAX.get(key, MAX_INT)
        if value > top:
            raise ConfigError(f"{self.source}: field {key!r} is {value:,}; agentload reads at most {top:,}")
        return value

    def int_list(self, key: str) -> list[int]:
        """A list of non-negative integers (layer indices); absent is empty."""
        value = self.cfg.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise ConfigError(f"{self.source}: field {key!r} must be a list of layer numbers, got {value!r}")
        return value

    def first_int(self, keys: tuple[str, ...], default: int) -> int:
        for key in keys:
            if self.has(key):
                return self.int_(key)
        return default


def model_from_hf_config(config: Mapping[str, Any], *, name: str, source: str) -> HFModel:
    """Map a parsed config.json to a ``ModelSpec`` (see the module docstring for the fields read)."""
    cfg = _merged_config(config)
    f = _Fields(cfg, source)
    notes: list[str] = []
    model_type = str(cfg.get("model_type", ""))

    layers = f.int_("num_hidden_layers")
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    if f.has("num_key_value_heads"):
        kv_heads = f.int_("num_key_value_heads")
    else:
        kv_heads = heads
        notes.append("num_key_value_heads absent: multi-head attention assumed (one KV head per query head)")
    head_dim, fields = _attention_fields(f, layers, hidden, heads)
    experts, per_token = _experts(f)

    sliding = 0 if "compress_ratios" in fields else _sliding_layers(f, model_type, layers)
    if sliding == layers:
        notes.append("every layer uses a sliding window: planned as full attention (overstates KV, errs low)")
    elif sliding:
        fields.update(
            attention=AttentionKind.HYBRID, sliding_window=f.int_("sliding_window"), num_sliding_layers=sliding
        )

    total, active = estimate_params(f, layers, hidden, heads, kv_heads, head_dim, experts, per_token)
    notes.append("total and active parameters estimated from the layer shapes (config.json does not state them)")

    dtype, dtype_note = _checkpoint_dtype(cfg)
    if dtype_note:
        notes.append(dtype_note)
    spec = catalog.model_from_mapping(
        name,
        {
            "num_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "total_params": total,
            "active_params": active,
            "num_experts": experts,
            "experts_per_token": per_token,
            "max_position_embeddings": cfg.get("max_position_embeddings"),
            "checkpoint_dtype": dtype,
            **fields,
        },
        source,
    )
    return HFModel(spec, source, tuple(notes))


def _merged_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal config's ``text_config`` lifted to the top, over the model class's defaults, nulls dropped."""
    cfg: Mapping[str, Any] = config
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping):
        cfg = {**{k: v for k, v in config.items() if k != "text_config"}, **text_config}
    defaults = CLASS_DEFAULTS.get(str(cfg.get("model_type", "")), {})
    return {**defaults, **{k: v for k, v in cfg.items() if v is not None}}


def _attention_fields(f: _Fields, layers: int, hidden: int, heads: int) -> tuple[int, dict[str, Any]]:
    """The head size and the attention's own fields: DeepSeek-V4 (compress ratios), MLA (a latent), or plain."""
    fields: dict[str, Any] = {}
    if f.has("compress_ratios"):
        head_dim = f.int_("head_dim")
        fields.update(
            attention=AttentionKind.DEEPSEEK_V4,
            compress_ratios=_main_compress_ratios(f, layers),
            sliding_window=f.int_("sliding_window"),
            qk_rope_head_dim=f.int_("qk_rope_head_dim"),
            index_head_dim=f.int_("index_head_dim"),
        )
        if f.has("index_topk"):
            fields["sparse_read_tokens"] = f.int_("index_topk")
    elif f.has("kv_lora_rank"):
        rope = f.int_("qk_rope_head_dim")
        nope = f.int_("qk_nope_head_dim")
        head_dim = nope + rope
        fields.update(attention=AttentionKind.MLA, kv_lora_rank=f.int_("kv_lora_rank"), qk_rope_head_dim=rope)
        if f.has("index_topk"):
            fields["sparse_read_tokens"] = f.int_("index_topk")
    elif f.has("head_dim"):
        head_dim = f.int_("head_dim")
    else:
        if hidden % heads:
            raise ConfigError(
                f"{f.source}: missing field 'head_dim' (hidden_size {hidden} ÷ {heads} heads is not whole)"
            )
        head_dim = hidden // heads
    return head_dim, fields


def _experts(f: _Fields) -> tuple[int, int]:
    """(routed experts, experts per token), both 0 for a dense model."""
    experts = f.first_int(("num_experts", "num_local_experts", "n_routed_experts"), 0)
    per_token = f.first_int(("num_experts_per_tok", "experts_per_token"), 0) if experts else 0
    if experts and not per_token:
        raise ConfigError(f"{f.source}: missing field 'num_experts_per_tok' for a model with {experts} experts")
    return experts, per_token


def _main_compress_ratios(f: _Fields, layers: int) -> list[int]:
    """DeepSeek-V4's compress ratios of the main layers: the entries past ``num_hidden_layers`` are MTP layers."""
    ratios = f.int_list("compress_ratios")
    mtp = f.first_int(("num_nextn_predict_layers",), len(ratios) - layers) if len(ratios) > layers else 0
    if len(ratios) != layers + mtp:
        raise ConfigError(
            f"{f.source}: field 'compress_ratios' has {len(ratios)} entries for {layers} layers and {mtp} MTP layers"
        )
    return ratios[:layers]


def _sliding_layers(f: _Fields, model_type: str, layers: int) -> int:
    """How many layers use a sliding window."""
    layer_types = f.cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers:
            raise ConfigError(f"{f.source}: field 'layer_types' must list one type per layer ({layers})")
        count = sum(1 for t in layer_types if "sliding" in str(t))
        if count:
            f.int_("sliding_window")  # a sliding layer without a window size is a malformed config
        return count
    if not f.has("sliding_window") or f.cfg.get("use_sliding_window") is False:
        # Qwen2 configs carry a sliding_window that is switched off by use_sliding_window = false.
        return 0
    if model_type.startswith("gemma3"):
        # transformers' Gemma 3: layer i is global when (i + 1) % pattern == 0, local otherwise.
        pattern = f.int_("sliding_window_pattern", 6)
        return sum(1 for i in range(layers) if (i + 1) % pattern)
    if model_type == "gemma2":
        return sum(1 for i in range(layers) if i % 2 == 0)
    return layers


def estimate_params(
    f: _Fields,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    experts: int,
    per_token: int,
) -> tuple[float, float]:
    """(total, active) parameters from the matrix shapes; embeddings count in both (they are stored and read).

    Attention: q, k, v and o projections (MLA: the low-rank q and kv factors and o). MLP: three matrices (gated
    SwiGLU/GeGLU) of ``intermediate_size``. MoE layers: every expert (three matrices of ``moe_intermediate_size``,
    or ``intermediate_size`` when there is none) plus shared experts and the router; active counts only
    ``per_token`` routed experts. DeepSeek's first ``first_k_dense_replace`` layers and Qwen's
    ``mlp_only_layers`` are dense.
    """
    cfg = f.cfg
    if f.has("compress_ratios"):
        # DeepSeek-V4: low-rank q, one shared K/V projection, grouped low-rank output (o_groups × o_lora_rank).
        # The compressors and the indexer are a few per cent of attention and are left out.
        q_low = f.int_("q_lora_rank")
        o_rank, o_groups = f.int_("o_lora_rank"), f.int_("o_groups")
        q = hidden * q_low + q_low * heads * head_dim
        attention = q + hidden * head_dim + heads * head_dim * o_rank + o_groups * o_rank * hidden
    elif f.has("kv_lora_rank"):
        rank, rope, nope = f.int_("kv_lora_rank"), f.int_("qk_rope_head_dim"), f.int_("qk_nope_head_dim")
        v_dim = f.int_("v_head_dim", nope)
        q_rank = f.int_("q_lora_rank") if f.has("q_lora_rank") else None
        q_in = q_rank if q_rank is not None else hidden  # without a q LoRA, q is one hidden × heads matrix
        q = (hidden * q_rank if q_rank is not None else 0) + q_in * heads * (nope + rope)
        attention = q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    if not experts:
        mlp = 3 * hidden * f.int_("intermediate_size")
        total = active = float(layers * mlp)
    else:
        total = active = 0.0
        # gpt-oss and Mixtral give the expert width as intermediate_size; DeepSeek and Qwen as moe_intermediate_size.
        width = f.int_("moe_intermediate_size") if f.has("moe_intermediate_size") else f.int_("intermediate_size")
        expert = 3 * hidden * width
        shared = f.first_int(("n_shared_experts",), 0) * expert
        if f.has("shared_expert_intermediate_size"):
            shared += 3 * hidden * f.int_("shared_expert_intermediate_size")
        router = hidden * experts
        first_dense = f.first_int(("first_k_dense_replace",), 0)
        dense_only = set(f.int_list("mlp_only_layers"))
        step = f.first_int(("decoder_sparse_step",), 1)
        for i in range(layers):
            if i < first_dense or i in dense_only or (i + 1) % step:
                mlp = 3 * hidden * f.int_("intermediate_size")
                total += mlp
                active += mlp
            else:
                total += experts * expert + shared + router
                active += per_token * expert + shared + router
    vocab = f.int_("vocab_size")
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    total += layers * attention + embeddings
    active += layers * attention + embeddings
    return float(total), float(active)


def _checkpoint_dtype(cfg: Mapping[str, Any]) -> tuple[str, str | None]:
    """The weight format vLLM would load by default, from ``quantization_config`` or ``torch_dtype``."""
    quant = cfg.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        if "fp4" in method or method in ("mxfp4", "nvfp4"):
            return "fp4", None
        if "fp8" in method:
            return "fp8", None
        bits = quant.get("bits")
        if bits == 4:
            return "int4", None
        if bits == 8:
            return "int8", None
        return "bf16", f"quantization method {method!r} not recognised: bf16 weights assumed"
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    if dtype in ("bfloat16", "bf16"):
        return "bf16", None
    # vLLM's dtype "auto" serves fp32 and fp16 checkpoints in fp16.
    return "fp16", None
