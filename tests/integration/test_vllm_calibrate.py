"""Calibrate a real vLLM, serve the profile in the simulator, and run the same knee search on it.

On both tier models, ``agentload calibrate`` measures TTFT over prompt lengths and ITL over batch sizes and writes a
profile with the server's pool; ``bench --sim PROFILE`` then runs the same knee search in virtual time. The
goal is the same knee and throughput within ±15 % at every level up to it, and that is what is gated where the real
knee is the pool's: the knee within one agent, throughput within ±15 % at every level both runs put at or before
their knee — output tok/s, or agent-turns/s where a run's turns asked shorter replies than the workload drew
(``gated_throughput``) —, and a collapse past it. On the tiny model both runs ask for the same replies (its replies
come back as the tokens they were generated as, so a held session fits the same reply lengths on both: before that
the real run was asked for 14 tokens a turn where the simulated one was asked for 19, and its output tok/s read
1.3-1.5x apart at the same turn rate). Where compute gave out before the pool on the real server (``compute_bound``,
slower CPUs) the knee and ratios are printed and only a factor of two is gated: the step-time fit has not been
checked there. Where other processes took more than a third of a core during the knee search or the calibration
(``harness/machine.py``), the fit and the run saw different machines: a factor of 1.5 is gated and the figures say
how busy it was. The profile carries the server's count of each of agentload's words and what its chat template
adds beyond them (calibrate's ``/tokenize``), so the simulated held sessions' prompts land either side of a KV block
edge as the real ones do: on the realistic model a session caches 30 or 31 of its 32 blocks by that luck, and
recomputes ~100 or ~220 tokens a turn. Both searches send the same words (``--same-text``), so a session draws the
same luck in both.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from agentload.bench.results import RunResult
from agentload.capacity.profile import load_profile
from agentload.workload.words import WORDS
from tests.integration.harness.machine import Neighbours, neighbours
from tests.integration.harness.process import timed
from tests.integration.harness.runs import (
    asked_output,
    calibrate,
    coefficients_text,
    drawn_output,
    gated_throughput,
    paired_levels,
    simulate_knee_search,
    throughput_ratios,
    turn_rate_ratios,
)
from tests.integration.vllm import (
    BLOCK_TOKENS,
    FIGURES,
    KNEE_ARGS,
    MAX_AGENTS,
    MODELS,
    NEIGHBOURS,
    POOL_BLOCKS,
    SUMMARY,
    VllmServer,
    compute_bound,
)


@pytest.fixture(scope="module", params=list(MODELS))
def calibrated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, RunResult]:
    """(label, the calibrated profile, the real knee search) per tier model."""
    label: str = request.param
    run_fixture, server_fixture, _ = MODELS[label]
    server: VllmServer = request.getfixturevalue(server_fixture)
    real: RunResult = request.getfixturevalue(run_fixture)
    out = tmp_path_factory.mktemp(f"calibrate-{label}") / "profile.toml"
    # Batches up to 8: the pool (24,576 tokens) keeps calibration's ITL streams small anyway (pool_share 0.8).
    with timed(SUMMARY, f"calibrate ({label})"), neighbours() as others:
        result = calibrate(server.url, out, max_batch=8)
    NEIGHBOURS[f"calibrate ({label})"] = others
    FIGURES[f"other processes' CPU during calibrate ({label})"] = others.text()
    assert result.exit_code == 0, result.output
    return label, out, real


def test_the_calibrated_profile_carries_the_servers_pool(calibrated: tuple[str, Path, RunResult]) -> None:
    label, profile, _ = calibrated
    written = load_profile(str(profile))
    assert written.block_size == BLOCK_TOKENS
    assert written.num_blocks == POOL_BLOCKS
    FIGURES[f"calibrated coefficients ({label})"] = coefficients_text(profile)


def test_the_calibrated_profile_counts_agentloads_words_as_the_server_does(
    calibrated: tuple[str, Path, RunResult],
) -> None:
    """The tiny model's tokenizer has a token for each of agentload's words; the realistic one splits many of them
    (1.46 tokens a word), and the simulator serving the profile must count them as it does."""
    label, profile, _ = calibrated
    counts = dict(load_profile(str(profile)).word_tokens)
    assert set(counts) == set(WORDS)
    mean = statistics.mean(counts.values())
    FIGURES[f"calibrated tokenizer ({label})"] = (
        f"{mean:.3f} tokens a word over {len(counts)} words; " + coefficients_text(profile).rpartition("; ")[2]
    )
    if label == "realistic":
        assert 1.3 <= mean <= 1.7
        assert max(counts.values()) >= 3
    else:
        assert set(counts.values()) == {1}


def test_the_calibrated_simulator_reproduces_the_knee_search(
    calibrated: tuple[str, Path, RunResult], tmp_path: Path
) -> None:
    label, profile, real = calibrated
    with timed(SUMMARY, f"bench --sim --find-knee (calibrated {label}, virtual time)"):
        sim = simulate_knee_search(profile, KNEE_ARGS, MAX_AGENTS, tmp_path / "runs", timeout_s=900)
    real_knee, sim_knee = real.knee[0].agents, sim.knee[0].agents
    sim_by = {lv.agents: lv for lv in sim.levels}
    ratios, turn_ratios = throughput_ratios(real, sim), turn_rate_ratios(real, sim)
    gated = gated_throughput(real, sim)
    drawn = drawn_output(real)
    FIGURES[f"calibrated simulator ({label})"] = (
        f"knee real {real_knee}, simulated {sim_knee}; simulated ÷ real output tok/s per level: "
        + ", ".join(f"{n}: {r:.3f}" for n, r in ratios.items())
        + "; agent-turns/s: "
        + ", ".join(f"{n}: {r:.3f}" for n, r in turn_ratios.items())
        + "; mean reply asked, real / simulated (drawn, real): "
        + ", ".join(f"{n}: {a:.1f} / {b:.1f} ({drawn.get(n, 0):.1f})" for n, (a, b) in asked_output(real, sim).items())
        + "; prefix-hit rate (server's counters), real / simulated: "
        + ", ".join(
            f"{n}: {r.prefix_hit_rate_server:.3f} / {sv.prefix_hit_rate_server:.3f}"
            for n, r, sv in paired_levels(real, sim)
            if r.prefix_hit_rate_server is not None and sv.prefix_hit_rate_server is not None
        )
        + "; gated: "
        + ", ".join(f"{n}: {what} {r:.3f}" for n, (what, r) in gated.items())
    )
    why = FIGURES[f"calibrated simulator ({label})"]
    assert 1 <= sim_knee < MAX_AGENTS, why
    reason = compute_bound(real)
    # The fit and the knee search each measured the machine at its own moment: where another process took part of
    # it during either, the real server ran slower than the fit by what that process took (seen with a spinning
    # core: up to 1.22 at levels to the knee, where quiet runs gave ≤ 1.11), so a factor of 1.5 is gated there and the
    # figures printed; the ±15 % goal is gated where both had the machine to themselves.
    busy = [step for step in (f"knee ({label})", f"calibrate ({label})") if NEIGHBOURS.get(step, Neighbours()).busy]
    # The ±15 % goal is gated on both models. The realistic model's held sessions cache 30 or 31 of their 32 blocks
    # by the luck of where their opening's server-token count lands (3,937-4,026 tokens seen, a block edge at 3,968),
    # so a level's hit rate reads 0.945-0.977 and its throughput moves ~10 % with it. Three things make the simulated
    # sessions draw the same luck: the profile counts agentload's words as the server does (calibrate's /tokenize),
    # both searches send the same words (KNEE_ARGS' --same-text; without it each run drew its own, and the knee level
    # read 0.77 in one CI run and 1.28-1.33 in others), and the profile carries what the server's chat template adds
    # beyond the words (19 tokens an opening, 13 an exchange here, where the simulator's own ChatML costs 5 and 4),
    # which the simulator pads its template to. Without that last one every simulated opening was 15-18 tokens
    # shorter than the server's, an opening of exactly 3,968 server tokens (31 blocks, lucky) was 3,952 (unlucky),
    # and the knee level read 0.891 and 0.829 with the pool full (gated at 0.75 then). With it (5 December 2026, three
    # runs) agent-turns/s read 1.015, 1.008, 1.000, 0.972; 1.029, 1.032, 1.013, 0.968; 1.029, 1.032, 1.033, 0.938 to
    # the knee, the hit rates 0.945 / 0.945, 0.975 / 0.975, 0.977 / 0.977 at 1, 2 and 4 agents in all three and
    # 0.965-0.966 / 0.956-0.957 at 6. The tiny model's template (18 and 15: its messages cost more than its
    # generation prompt) is padded too; its gated ratios read 1.066, 1.013, 1.061, 0.970 in one run.
    quiet = (0.85, 1.15)
    low, high = (0.5, 2.0) if reason else (1 / 1.5, 1.5) if busy else quiet
    for n, (_, ratio) in gated.items():
        if n <= min(real_knee, sim_knee):  # levels both runs put at or before their knee
            assert low <= ratio <= high, why
    # Past the knee the simulated server collapses too: its prefix cache is evicted between turns — unless the real
    # server's knee was compute, before the pool: then neither run evicts anything.
    if reason:
        pytest.skip(reason)
    assert abs(sim_knee - real_knee) <= 1, why
    past = [n for n in sim_by if n > sim_knee]
    assert past, why
    first_past = sim_by[min(past)]
    at = sim_by[sim_knee]
    assert first_past.prefix_hit_rate_server is not None
    assert at.prefix_hit_rate_server is not None
    assert first_past.prefix_hit_rate_server < at.prefix_hit_rate_server, why
