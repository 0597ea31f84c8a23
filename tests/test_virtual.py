"""Closed-loop agent sessions in virtual time, and the capacity curves they must reproduce.

The curve tests are the issue's acceptance criteria: with sessions held near 40k tokens on a 997,753-token pool,
a dense-attention model (Qwen3-235B) peaks at 20–28 sessions and collapses past the KV knee (LRU eviction turns
every turn into a re-prefill, preemptions start), while a hybrid model whose sliding groups keep only their
window keeps scaling through 48 sessions on the same pool.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from agentload.capacity.profile import load_profile
from agentload.errors import ConfigError
from agentload.sim import poolkernel
from agentload.sim.engine import Engine, SimRequest, StepResult
from agentload.sim.tokens import block_hashes
from agentload.sim.virtual import SessionShape, VirtualRunResult, _Prompt, _Session, run_sessions

# 300 s of virtual time with a 100 s warm-up: long enough that every session has completed several turns in
# the window (a turn is ~10-25 s here), short enough to keep the sweeps cheap.
DURATION_S = 300.0
WARMUP_S = 100.0
HELD_40K = SessionShape(context=40_000)


def sweep(profile_name: str, sessions: list[int]) -> dict[int, VirtualRunResult]:
    profile = load_profile(profile_name)
    return {n: run_sessions(profile, n, HELD_40K, duration_s=DURATION_S, warmup_s=WARMUP_S) for n in sessions}


@pytest.fixture(scope="module")
def dense_curve() -> dict[int, VirtualRunResult]:
    return sweep("qwen3-235b-gb300", [16, 20, 24, 28, 32, 48])


def test_dense_throughput_peaks_at_the_kv_knee(dense_curve: dict[int, VirtualRunResult]) -> None:
    tps = {n: r.output_tps for n, r in dense_curve.items()}
    peak_at = max(tps, key=lambda n: tps[n])
    assert 20 <= peak_at <= 28, tps
    assert tps[48] <= 0.7 * tps[peak_at], tps
    # Below the knee more sessions bring more throughput.
    assert tps[16] < tps[20] <= tps[peak_at], tps


def test_past_the_dense_knee_the_cache_thrashes(dense_curve: dict[int, VirtualRunResult]) -> None:
    peak_at = max(dense_curve, key=lambda n: dense_curve[n].output_tps)
    below = [r for n, r in dense_curve.items() if n <= peak_at]
    beyond = [r for n, r in dense_curve.items() if n > peak_at]
    assert beyond
    assert all(r.preemptions == 0 for r in below)
    assert all(r.preemptions > 0 for r in beyond)
    # Each turn's long prefix was evicted before the session came back: hits collapse, prefill balloons.
    assert all(r.prefix_hit_rate > 0.9 for r in below)
    assert all(r.prefix_hit_rate < 0.5 for r in beyond)
    assert all(r.recomputed_tokens > 0 for r in beyond)
    assert dense_curve[48].prefill_tps > 3 * dense_curve[peak_at].prefill_tps
    assert dense_curve[48].mean_kv_usage > 0.9
    # Sessions that do not fit queue up instead of running.
    assert dense_curve[48].mean_waiting > 10


def test_sliding_window_groups_keep_scaling_on_the_same_pool() -> None:
    curve = sweep("deepseek-sliding-gb300", [24, 32, 48])
    tps = {n: r.output_tps for n, r in curve.items()}
    assert tps[24] < tps[32] < tps[48], tps
    assert all(r.preemptions == 0 for r in curve.values())
    assert curve[48].prefix_hit_rate > 0.9
    assert curve[48].peak_kv_usage < 0.9


# -- the fast path -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile_name", "sessions", "shape"),
    [
        ("qwen3-235b-gb300", 28, HELD_40K),  # past the knee: preemptions, evictions, recomputation
        ("deepseek-sliding-gb300", 40, HELD_40K),  # sliding groups
        (
            "laptop",
            12,
            SessionShape(context=8_000, start_context=2_000, growth="grow", system_tokens=500, turn_input_tokens=600),
        ),
    ],
)
def test_fast_path_gives_the_step_by_step_results(profile_name: str, sessions: int, shape: SessionShape) -> None:
    """Decode cohorts and chained steps without clock events change nothing, to the last bit."""
    profile = load_profile(profile_name)
    seen: dict[bool, list[object]] = {False: [], True: []}

    def watcher(fast: bool) -> Callable[[StepResult], None]:
        def note(res: StepResult) -> None:
            ids = [[r.request_id for r in group] for group in (res.emitted, res.finished, res.preempted)]
            seen[fast].append((res.duration, res.end, ids, res.batch))

        return note

    results = {
        fast: run_sessions(profile, sessions, shape, duration_s=120, warmup_s=30, fast=fast, on_step=watcher(fast))
        for fast in (False, True)
    }
    assert results[True] == results[False]
    assert seen[True] == seen[False]
    # Without a step hook the driver takes its fastest path (whole runs of decode steps in one call).
    assert run_sessions(profile, sessions, shape, duration_s=120, warmup_s=30) == results[False]
    assert results[False].turns_completed > sessions


# -- the driver itself ---------------------------------------------------------------------------------------


def test_a_prompt_view_reads_like_the_joined_list() -> None:
    head, tail = np.arange(100, dtype=np.int64), list(range(1000, 1030))
    view = _Prompt(head, 60, tail)  # the first 60 of head, then tail
    joined = head[:60].tolist() + tail
    head[60:] = -1  # the conversation grows after the prompt was taken (its buffer written past 60): the view does not
    assert len(view) == len(joined) == 90
    for sl in (slice(0, 16), slice(48, 64), slice(60, 90), slice(50, 70, 3), slice(-20, None), slice(80, 200)):
        got = view[sl]
        assert got == joined[sl]
        assert all(type(t) is int for t in got)  # Python ints, as the engine hashes them
    assert [view[i] for i in (0, 59, 60, 89, -1, -90)] == [joined[i] for i in (0, 59, 60, 89, -1, -90)]
    assert type(view[0]) is int
    with pytest.raises(IndexError):
        view[90]


@pytest.mark.parametrize("ahead", [False, True])
def test_a_growing_session_and_the_engine_extend_one_hash_list(ahead: bool) -> None:
    """A growing session hands the engine its own hash list; what the engine appends (the reply's blocks) is
    what the session would have hashed itself, so the list stays the chain of the conversation turn after turn —
    also when the session hashed the reply's blocks ahead (``ahead``: in C, where the pool kernel is built) and the
    engine takes them from there."""
    profile = load_profile("laptop")
    bs = profile.block_size
    shape = SessionShape(
        context=8_000, start_context=2_000, growth="grow", system_tokens=500, turn_input_tokens=300, output_tokens=90
    )
    system = list(range(500))
    session = _Session(0, shape, system, block_hashes(system, bs), bs)
    engine = Engine(profile, fast=True)
    last: list[int] | None = None
    now = 0.0
    for turn in range(4):
        prompt, known = session.next_prompt(last)
        assert known is session.hashes
        assert known == block_hashes(session.tokens[: session.length].tolist(), bs)
        req = SimRequest(f"t{turn}", prompt, session.fresh(shape.output_tokens), now, hashes=known)
        if ahead:
            req.planned_hashes, req.planned_from = session.reply_hashes(known), len(known)
            assert req.planned_hashes is not None or poolkernel.load() is None
        engine.add(req)
        while req.finished_at is None:
            now = engine.step(now).end
        assert len(known) == (len(prompt) + len(req.output) - 1) // bs  # the reply's full blocks were appended
        last = list(req.output)
    assert session.length > 3_000


def test_a_run_is_deterministic() -> None:
    profile = load_profile("laptop")
    shape = SessionShape(context=8_000, system_tokens=500, turn_input_tokens=300, output_tokens=100, think_s=1.0)
    first = run_sessions(profile, 6, shape, duration_s=60, warmup_s=10)
    again = run_sessions(profile, 6, shape, duration_s=60, warmup_s=10)
    assert first == again
    assert first.turns_completed > 6
    assert first.output_tokens > 0
    assert len(first.ttft_s) == first.turns_completed


def test_held_sessions_reuse_their_prefix_every_turn() -> None:
    profile = load_profile("laptop")
    shape = SessionShape(context=8_000, system_tokens=500, turn_input_tokens=300, output_tokens=100, think_s=1.0)
    result = run_sessions(profile, 4, shape, duration_s=120, warmup_s=30)
    # Each turn re-sends ~8k tokens of which only the last exchange (~400 tokens + a partial block) is new.
    assert result.prefix_hit_rate > 0.9
    assert result.preemptions == 0
    assert 0 < result.mean_kv_usage <= result.peak_kv_usage <= 1
    assert result.ttft_percentile(50) < 1.0


def test_growing_sessions_restart_when_the_context_is_full() -> None:
    profile = load_profile("laptop")
    shape = SessionShape(
        context=6_000,
        start_context=1_500,
        growth="grow",
        system_tokens=500,
        turn_input_tokens=800,
        output_tokens=200,
        think_s=0.5,
    )
    result = run_sessions(profile, 1, shape, duration_s=120, warmup_s=0)
    # Turns grow by 1,000 tokens: 1,500 → 5,500, then the conversation restarts (a compaction): a cold prefill
    # apart from the shared system prompt, so the hit rate stays below that of a session that never restarts.
    assert result.turns_completed > 10
    assert 0.5 < result.prefix_hit_rate < 0.9


@pytest.mark.parametrize(
    ("sessions", "shape", "duration", "warmup"),
    [
        (0, HELD_40K, 100.0, 10.0),
        (4, HELD_40K, 100.0, 100.0),
        (4, SessionShape(context=40_900), 100.0, 10.0),  # + 400 output tokens passes max_model_len 40,960
        (4, SessionShape(context=3_000), 100.0, 10.0),  # no room for a turn after the system prompt
    ],
)
def test_impossible_runs_are_refused(sessions: int, shape: SessionShape, duration: float, warmup: float) -> None:
    with pytest.raises(ConfigError):
        run_sessions(load_profile("qwen3-235b-gb300"), sessions, shape, duration_s=duration, warmup_s=warmup)
