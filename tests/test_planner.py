"""The planner: static figures from the one KV/step model, the simulated curve and its knee, the serve flags."""

from __future__ import annotations

from typing import Any

import pytest

from agentload.capacity.planner import CurvePoint, Plan, PlanSpec, parse_spec, plan
from agentload.errors import ConfigError, UnknownNameError
from agentload.sim.curve import _find_cliff, add_throughput_curve, curve_counts

KIB = 1024

# The configuration. Qwen3-235B in bf16 (470 GB) does not fit one 288 GB GB300, so the weights are fp4
# (as in the source benchmark's NVFP4 checkpoint on a DGX Station GB300), the KV cache fp8.
QWEN_GB300: dict[str, Any] = {
    "model": "qwen3-235b-a22b",
    "gpu": "gb300",
    "kv_cache_dtype": "fp8",
    "weight_dtype": "fp4",
}
# A small configuration whose curve simulates in about a second: 8 agents of 8k context fit a 65,536-token pool.
LAPTOP: dict[str, Any] = {
    "model": "qwen2.5-0.5b",
    "gpu": "laptop",
    "max_model_len": 16384,
    "context_per_agent": 8192,
    "pool_tokens": 65536,
}


def _plan(**fields: Any) -> Plan:
    return plan(parse_spec(fields))


def test_qwen_on_gb300_static_figures() -> None:
    p = _plan(**QWEN_GB300)
    assert p.kv.bytes_per_token == 94 * KIB
    assert p.memory.weights_gb == pytest.approx(117.5)
    # 288 GB × 0.9 − 2 GiB − 117.5 GB ≈ 139.6 GB of KV: 90,612 blocks of 16 tokens.
    assert p.pool.num_blocks == 90_612
    assert p.pool.startup_lines == (
        "GPU KV cache size: 1,449,792 tokens",
        "Maximum concurrency for 40,960 tokens per request: 35.40x",
    )
    assert p.agents.context == 40_960  # defaults to max-model-len, the model's 40,960
    assert p.agents.window_aware_sessions == pytest.approx(35.40, abs=0.01)
    assert p.agents.recommended_agents == 35
    # Sessions that share the 2,000-token system prompt store it once.
    assert p.agents.shared_prefix_sessions == pytest.approx(37.2, abs=0.05)


def test_a_logged_pool_replaces_the_memory_estimate() -> None:
    p = _plan(**QWEN_GB300, pool_tokens=997_753)
    assert p.pool.startup_lines[1] == "Maximum concurrency for 40,960 tokens per request: 24.36x"
    assert [d.kind for d in p.derivations if d.figure == "KV pool"] == ["stated"]


def test_hybrid_model_reports_naive_and_window_aware_counts() -> None:
    p = _plan(model="gpt-oss-120b", gpu="h100", context_per_agent=32768)
    assert p.kv.growing_bytes_per_token == 36 * KIB
    assert p.kv.fixed_bytes_per_session / 2**20 == pytest.approx(5.06, abs=0.01)
    # Sliding layers hold 144 tokens, not 32k: about twice the sessions the naive pool ÷ context rule gives.
    assert p.agents.window_aware_sessions / p.agents.naive_sessions == pytest.approx(1.99, abs=0.01)


def test_dense_model_naive_and_window_aware_agree() -> None:
    p = _plan(model="llama-3.1-8b", gpu="h100", context_per_agent=32768)
    assert p.agents.naive_sessions == pytest.approx(p.agents.window_aware_sessions)


def test_mla_on_eight_gpus_stores_the_latent_on_every_gpu() -> None:
    p = _plan(model="deepseek-v3", gpu="h200", num_gpus=8, context_per_agent=65536)
    assert p.memory.weight_dtype == "fp8"  # the checkpoint's
    assert p.kv.replication == 8.0
    assert p.memory.weights_gb_per_gpu == pytest.approx(83.875)


def test_offload_tier_figures() -> None:
    p = _plan(**QWEN_GB300, offload_gib=200)
    assert p.offload is not None
    # 200 GiB ÷ (2,560 blocks × 1.47 MiB) per 40k session.
    assert p.offload.extra_sessions == pytest.approx(54.5, abs=0.1)
    assert p.offload.reload_s == pytest.approx(0.0088, rel=0.01)
    # Loading over NVLink-C2C is two orders of magnitude cheaper than recomputing 40k tokens.
    assert p.offload.recompute_s > 100 * p.offload.reload_s
    assert any(f.flag == "--kv-offloading-size" and f.value == "200" for f in p.serve.flags)


def test_serve_command_realises_the_plan() -> None:
    p = _plan(**QWEN_GB300)
    line = p.serve.command_line()
    assert line.startswith("vllm serve Qwen/Qwen3-235B-A22B ")
    for flag in (
        "--tensor-parallel-size 1",
        "--max-model-len 40960",
        "--kv-cache-dtype fp8",
        "--gpu-memory-utilization 0.9",
        "--max-num-seqs 35",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ):
        assert flag in line
    assert "--kv-offloading-size" not in line
    # fp4 cannot be produced at load time: the plan says a quantised checkpoint is needed.
    assert any("fp4" in note for note in p.serve.notes)


def test_fp8_weights_from_a_bf16_checkpoint_are_quantised_at_load() -> None:
    p = _plan(model="llama-3.1-70b", gpu="h200", weight_dtype="fp8", context_per_agent=16384)
    assert "--quantization fp8" in p.serve.command_line()


def test_the_plan_round_trips_through_json() -> None:
    p = add_throughput_curve(_plan(**LAPTOP), counts=[4, 12], refine=False)
    assert Plan.model_validate_json(p.model_dump_json()) == p


def test_weights_that_do_not_fit_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="do not fit"):
        _plan(model="qwen3-235b-a22b", gpu="gb300")  # bf16 checkpoint


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"num_gpus": 0}, "--gpus"),
        ({"gpu_memory_utilization": 0}, "--gpu-memory-utilization"),
        ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization"),
        ({"context_per_agent": -1}, "--context-per-agent"),
        ({"offload_gib": -5}, "--offload-gib"),
        ({"weight_dtype": "fp3"}, "--weight-dtype"),
        ({"kv_cache_dtype": "int3"}, "int3"),
    ],
)
def test_bad_values_name_the_flag(fields: dict[str, Any], needle: str) -> None:
    names = {
        "num_gpus": "--gpus",
        "gpu_memory_utilization": "--gpu-memory-utilization",
        "context_per_agent": "--context-per-agent",
        "offload_gib": "--offload-gib",
        "weight_dtype": "--weight-dtype",
    }
    with pytest.raises(ConfigError, match=needle):
        parse_spec({**QWEN_GB300, **fields}, names)


def test_context_beyond_max_model_len_is_refused() -> None:
    with pytest.raises(ConfigError, match="exceeds max-model-len"):
        _plan(**QWEN_GB300, context_per_agent=50_000)


def test_context_shorter_than_one_turn_is_refused() -> None:
    with pytest.raises(ConfigError, match="one turn's tokens"):
        _plan(**QWEN_GB300, context_per_agent=3000)


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="qwen3-235b-a22b"):
        _plan(model="qwen4", gpu="h100")
    with pytest.raises(UnknownNameError, match="gb300"):
        _plan(model="llama-3.1-8b", gpu="h1000")


# -- the curve -----------------------------------------------------------------------------------------------------


def _point(agents: int, tps: float) -> CurvePoint:
    return CurvePoint(
        agents=agents,
        output_tps=tps,
        prefill_tps=0,
        prefix_hit_rate=0,
        recomputed_tokens=0,
        preemptions=0,
        mean_kv_usage=0,
        mean_running=0,
        mean_waiting=0,
        ttft_p50_s=None,
        turns=0,
        duration_s=1,
        warmup_s=0,
    )


def test_a_small_dip_is_noise_and_a_fall_is_the_knee() -> None:
    wobbly = {n: _point(n, t) for n, t in [(10, 100.0), (20, 180.0), (30, 170.0), (40, 200.0), (50, 90.0)]}
    assert _find_cliff(wobbly) == (40, 50)
    rising = {n: _point(n, t) for n, t in [(10, 100.0), (20, 190.0), (30, 260.0)]}
    assert _find_cliff(rising) == (None, None)


def test_curve_counts_bracket_the_estimate() -> None:
    assert curve_counts(35.4) == [9, 18, 27, 32, 35, 39, 44, 53]
    assert curve_counts(1.2) == [1, 2]
    # A shared prefix within 10% of the estimate is bracketed already; further away it gets its own counts.
    assert curve_counts(35.4, shared_prefix=37.2) == [9, 18, 27, 32, 35, 39, 44, 53]
    assert curve_counts(100.0, shared_prefix=130.0) == [25, 50, 75, 90, 100, 110, 117, 125, 130, 143, 150, 162]
    # An offload tier holding 50 more sessions: counts around 150 too.
    assert {135, 150, 165, 188} <= set(curve_counts(100.0, offload_sessions=50.0))


def test_laptop_curve_finds_the_kv_cliff_near_the_estimate() -> None:
    p = add_throughput_curve(_plan(**LAPTOP))
    c = p.curve
    assert c is not None
    assert c.knee is not None
    assert c.first_past_knee == c.knee + 1  # bisected to one agent
    points = {pt.agents: pt for pt in c.points}
    # Below the knee every session's prefix stays cached; past it the prefix-hit rate collapses.
    assert points[c.knee].prefix_hit_rate > 0.8
    assert points[c.first_past_knee].prefix_hit_rate < points[c.knee].prefix_hit_rate - 0.1
    # The estimate (8.0) ignores that all agents share one system prompt; counted once it gives 10.3.
    assert c.knee == pytest.approx(p.agents.shared_prefix_sessions, rel=0.10)


def test_an_offload_tier_moves_the_knee_out_to_both_tiers() -> None:
    gpu_only = add_throughput_curve(_plan(**LAPTOP)).curve
    p = add_throughput_curve(_plan(**LAPTOP, offload_gib=1))
    assert p.offload is not None
    assert p.offload.extra_sessions == pytest.approx(10.7, abs=0.05)  # 1 GiB ÷ 96 MiB per 8k session
    c = p.curve
    assert c is not None
    assert gpu_only is not None
    assert gpu_only.knee is not None
    assert c.knee is not None
    assert c.estimate == pytest.approx(p.agents.estimate + p.offload.extra_sessions)
    assert c.knee > gpu_only.knee + 5
    # Past the GPU pool the GPU prefix hits collapse but reloads keep throughput up until the CPU tier is full.
    points = {pt.agents: pt for pt in c.points}
    assert points[c.knee].prefix_hit_rate < 0.5
    assert points[c.knee].output_tps >= 0.9 * max(pt.output_tps for pt in c.points)


@pytest.mark.slow
def test_qwen_gb300_knee_agrees_with_the_estimate_within_ten_percent() -> None:
    p = add_throughput_curve(_plan(**QWEN_GB300))
    c = p.curve
    assert c is not None
    assert c.knee is not None
    assert c.knee_vs_estimate is not None
    assert abs(c.knee_vs_estimate) <= 0.10
    # Throughput rises to the knee and falls past it.
    tps = {pt.agents: pt.output_tps for pt in c.points}
    assert tps[c.knee] > tps[min(tps)]
    assert tps[c.knee] > 2 * tps[max(tps)]


def test_plan_spec_defaults_are_vllms() -> None:
    spec = PlanSpec(model="m", gpu="g")
    assert (spec.gpu_memory_utilization, spec.kv_cache_dtype, spec.num_gpus) == (0.9, "auto", 1)
