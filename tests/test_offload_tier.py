"""A KV offload tier counted, shown and judged: vLLM's connector counters (and LMCache's) read beside the GPU
prefix cache's, both tiers' reuse judged by the knee rule, and the simulator's tier exported under vLLM's names."""

from __future__ import annotations

import pytest

from agentload.bench.analysis import LevelData, summarise
from agentload.bench.orchestrate import BenchPlan, run_bench
from agentload.bench.results import RunResult
from agentload.bench.target import sim_target
from agentload.clock import run_virtual
from agentload.endpoint.records import RequestIds, RequestRecord
from agentload.endpoint.samples import to_sample
from agentload.endpoint.scrape import parse_metrics
from agentload.workload.registry import get_workload

VLLM = """\
vllm:num_requests_running{{engine="0"}} 3
vllm:prompt_tokens_total{{engine="0"}} {prompt}
vllm:generation_tokens_total{{engine="0"}} {gen}
vllm:prefix_cache_queries_total{{engine="0"}} {prompt}
vllm:prefix_cache_hits_total{{engine="0"}} {gpu}
{external}
vllm:request_prefill_time_seconds_sum{{engine="0"}} {prefill_s}
vllm:request_prefill_time_seconds_count{{engine="0"}} 10
vllm:request_decode_time_seconds_sum{{engine="0"}} {decode_s}
vllm:request_decode_time_seconds_count{{engine="0"}} 10
"""


def scrape(t: float, prompt: int, gen: int, gpu: int, ext: int | None, lmcache: bool = False, **times: float):  # type: ignore[no-untyped-def]
    if ext is None:
        external = ""
    elif lmcache:
        external = f'lmcache:num_hit_tokens_total{{model_name="m"}} {ext}'
    else:
        external = (
            f'vllm:external_prefix_cache_queries_total{{engine="0"}} {prompt}\n'
            f'vllm:external_prefix_cache_hits_total{{engine="0"}} {ext}'
        )
    text = VLLM.format(prompt=prompt, gen=gen, gpu=gpu, external=external, prefill_s=times.get("prefill_s", 0.0),
                       decode_s=times.get("decode_s", 0.0))  # fmt: skip
    return to_sample(parse_metrics(text), t)


def level(*samples) -> LevelData:  # type: ignore[no-untyped-def]
    records = [
        RequestRecord(
            ids=RequestIds(run="r", level=0, agent=f"a{i}", turn=i),
            t_sent=1.0 + i,
            t_first_token=1.1 + i,
            t_done=1.5 + i,
            prompt_tokens=1000,
            completion_tokens=10,
            cached_tokens=980,
        )
        for i in range(8)
    ]
    return LevelData(level=0, agents=4, context=1000, workload="agentic-hold", start=0.0, window_start=0.5, end=10.0,
                     records=records, samples=list(samples))  # fmt: skip


@pytest.mark.parametrize("lmcache", [False, True])
def test_the_tiers_are_read_apart_and_judged_together(lmcache: bool) -> None:
    s = summarise(level(scrape(1.0, 0, 0, 0, 0, lmcache), scrape(9.0, 100_000, 1_000, 60_000, 38_000, lmcache)))
    assert s.prefix_hit_rate_server == pytest.approx(0.60)  # the GPU cache's own
    assert s.prefix_hit_rate_offload == pytest.approx(0.38)
    assert s.prefix_hit_rate_effective == pytest.approx(0.98)
    assert s.offload_loaded_tps == pytest.approx(38_000 / 8.0)
    # The prompt tokens prefill computed are those neither tier served: 2,000 against 1,000 generated.
    assert s.computed_prefill_share == pytest.approx(2_000 / 3_000)
    assert s.prefill_share == pytest.approx(100_000 / 101_000)


def test_a_server_without_a_tier_reads_none_and_the_gpu_rate_decides() -> None:
    s = summarise(level(scrape(1.0, 0, 0, 0, None), scrape(9.0, 100_000, 1_000, 60_000, None)))
    assert s.prefix_hit_rate_offload is None
    assert s.prefix_hit_rate_effective == pytest.approx(0.60)
    assert s.computed_prefill_share == pytest.approx(40_000 / 41_000)


def test_the_time_split_is_the_histograms_sums() -> None:
    s = summarise(level(scrape(1.0, 0, 0, 0, None, prefill_s=2.0, decode_s=10.0),
                        scrape(9.0, 100_000, 1_000, 60_000, None, prefill_s=5.0, decode_s=16.0)))  # fmt: skip
    assert s.prefill_time_share == pytest.approx(3.0 / 9.0)


@pytest.mark.slow
def test_the_simulated_tier_is_exported_as_vllms_and_keeps_the_reuse() -> None:
    """Past the GPU pool (24 sessions) the simulator's 200 GiB tier loads evicted prefixes back: the GPU cache's hit
    rate falls while both tiers' reuse stays where usage says it is."""
    plan = BenchPlan(make_target=lambda: sim_target("qwen3-235b-gb300-offload"), workload=get_workload("agentic-hold"),
                     contexts=[40_960], mode="sweep", agents=[16, 32], warmup_s=60.0, window_s=120.0)  # fmt: skip
    result: RunResult = run_virtual(run_bench(plan))[0]
    small, big = result.levels
    assert small.prefix_hit_rate_offload is not None
    assert big.prefix_hit_rate_offload is not None
    assert big.prefix_hit_rate_offload > 0.3 > small.prefix_hit_rate_offload
    assert big.prefix_hit_rate_server is not None
    assert big.prefix_hit_rate_server < 0.7
    effective, usage = big.prefix_hit_rate_effective, big.prefix_hit_rate_usage
    assert effective is not None
    assert usage is not None
    assert abs(effective - usage) < 0.05
    assert big.prefill_time_share is not None
    assert 0 < big.prefill_time_share < 1


def test_bench_sizes_the_simulators_tier_and_refuses_a_bad_size() -> None:
    from agentload.capacity.profile import load_profile, with_offload
    from agentload.errors import ConfigError

    plain = sim_target("qwen3-235b-gb300")
    assert plain.profile is not None
    assert plain.profile.offload_blocks == 0
    tiered = sim_target("qwen3-235b-gb300", offload_gib=200)
    assert tiered.profile is not None
    # The same tier as the built-in offload profile states in its TOML.
    assert tiered.profile.offload_blocks == load_profile("qwen3-235b-gb300-offload").offload_blocks > 0
    assert with_offload(load_profile("qwen3-235b-gb300-offload"), 0).offload_blocks == 0
    with pytest.raises(ConfigError, match="--offload-gib"):
        with_offload(load_profile("laptop"), -1)
