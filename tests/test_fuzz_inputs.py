"""Property-based fuzzers for the input parsers: traces, FLEET.toml, profiles and config.json.

Each generates hostile input — random bytes, and well-formed files whose values are out of range, of the wrong
type, huge, NaN or infinite — and holds the parser to its contract: a valid object or an ``AgentloadError``
(``ConfigError`` and kin), nothing else. A valid object is then used the way the commands use it (a trace's
replay schedule, a fleet's expansion, a resolved profile's pool), and must stay inside the stated bounds.

The budget is ``fuzz_examples(N)`` (``AGENTLOAD_FUZZ_EXAMPLES=10000`` for the closing figures).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from agentload.capacity.hfconfig import load_hf_config, model_from_hf_config
from agentload.capacity.profile import MAX_POOL_BLOCKS, ServingProfile, parse_profile
from agentload.errors import AgentloadError
from agentload.fleet.config import MAX_AGENTS, MAX_CONTEXT_TOKENS, expand, parse_fleet
from agentload.workload.trace import (
    MAX_TRACE_TOKENS,
    MooncakeTrace,
    MooncakeWorkload,
    SessionReplayWorkload,
    SessionTraceFile,
    load_trace,
)
from tests.fuzzing import fuzz_examples

LAPTOP = (Path(__file__).resolve().parents[1] / "src/agentload/data/profiles/laptop.toml").read_text("utf-8")

# Numbers a parser meets in hostile files: edges, huge, negative, non-finite, and the wrong types.
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**10, 10**17]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e10, 1e17, 1e308, 0.5, -0.0]),
)
scalars = st.one_of(numbers, st.booleans(), st.text(max_size=12), st.none())
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)


def _write(data: str | bytes) -> Path:
    # One file per example (hypothesis runs many examples per test, so tmp_path would be shared anyway).
    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return Path(f.name)


def _toml(value: Any) -> str:
    """A TOML literal for ``value`` (NaN and inf spelled as TOML spells them; None as an empty string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps("" if value is None else value)


# -- traces ------------------------------------------------------------------------------------------------------

MOONCAKE_KEYS = ["timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay"]
TURN_KEYS = ["prompt_tokens", "completion_tokens", "cached_tokens", "think_s", "tool_s"]
SESSION_KEYS = ["session_id", "agent", "start_s", "shared_prefix_tokens"]


def _row(draw: st.DrawFn) -> dict[str, Any]:
    row: dict[str, Any] = {"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1, 2]}
    for key in draw(st.lists(st.sampled_from(MOONCAKE_KEYS), max_size=3)):
        row[key] = draw(values)
    return row


def _session(draw: st.DrawFn) -> dict[str, Any]:
    turns = []
    for _ in range(draw(st.integers(1, 3))):
        turn: dict[str, Any] = {"prompt_tokens": 100, "completion_tokens": 10}
        for key in draw(st.lists(st.sampled_from(TURN_KEYS), max_size=2)):
            turn[key] = draw(values)
        turns.append(turn)
    session: dict[str, Any] = {"session_id": draw(st.text(max_size=4)), "turns": turns}
    for key in draw(st.lists(st.sampled_from(SESSION_KEYS), max_size=2)):
        session[key] = draw(values)
    return session


@st.composite
def trace_files(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["bytes", "text", "mooncake", "session", "mixed"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.text(max_size=300))
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        use_session = kind == "session" or (kind == "mixed" and draw(st.booleans()))
        rows.append(_session(draw) if use_session else _row(draw))
    lines = [json.dumps(r) for r in rows]  # NaN and inf come out as NaN / Infinity, as other writers spell them
    if draw(st.booleans()):
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]  # a torn or garbled line
    return "\n".join(lines) + "\n"


@settings(max_examples=fuzz_examples(300))
@given(trace_files())
def test_fuzz_trace_loader_gives_a_trace_or_an_agentload_error(data: str | bytes) -> None:
    path = _write(data)
    try:
        loaded = load_trace(path)
    except AgentloadError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    finally:
        path.unlink()
    event("accepted")
    assert isinstance(loaded, MooncakeTrace | SessionTraceFile)
    if isinstance(loaded, MooncakeTrace):
        assert all(1 <= r.input_length <= MAX_TRACE_TOKENS for r in loaded.rows)
        workload = MooncakeWorkload(loaded)  # builds the replay schedule from the timestamps
        assert all(math.isfinite(j.start_s) and j.start_s >= 0 for j in workload._jobs)
        assert len(workload.agents(2, context=0, seed=0)) == 2
    else:
        times = [s.start_s for s in loaded.sessions] + [t.think_s + t.tool_s for s in loaded.sessions for t in s.turns]
        assert all(math.isfinite(x) for x in times)
        assert len(SessionReplayWorkload(loaded).agents(2, context=0, seed=0)) == 2


# -- FLEET.toml --------------------------------------------------------------------------------------------------

TASK_KEYS = [
    "model",
    "system",
    "tools",
    "tool_choice",
    "max_rounds",
    "max_tokens",
    "temperature",
    "think_time_s",
    "tool_latency_s",
    "context_tokens",
    "tool_result_tokens",
    "count",
    "depends_on",
    "prompt",
    "id",
]


@st.composite
def fleet_files(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=300))
    lines = []
    if draw(st.booleans()):
        lines.append("[defaults]")
        for key in draw(st.lists(st.sampled_from(TASK_KEYS[:11]), max_size=3, unique=True)):
            lines.append(f"{key} = {_toml(draw(values))}")
    n = draw(st.integers(1, 4))
    for i in range(n):
        task: dict[str, Any] = {"id": f"t{i}", "prompt": "Do {replica}.", "max_rounds": 2}
        if i and draw(st.booleans()):
            task["depends_on"] = [f"t{draw(st.integers(0, n - 1))}"]  # may name itself or form a cycle
        for key in draw(st.lists(st.sampled_from(TASK_KEYS), max_size=3, unique=True)):
            task[key] = draw(values)
        lines.append("[[tasks]]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in task.items())
    return "\n".join(lines) + "\n"


@settings(max_examples=fuzz_examples(300))
@given(fleet_files())
def test_fuzz_fleet_parser_gives_a_fleet_or_an_agentload_error(text: str) -> None:
    try:
        fleet = parse_fleet(text, "fuzz.toml")
    except AgentloadError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    plans = expand(fleet)
    assert 1 <= len(plans) <= MAX_AGENTS
    assert all(0 <= p.context_tokens <= MAX_CONTEXT_TOKENS for p in plans)
    assert all(math.isfinite(p.think_time_s) and math.isfinite(p.tool_latency_s) for p in plans)


# -- profiles ----------------------------------------------------------------------------------------------------

PROFILE_FIELDS = [
    ("", "num_gpus"),
    ("", "block_size"),
    ("", "max_model_len"),
    ("", "max_num_batched_tokens"),
    ("", "max_num_seqs"),
    ("", "weight_dtype"),
    ("", "kv_cache_dtype"),
    ("", "model"),
    ("", "gpu"),
    ("kv_pool", "tokens"),
    ("kv_pool", "num_blocks"),
    ("kv_pool", "gpu_memory_utilization"),
    ("kv_pool", "activation_gib"),
    ("offload", "gib"),
    ("offload", "load_gbps"),
    ("step", "mfu"),
    ("step", "bandwidth_efficiency"),
    ("step", "step_s"),
    ("step", "request_s"),
    ("step", "layer_s"),
    ("step", "api_overhead_s"),
]
MODEL_TABLE = {
    "name": "m",
    "num_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "total_params": 1e6,
    "active_params": 1e6,
}
GPU_TABLE = {"memory_gb": 16.0, "bandwidth_gbps": 100.0, "tflops_bf16": 10.0}


@st.composite
def profile_files(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=300))
    top: dict[str, Any] = {
        "name": "fuzz",
        "model": "qwen2.5-0.5b",
        "gpu": "laptop",
        "max_model_len": 16384,
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 256,
    }
    tables: dict[str, dict[str, Any]] = {"kv_pool": {"tokens": 65536}}
    if draw(st.booleans()):  # an embedded model or GPU, whose numbers are fuzzed too
        table = dict(MODEL_TABLE)
        table[draw(st.sampled_from(sorted(MODEL_TABLE)))] = draw(values)
        top["model"] = table
    if draw(st.booleans()):
        table = dict(GPU_TABLE)
        table[draw(st.sampled_from(sorted(GPU_TABLE)))] = draw(values)
        top["gpu"] = table
    for section, key in draw(st.lists(st.sampled_from(PROFILE_FIELDS), min_size=1, max_size=3)):
        (tables.setdefault(section, {}) if section else top)[key] = draw(values)
    if draw(st.booleans()):
        tables["kv_pool"].pop("tokens", None)  # the pool derived from GPU memory instead
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    for section, table in tables.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


@settings(max_examples=fuzz_examples(300))
@given(profile_files())
def test_fuzz_profile_parser_gives_a_profile_or_an_agentload_error(text: str) -> None:
    try:
        profile = parse_profile(text, "fuzz.toml")
    except AgentloadError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    assert isinstance(profile, ServingProfile)
    assert 0 < profile.num_blocks <= MAX_POOL_BLOCKS  # what the simulator allocates
    assert profile.offload_blocks >= 0
    assert math.isfinite(profile.offload_load_bytes_per_s)
    assert all(math.isfinite(v) for v in profile.coefficients.model_dump().values() if isinstance(v, float))


# -- config.json -------------------------------------------------------------------------------------------------

DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
MOE = {**DENSE, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
MLA = {**MOE, "model_type": "deepseek_v3", "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8}
GEMMA = {**DENSE, "model_type": "gemma3_text", "sliding_window": 512, "head_dim": 16}
HF_KEYS = sorted(
    {*MLA, *GEMMA}
    | {
        "head_dim",
        "layer_types",
        "sliding_window_pattern",
        "use_sliding_window",
        "mlp_only_layers",
        "decoder_sparse_step",
        "first_k_dense_replace",
        "n_shared_experts",
        "shared_expert_intermediate_size",
        "q_lora_rank",
        "v_head_dim",
        "index_topk",
        "tie_word_embeddings",
        "torch_dtype",
        "quantization_config",
        "text_config",
        "_name_or_path",
    }
)


@st.composite
def hf_configs(draw: st.DrawFn) -> dict[str, Any]:
    config = dict(draw(st.sampled_from([DENSE, MOE, MLA, GEMMA])))
    for key in draw(st.lists(st.sampled_from(HF_KEYS), min_size=1, max_size=4)):
        config[key] = draw(values)
    return config


@settings(max_examples=fuzz_examples(300))
@given(hf_configs())
def test_fuzz_config_json_mapping_gives_a_model_or_an_agentload_error(config: dict[str, Any]) -> None:
    try:
        model = model_from_hf_config(config, name="fuzz", source="fuzz/config.json")
    except AgentloadError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    assert math.isfinite(model.spec.total_params)
    assert model.spec.active_params <= model.spec.total_params


@settings(max_examples=fuzz_examples(100))
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200), st.builds(json.dumps, hf_configs())))
def test_fuzz_config_json_file_gives_a_model_or_an_agentload_error(data: str | bytes) -> None:
    path = _write(data)
    try:
        load_hf_config(path)
        event("accepted")
    except AgentloadError as exc:
        event(f"refused: {type(exc).__name__}")
    finally:
        path.unlink()
