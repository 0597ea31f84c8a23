"""Slot-based serving in the simulator (sim/slots.py): llama.cpp's N slots, each caching only its own last prompt.

The expected figures are hand arithmetic on tiny prompts, written as literals: a slot reuses the common prefix of
the new prompt with the tokens it holds (prompt + reply of its last request, less the last reply token, which
llama.cpp never decodes), and nothing is found in another slot.
"""

from __future__ import annotations

from typing import cast

import pytest
import tomli_w

from agentload.bench.analysis import explain_knee
from agentload.bench.orchestrate import capacity_for
from agentload.bench.results import LevelSummary, Percentiles
from agentload.bench.target import Target
from agentload.capacity.calibrate import _profile_doc
from agentload.capacity.profile import ServingProfile, load_profile, parse_profile
from agentload.endpoint.scrape import ServedModel, ServerPool
from agentload.endpoint.transport import Transport
from agentload.errors import SimulationError
from agentload.sim.engine import Engine, SimRequest
from agentload.sim.slots import SlotCache
from agentload.sim.tokens import block_hashes

BS = 16


def slot_profile(slots: int, max_model_len: int = 512) -> ServingProfile:
    text = f"""
name = "slots"
model = "qwen2.5-0.5b"
gpu = "h100"
max_model_len = {max_model_len}
max_num_batched_tokens = 4096
slots = {slots}
"""
    return parse_profile(text, "test")


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def claim(cache: SlotCache, key: object, prompt: list[int]) -> int:
    return cache.claim(key, prompt, block_hashes(prompt, BS))


def test_a_slot_reuses_its_own_last_prompt_and_reply() -> None:
    cache = SlotCache(2, BS)
    a1 = seq(0, 100)
    assert claim(cache, "a1", a1) == 0  # empty slots
    cache.release("a1", a1 + seq(1000, 10))  # the slot now holds 110 tokens
    a2 = a1 + seq(1000, 10) + seq(2000, 20)
    assert claim(cache, "a2", a2) == 110  # all of them, token-exact (110 is not a multiple of 16)


def test_a_prompt_that_diverges_mid_block_reuses_up_to_the_divergence() -> None:
    cache = SlotCache(1, BS)
    first = seq(0, 64)
    claim(cache, "x", first)
    cache.release("x", first)
    second = seq(0, 37) + seq(500, 40)  # equal for 37 tokens: two whole blocks and 5 tokens of the third
    assert claim(cache, "y", second) == 37


def test_nothing_is_shared_across_slots() -> None:
    cache = SlotCache(2, BS)
    shared_system = seq(0, 48)
    claim(cache, "a", shared_system + seq(100, 10))
    claim(cache, "b", shared_system + seq(200, 10))  # the other slot: a's tokens are not visible to it
    cache.release("a", shared_system + seq(100, 10))
    cache.release("b", shared_system + seq(200, 10))
    # A third agent with the same system prompt finds it in whichever slot it gets, but only there: 48 tokens,
    # the system prompt, from the slot it shares most with (both share 48 / 58 > 0.1; the first best is kept).
    assert claim(cache, "c", shared_system + seq(300, 10)) == 48


def test_past_the_slot_count_an_agent_loses_its_slot_to_another() -> None:
    cache = SlotCache(2, BS)
    a, b, c = seq(0, 200), seq(1000, 200), seq(2000, 200)
    claim(cache, "a", a)
    claim(cache, "b", b)
    cache.release("a", a)
    cache.release("b", b)
    # c shares nothing with either slot: the least recently used one (a's) is taken and overwritten.
    assert claim(cache, "c", c) == 0
    cache.release("c", c)
    # a's next turn: its slot now holds c; b's slot is the only other and shares nothing either: a re-prefills.
    assert claim(cache, "a2", a + seq(5000, 20)) == 0


def test_more_claims_than_slots_is_an_engine_bug() -> None:
    cache = SlotCache(1, BS)
    claim(cache, "a", seq(0, 10))
    with pytest.raises(SimulationError, match="no idle slot"):
        claim(cache, "b", seq(0, 10))


def test_no_reuse_when_prompt_caching_is_off() -> None:
    cache = SlotCache(1, BS, reuse=False)
    claim(cache, "a", seq(0, 100))
    cache.release("a", seq(0, 100))
    assert claim(cache, "b", seq(0, 120)) == 0


def test_the_slot_profile_sizes_the_pool_and_caps_running_requests() -> None:
    p = slot_profile(4, max_model_len=8192)
    assert p.slots == 4
    assert p.max_num_seqs == 4
    assert p.pool_tokens == 4 * 8192  # llama.cpp's -c: the slots' contexts added up
    builtin = load_profile("llamacpp-8b-l40s")
    assert (builtin.slots, builtin.max_num_seqs, builtin.pool_tokens) == (4, 4, 131_072)


def run_turns(engine: Engine, turns: list[list[tuple[str, list[int], int]]]) -> dict[str, int]:
    """Each inner list is sent at once and run to completion; returns each request's cached tokens."""
    cached: dict[str, int] = {}
    now = 0.0
    for wave in turns:
        reqs = [SimRequest(rid, prompt, seq(9000 + 10 * i, n_out), arrival=now) for i, (rid, prompt, n_out) in
                enumerate(wave)]  # fmt: skip
        for r in reqs:
            engine.add(r)
        while engine.has_work():
            res = engine.step(now)
            now = res.end
        engine.sync()
        for r in reqs:
            assert r.finished_at is not None
            assert r.cached_tokens is not None
            cached[r.request_id] = r.cached_tokens
    return cached


@pytest.mark.parametrize("fast", [False, True])
def test_the_engine_reuses_a_slot_per_agent_while_agents_fit(fast: bool) -> None:
    engine = Engine(slot_profile(2), fast=fast)
    a, b = seq(0, 100), seq(1000, 100)
    out_a, out_b = seq(9000, 8), seq(9010, 8)  # run_turns' replies: 8 tokens from 9000 + 10 × position
    second = [("a2", a + out_a + seq(300, 30), 8), ("b2", b + out_b + seq(400, 30), 8)]
    cached = run_turns(engine, [[("a1", a, 8), ("b1", b, 8)], second])
    assert cached["a1"] == cached["b1"] == 0
    # The slot holds the prompt and 7 of the 8 reply tokens (the last is sampled, never decoded): 107 tokens.
    assert cached["a2"] == cached["b2"] == 107
    assert engine.stats.prefix_hits == 2 * 107
    assert engine.stats.prefix_queries == 2 * 100 + 2 * 138


@pytest.mark.parametrize("fast", [False, True])
def test_the_engine_queues_past_the_slots_and_an_agent_loses_its_cache(fast: bool) -> None:
    engine = Engine(slot_profile(2), fast=fast)
    a, b, c = seq(0, 100), seq(1000, 100), seq(2000, 100)
    # Three at once on two slots: c waits for a slot (it is admitted only when a or b finishes).
    first = [SimRequest(rid, p, seq(9000, 8), arrival=0.0) for rid, p in (("a", a), ("b", b), ("c", c))]
    for r in first:
        engine.add(r)
    res = engine.step(0.0)
    assert len(engine.running) == 2
    assert len(engine.waiting) == 1
    now = res.end
    while engine.has_work():
        now = engine.step(now).end
    assert [r.cached_tokens for r in first] == [0, 0, 0]
    # c took a's slot (the least recently used idle one): a's next turn finds a slot holding c or b, not its own.
    a2 = SimRequest("a2", a + seq(9000, 8) + seq(300, 30), seq(9000, 8), arrival=now)
    engine.add(a2)
    while engine.has_work():
        now = engine.step(now).end
    assert a2.cached_tokens == 0


def level(agents: int, *, tps: float, hit: float, running: float, waiting: float, kv: float | None) -> LevelSummary:
    return LevelSummary(level=0, agents=agents, context=2048, workload="agentic-hold", window_s=60.0, warmup_s=10.0,
                        sessions_completed=0, sessions_failed=0, requests_ok=100, requests_failed=0, turns=100,
                        output_tps=tps, prefill_tps=100.0, throughput_source="server", prefix_hit_rate_server=hit,
                        ttft_s=Percentiles(p50=0.1), itl_s=Percentiles(p50=0.01), queue_wait_s=Percentiles(),
                        peak_kv_usage=kv, mean_running=running, mean_waiting=waiting, preemptions=0.0,
                        turns_per_s=1.0)  # fmt: skip


def test_a_slot_server_knee_is_explained_as_slots_full_not_eviction() -> None:
    good = level(4, tps=100.0, hit=0.95, running=3.2, waiting=0.0, kv=0.4)
    bad = level(5, tps=80.0, hit=0.6, running=4.0, waiting=0.9, kv=0.45)
    why = explain_knee(good, bad, slots=4)
    assert why.cause == "slots_full"
    assert "more agents than the server's 4 slots" in why.summary
    assert "turns queue for a slot (0.90 requests waiting" in why.summary
    assert "95.0% to 60.0%" in why.summary
    # A knee below the slot count is not the slots filling up.
    below = level(3, tps=80.0, hit=0.95, running=3.0, waiting=0.9, kv=0.45)
    assert explain_knee(level(2, tps=100.0, hit=0.95, running=2.0, waiting=0.0, kv=0.4), below, slots=4).cause == (
        "compute_saturation"
    )
    # The same levels on a server not known to be slot-based keep the paged-pool reading (vLLM unchanged).
    assert explain_knee(good, bad).cause == "cache_eviction"
    assert "peak KV 45%" in why.summary


def test_a_slot_server_without_a_kv_gauge_is_not_said_to_peak_at_zero() -> None:
    # llama.cpp has no KV usage gauge: the summary must not read "peak KV 0%" as if it had measured one.
    good = level(4, tps=100.0, hit=0.95, running=3.2, waiting=0.0, kv=None)
    bad = level(5, tps=80.0, hit=0.6, running=4.0, waiting=0.9, kv=None)
    why = explain_knee(good, bad, slots=4)
    assert why.cause == "slots_full"
    assert "peak KV" not in why.summary
    assert "reports no KV gauge" in why.summary


def target(profile: ServingProfile | None) -> Target:
    return Target(cast(Transport, None), "http://127.0.0.1:1", "m", "test", virtual=False, profile=profile)


def test_a_slot_servers_capacity_is_its_slots_not_its_pool() -> None:
    # llama.cpp's probe gives slots and an equivalent pool without an exact block size, so bench has no pool:
    # the estimate is the slots. A profile in slot mode: the pool (4 × 32,768 tokens) would hold 8 agents of
    # 16,384, but only 4 run at once.
    real = capacity_for(target(None), 2048, None, slots=3)
    assert (real.sessions, real.predicted, real.slots) == (3.0, 3.0, 3)
    sim = capacity_for(target(load_profile("llamacpp-8b-l40s")), 16384, None)
    assert sim.sessions == pytest.approx(8.0)
    assert sim.predicted == 4.0


def test_calibrating_a_llamacpp_server_writes_a_slot_profile() -> None:
    pool = ServerPool(engine="llamacpp", num_blocks=3 * 4096 // 16, block_size=16, source="/props", exact=False,
                      max_num_seqs=3, max_model_len=4096)  # fmt: skip
    doc = _profile_doc("x", "http://127.0.0.1:1", ServedModel(id="m"), None, pool, 4096, "auto")
    assert doc["slots"] == 3
    text = tomli_w.dumps(doc)
    profile = parse_profile(text, "calibrated")
    assert (profile.slots, profile.max_num_seqs, profile.pool_tokens) == (3, 3, 3 * 4096)


def test_cache_loss_below_the_slot_count_is_explained_as_slots_taken_not_a_pool_overflow() -> None:
    # Two agents on three slots: the hit rate collapses with no queue — agents took each other's slots.
    good = level(1, tps=100.0, hit=0.977, running=0.1, waiting=0.0, kv=None)
    bad = level(2, tps=60.0, hit=0.506, running=0.2, waiting=0.0, kv=None)
    why = explain_knee(good, bad, slots=3)
    assert why.cause == "cache_eviction"
    assert "still within the server's 3 slots" in why.summary
    assert "97.7% to 50.6%" in why.summary
    assert "outgrow the KV pool" not in why.summary
    # Without slots (a paged-pool server) the same figures keep the pool reading.
    assert "outgrow the KV pool" in explain_knee(good, bad).summary


# -- id_slot: a request pinned to its slot (llama.cpp's get_available_slot / get_slot_by_id) -----------------------


def test_a_pinned_request_takes_its_slot_even_when_another_holds_more_of_its_prompt() -> None:
    cache = SlotCache(3, BS)
    shared = seq(0, 60)
    claim(cache, "a", shared + seq(100, 40))
    cache.release("a", shared + seq(100, 40))  # slot 2 (a fresh server's first claim goes to the last slot)
    # Unpinned, b would take slot 2 by similarity (60 / 100 > 0.1) and reuse 60 tokens; pinned to 0 it gets the
    # empty slot 0 and reuses nothing.
    assert cache.claim("b", shared + seq(200, 40), block_hashes(shared + seq(200, 40), BS), id_slot=0) == 0
    assert [v.task for v in cache.view()] == ["b", None, "a"]


def test_a_pinned_request_reuses_its_own_slots_prefix() -> None:
    cache = SlotCache(2, BS)
    first = seq(0, 50)
    cache.claim("a1", first, block_hashes(first, BS), id_slot=1)
    cache.release("a1", first + seq(700, 5))
    second = first + seq(700, 5) + seq(800, 9)
    assert cache.claim("a2", second, block_hashes(second, BS), id_slot=1) == 55


def test_a_busy_pinned_slot_cannot_take_a_request_while_another_slot_is_idle() -> None:
    cache = SlotCache(2, BS)
    cache.claim("a", seq(0, 10), block_hashes(seq(0, 10), BS), id_slot=0)
    assert cache.can_take(1) is True
    assert cache.can_take(0) is False  # llama.cpp defers it ("requested slot is unavailable")
    assert cache.can_take(-1) is True  # any slot: slot 1 is idle
    with pytest.raises(SimulationError, match="no idle slot"):
        cache.claim("b", seq(0, 10), block_hashes(seq(0, 10), BS), id_slot=0)


def test_an_id_past_the_last_slot_wraps_and_other_negatives_wrap_unsigned() -> None:
    # llama.cpp: id_slot % slots.size() in size_t; the real -np 3 server served id_slot 4 in slot 1, 5 in slot 2,
    # -2 in slot 2 ((2**64 - 2) mod 3 = 2).
    cache = SlotCache(3, BS)
    assert (cache.pinned_slot(0), cache.pinned_slot(2), cache.pinned_slot(3), cache.pinned_slot(7)) == (0, 2, 0, 1)
    assert (cache.pinned_slot(4), cache.pinned_slot(5)) == (1, 2)
    assert (cache.pinned_slot(-1), cache.pinned_slot(-2)) == (None, 2)
    cache.claim("x", seq(0, 10), block_hashes(seq(0, 10), BS), id_slot=4)  # 4 mod 3 = slot 1
    assert [v.busy for v in cache.view()] == [False, True, False]


@pytest.mark.parametrize("fast", [False, True])
def test_the_engine_defers_a_pinned_request_until_its_slot_frees_and_admits_others_past_it(fast: bool) -> None:
    engine = Engine(slot_profile(2), fast=fast)
    a, b, c = seq(0, 100), seq(1000, 100), seq(2000, 100)
    ra = SimRequest("a", a, seq(9000, 8), arrival=0.0, id_slot=0)
    rb = SimRequest("b", b, seq(9000, 8), arrival=0.0, id_slot=0)  # same slot as a: must wait although slot 1 idles
    rc = SimRequest("c", c, seq(9000, 8), arrival=0.0, id_slot=1)  # behind b in the queue, its slot is free
    for r in (ra, rb, rc):
        engine.add(r)
    now = engine.step(0.0).end
    assert [r.request_id for r in engine.running] == ["a", "c"]
    assert [r.request_id for r in engine.waiting] == ["b"]
    while engine.has_work():
        now = engine.step(now).end
    engine.sync()
    assert rb.first_scheduled is not None
    assert ra.finished_at is not None
    assert rb.first_scheduled >= ra.finished_at  # b started only once a had left slot 0
    # a's next turn, pinned to slot 0, finds b there (b took it after a): nothing of a's is left.
    a2 = SimRequest("a2", a + seq(9000, 8) + seq(300, 30), seq(9000, 8), arrival=now, id_slot=0)
    engine.add(a2)
    while engine.has_work():
        now = engine.step(now).end
    assert a2.cached_tokens == 0
    # c's next turn on slot 1 finds its 100-token prompt and 7 decoded reply tokens there.
    c2 = SimRequest("c2", c + seq(9000, 8) + seq(400, 30), seq(9000, 8), arrival=now, id_slot=1)
    engine.add(c2)
    while engine.has_work():
        now = engine.step(now).end
    assert c2.cached_tokens == 107


def test_a_pinned_knee_is_explained_as_turns_waiting_for_their_own_slot() -> None:
    good = level(3, tps=100.0, hit=0.978, running=2.4, waiting=0.0, kv=None)
    bad = level(4, tps=85.0, hit=0.70, running=3.0, waiting=0.35, kv=None)
    why = explain_knee(good, bad, slots=3, pinned=True)
    assert why.cause == "slots_full"
    assert "pinned to slots (id_slot = agent mod 3)" in why.summary
    assert "turns queue for their own slot (0.35 requests waiting" in why.summary
    assert "finds the other agent's prompt in its slot" in why.summary
    assert "97.8% to 70.0%" in why.summary
    assert "whichever slot is idle" not in why.summary  # that is the unpinned reading
    assert "whichever slot is idle" in explain_knee(good, bad, slots=3).summary


def test_pinned_cache_loss_below_the_slot_count_is_not_called_slots_taken() -> None:
    good = level(1, tps=100.0, hit=0.977, running=0.1, waiting=0.0, kv=None)
    bad = level(2, tps=60.0, hit=0.506, running=0.2, waiting=0.0, kv=None)
    why = explain_knee(good, bad, slots=3, pinned=True)
    assert why.cause == "cache_eviction"
    assert "each agent pinned to its own" in why.summary
    assert "take each other's slots" not in why.summary
