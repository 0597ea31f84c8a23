"""``agentload bench`` end to end: the source article's scenario in virtual time, the HTTP simulator in real time,
and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentload.bench.results import RunResult
from agentload.cli.main import app
from tests.simserver import running_sim


def bench(tmp_path: Path, *args: str) -> RunResult:
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "runs"), "--json", *args])
    assert result.exit_code == 0, result.output
    runs = list((tmp_path / "runs").glob("*/result.json"))
    assert len(runs) == 1
    return RunResult.model_validate_json(runs[0].read_text())


@pytest.mark.slow
def test_qwen_gb300_knee_is_the_dense_formula_and_is_explained(tmp_path: Path) -> None:
    run = bench(tmp_path, "--sim", "qwen3-235b-gb300", "--workload", "agentic-hold", "--context", "40960",
                "--find-knee")  # fmt: skip
    knee = run.knee[0]
    assert 20 <= knee.agents <= 28
    assert knee.bound == "bracketed"
    assert knee.measured_over_predicted is not None
    assert 0.85 <= knee.measured_over_predicted <= 1.15
    assert knee.explanation.cause in ("cache_eviction", "preemption")
    ev = knee.explanation.evidence
    assert ev["prefix_hit_rate_past_knee"] < ev["prefix_hit_rate_at_knee"]
    # Pool ÷ the realised context: the held sessions' server-counted context, a little under the target.
    est = run.capacity[0]
    assert est.target_context == 40960
    assert 0.99 * 40960 <= est.context <= 40960
    # 62,359 blocks ÷ ~2,550 blocks a session: 24.36 at the target itself, a hair more at the realised context.
    assert est.sessions is not None
    assert 24.36 < est.sessions <= 24.36 * 40960 / est.context + 0.01


@pytest.mark.slow
def test_sliding_window_model_carries_far_more_than_the_formula(tmp_path: Path) -> None:
    run = bench(tmp_path, "--sim", "deepseek-sliding-gb300", "--workload", "agentic-hold", "--context", "40960",
                "--find-knee", "--max-agents", "48")  # fmt: skip
    knee = run.knee[0]
    assert knee.agents == 48  # still scaling at the search's limit
    # No level was past the knee, so only a lower bound of measured ÷ predicted is claimed.
    assert knee.bound == "at_least"
    assert knee.measured_over_predicted is None
    assert knee.ratio_low is not None
    assert knee.ratio_low >= 1.45


@pytest.mark.slow
def test_sweep_and_search_agree_and_the_search_is_cheaper(tmp_path: Path) -> None:
    sweep = bench(tmp_path / "a", "--sim", "qwen3-235b-gb300", "--context", "40960",
                  "--sweep", "1,8,16,24,32,40,48,64")  # fmt: skip
    search = bench(tmp_path / "b", "--sim", "qwen3-235b-gb300", "--context", "40960", "--find-knee")
    k_sweep, k_search = sweep.knee[0], search.knee[0]
    # The sweep can only name one of its points: the search's knee lies between it and the next point.
    assert k_sweep.agents <= k_search.agents < 32
    # Probes measure until they have 8 turns per agent (at least 60), so a search costs more than the
    # eighth-of-a-window probes did (1,539 agent-turns vs the sweep's 3,487 here), and still under half a sweep.
    assert k_search.agent_turns <= k_sweep.agent_turns / 2


async def test_http_simulator_prefix_hits_from_usage_and_metrics_agree(tmp_path: Path) -> None:
    async with running_sim("laptop") as (_, url):
        import asyncio

        def run() -> Any:
            return CliRunner().invoke(
                app,
                ["bench", "--url", url, "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--workload", "agentic",
                 "--context", "6000", "--agents", "4", "--warmup", "5s", "--window", "20s",
                 "--out", str(tmp_path / "runs"), "--json"],
            )  # fmt: skip

        result = await asyncio.to_thread(run)
    assert result.exit_code == 0, result.output
    saved = json.loads(next((tmp_path / "runs").glob("*/result.json")).read_text())
    # The capacity estimate uses the pool the server itself reports (vllm:cache_config_info).
    assert saved["capacity"][0]["pool_tokens"] == 65_536
    assert saved["capacity"][0]["sessions"] == pytest.approx(4096 / 375)
    level = saved["levels"][0]
    assert level["throughput_source"] == "server"
    assert level["requests_ok"] > 5
    assert level["prefix_hit_rate_server"] > 0.5
    assert abs(level["prefix_hit_rate_server"] - level["prefix_hit_rate_usage"]) <= 0.01


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--sim", "nope", "--agents", "2"], "unknown profile"),
        (["--sim", "laptop", "--sweep", "1,x"], "--sweep"),
        (["--sim", "laptop", "--sweep", "0,4"], "at least 1"),
        (["--sim", "laptop", "--find-knee", "--sweep", "1,2"], "choose one"),
        (["--sim", "laptop", "--agents", "2", "--workload", "bogus"], "unknown workload"),
        (["--sim", "laptop", "--agents", "2", "--context", "999999"], "max-model-len"),
        (["--sim", "laptop", "--soak", "10m"], "--agents"),
        (["--sim", "laptop", "--agents", "2", "--window", "soon"], "--window"),
        (["--sim", "laptop", "--find-knee", "--slo", "ttft_p95"], "--slo"),
        (["--url", "http://127.0.0.1:9", "--agents", "2", "--wait-ready", "0s"], "--wait-ready"),
        (["--url", "http://127.0.0.1:9", "--sim", "laptop"], "not both"),
        (["--sim", "laptop", "--agents", "2", "--workload", "trace:/nonexistent.jsonl"], "nonexistent"),
    ],
)
def test_bad_flags_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output


def test_malformed_trace_is_one_clear_error(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n{oops\n')
    result = CliRunner().invoke(
        app, ["bench", "--sim", "laptop", "--agents", "1", "--workload", f"trace:{trace}", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output
    assert ":2" in result.output
    assert "Traceback" not in result.output


def test_soak_reports_drift_and_says_why_gpu_figures_are_missing(tmp_path: Path) -> None:
    run = bench(tmp_path, "--sim", "qwen3-235b-gb300", "--soak", "6m", "--agents", "4", "--warmup", "60s")
    assert run.mode == "soak"
    assert len(run.levels) == 1
    drift = next(n for n in run.notes if n.startswith("soak drift over 360 s at 4 agents"))
    assert "tok/s" in drift
    assert "TTFT p50" in drift
    assert any(n.startswith("NVML not sampled") for n in run.notes)  # no NVIDIA GPU on this machine


def test_agents_alone_runs_that_level_on_the_default_simulator(tmp_path: Path) -> None:
    # `bench --agents N` with no target used to start the default knee search and ignore N.
    run = bench(tmp_path, "--agents", "3", "--context", "8192", "--warmup", "10s", "--window", "30s")
    assert run.mode == "single"
    assert [lv.agents for lv in run.levels] == [3]
    assert run.target.startswith("sim:")
