"""Calibrate a real vLLM, serve the profile in the simulator, and run the same knee search on it (issue 9).

``agentload calibrate`` measures TTFT over prompt lengths and ITL over batch sizes and writes a profile with the
server's pool; ``bench --sim PROFILE`` then runs the same knee search in virtual time. Issue 9's goal is the same
knee and throughput within ±15 % at every level up to it; the comparison is printed per level. What is gated is
what the simulator must do whatever the real run's noise: find a knee inside the search and collapse past it, and
stay within a factor of two of the real throughput up to the real knee.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentload.bench.results import RunResult
from agentload.capacity.profile import load_profile
from agentload.cli.main import app
from tests.integration.conftest import BLOCK_TOKENS, FIGURES, KNEE_ARGS, MAX_AGENTS, POOL_BLOCKS, TIMINGS, VllmServer


@pytest.fixture(scope="module", params=["tiny"])
def calibrated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, RunResult]:
    """(label, the calibrated profile, the real knee search) per tier model."""
    label: str = request.param
    server: VllmServer = request.getfixturevalue("vllm")
    real: RunResult = request.getfixturevalue("knee_run")
    out = tmp_path_factory.mktemp(f"calibrate-{label}") / "profile.toml"
    began = time.monotonic()
    # Batches up to 8: the pool (24,576 tokens) keeps calibration's ITL streams small anyway (pool_share 0.8).
    result = CliRunner().invoke(app, ["calibrate", "--url", server.url, "-o", str(out), "--repeats", "2",
                                      "--max-batch", "8"])  # fmt: skip
    TIMINGS[f"calibrate ({label})"] = time.monotonic() - began
    assert result.exit_code == 0, result.output
    return label, out, real


def test_the_calibrated_profile_carries_the_servers_pool(calibrated: tuple[str, Path, RunResult]) -> None:
    label, profile, _ = calibrated
    written = load_profile(str(profile))
    assert written.block_size == BLOCK_TOKENS
    assert written.num_blocks == POOL_BLOCKS
    c = written.coefficients
    FIGURES[f"calibrated coefficients ({label})"] = (
        f"prefill {c.prefill_s_per_token * 1e6:.1f} µs/token, weights {c.weights_s * 1e3:.2f} ms/step, "
        f"kv {c.kv_s_per_token * 1e9:.1f} ns/token, attention {c.attention_s_per_pair * 1e12:.2f} ps/pair, "
        f"api overhead {c.api_overhead_s * 1e3:.1f} ms"
    )


def test_the_calibrated_simulator_reproduces_the_knee_search(
    calibrated: tuple[str, Path, RunResult], tmp_path: Path
) -> None:
    label, profile, real = calibrated
    # In a subprocess, as a user runs it, with a timeout: once (before 94f4c72 fixed the client's idle guard
    # re-arming forever in virtual time) the in-process run hung for 7 minutes where the command alone takes ~25 s;
    # a regression of that kind now fails here instead of hanging the tier.
    out = tmp_path / "runs"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentload", "bench", "--sim", str(profile), *KNEE_ARGS, "--find-knee",
         "--max-agents", str(MAX_AGENTS), "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    TIMINGS[f"bench --sim --find-knee (calibrated {label}, virtual time)"] = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sim = RunResult.model_validate_json(next(out.glob("*/result.json")).read_text())
    real_knee, sim_knee = real.knee[0].agents, sim.knee[0].agents
    real_by, sim_by = {lv.agents: lv for lv in real.levels}, {lv.agents: lv for lv in sim.levels}
    shared = sorted(set(real_by) & set(sim_by))
    ratios = {n: sim_by[n].output_tps / real_by[n].output_tps for n in shared if real_by[n].output_tps > 0}
    FIGURES[f"calibrated simulator ({label})"] = (
        f"knee real {real_knee}, simulated {sim_knee}; simulated ÷ real output tok/s per level: "
        + ", ".join(f"{n}: {r:.3f}" for n, r in ratios.items())
    )
    why = FIGURES[f"calibrated simulator ({label})"]
    assert 1 <= sim_knee < MAX_AGENTS, why
    for n, ratio in ratios.items():
        if n <= min(real_knee, sim_knee):  # levels both runs put before their knee
            assert 0.5 <= ratio <= 2.0, why
    # Past the knee the simulated server collapses too: its prefix cache is evicted between turns.
    past = [n for n in sim_by if n > sim_knee]
    assert past, why
    first_past = sim_by[min(past)]
    at = sim_by[sim_knee]
    assert first_past.prefix_hit_rate_server is not None
    assert at.prefix_hit_rate_server is not None
    assert first_past.prefix_hit_rate_server < at.prefix_hit_rate_server, why
