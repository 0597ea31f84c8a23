"""The simulated engine's scheduling semantics (vLLM V1's, docs/background.md §3), checked through what it does,
on tiny pools."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentload.capacity.profile import ServingProfile, parse_profile
from agentload.errors import SimulationError
from agentload.sim.engine import NULL_BLOCKS, Engine, EngineStats, ReadUnits, SimRequest, StepResult

BS = 16


def profile(
    *,
    num_blocks: int = 64,
    budget: int = 256,
    max_seqs: int = 8,
    max_model_len: int = 512,
    offload_gib: float = 0.0,
    prefix_caching: bool = True,
    model: str = 'model = "qwen2.5-0.5b"',
) -> ServingProfile:
    """A small dense model on a pool of ``num_blocks`` usable blocks, so that pool effects show with a few requests
    (the profile states one more: vLLM's null block, which the engine keeps empty)."""
    text = f"""
name = "tiny"
gpu = "h100"
max_model_len = {max_model_len}
max_num_batched_tokens = {budget}
max_num_seqs = {max_seqs}
enable_prefix_caching = {"true" if prefix_caching else "false"}
{model if model.startswith("model =") else ""}
[kv_pool]
num_blocks = {num_blocks + NULL_BLOCKS}
[offload]
gib = {offload_gib}
{model if model.startswith("[model]") else ""}
"""
    return parse_profile(text, "test")


HYBRID_MODEL = """[model]
name = "hybrid-tiny"
num_layers = 8
hidden_size = 512
num_attention_heads = 8
num_kv_heads = 2
head_dim = 64
attention = "hybrid"
sliding_window = 64
num_sliding_layers = 6
total_params = 1e8
active_params = 1e8
"""


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100_000) for _ in range(n)]


def request(rid: str, prompt: list[int], n_out: int, arrival: float = 0.0) -> SimRequest:
    return SimRequest(rid, prompt, tokens(hash(rid) & 0xFFFF, n_out), arrival)


def drain(engine: Engine, now: float = 0.0) -> tuple[float, list[StepResult]]:
    """Step until idle; every step must schedule something."""
    results = []
    while engine.has_work():
        res = engine.step(now)
        assert res.batch.num_requests > 0, "the engine stalled"
        results.append(res)
        now = res.end
    return now, results


# -- block accounting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fast", [False, True])
def test_random_traffic_with_aborts_and_preemptions_leaks_no_block(fast: bool) -> None:
    prof = profile(num_blocks=48, budget=128, max_seqs=6)
    engine = Engine(prof, fast=fast)
    rng = random.Random(7)
    families = [tokens(1000 + f, 400) for f in range(5)]  # shared prefixes
    submitted: list[SimRequest] = []
    emitted: dict[str, int] = {}
    now = 0.0
    step = 0
    while len(submitted) < 2000 or engine.has_work():
        if len(submitted) < 2000:
            for _ in range(rng.choice((0, 0, 1, 1, 2))):
                fam = families[rng.randrange(len(families))]
                prompt = fam[: rng.randrange(0, 300)] + tokens(len(submitted), rng.randrange(1, 100))
                req = request(f"r{len(submitted)}", prompt, rng.randrange(1, 60), now)
                engine.add(req)
                submitted.append(req)
        live = engine.running + list(engine.waiting)
        if live and rng.random() < 0.03:
            engine.abort(live[rng.randrange(len(live))])
        if not engine.has_work():
            continue
        running_before = engine.num_running
        res = engine.step(now)
        step += 1
        if res.preempted:
            # A step that preempted admits nothing: only running requests (minus the victims) were scheduled.
            assert engine.num_running == running_before - len(res.preempted) - len(res.finished)
            assert engine.waiting[0] is res.preempted[-1]
        for req in res.emitted:
            emitted[req.request_id] = emitted.get(req.request_id, 0) + 1
        assert engine.num_running <= prof.max_num_seqs
        assert res.batch.new_tokens <= prof.max_num_batched_tokens
        if step % 25 == 0:
            engine.kv.check_invariants()
        now = res.end

    engine.kv.check_invariants()
    assert engine.kv.num_free == engine.kv.num_blocks
    assert engine.kv.usage == 0.0
    aborted = [r for r in submitted if r.finish_reason == "abort"]
    done = [r for r in submitted if r.finished_at is not None]
    assert len(aborted) + len(done) == len(submitted)
    assert all(r.num_output == len(r.output) == emitted[r.request_id] for r in done)
    assert sum(engine.stats.finished.values()) == len(submitted)
    # The scenario really exercised what it claims to.
    assert engine.stats.preemptions > 20
    assert engine.stats.recomputed_tokens > 0
    assert engine.stats.prefix_hits > 0
    assert len(aborted) > 20


def test_abort_frees_a_running_request_and_keeps_its_prefix_cached() -> None:
    engine = Engine(profile())
    prompt = tokens(1, 100)
    first = request("a", prompt, 50)
    engine.add(first)
    now = 0.0
    for _ in range(3):
        now = engine.step(now).end
    assert engine.kv.num_free < engine.kv.num_blocks
    engine.abort(first, "abort")
    assert engine.kv.num_free == engine.kv.num_blocks
    assert engine.stats.finished == {"abort": 1}
    assert not engine.has_work()
    engine.abort(first)  # aborting twice is harmless
    again = request("b", [*prompt, 5, 6, 7], 1)
    engine.add(again)
    drain(engine, now)
    assert again.cached_tokens == 96  # the 6 full blocks of the prompt computed before the abort


def test_abort_of_a_waiting_request() -> None:
    engine = Engine(profile(max_seqs=1))
    a, b = request("a", tokens(1, 20), 3), request("b", tokens(2, 20), 3)
    engine.add(a)
    engine.add(b)
    engine.step(0.0)
    assert list(engine.waiting) == [b]
    engine.abort(b)
    assert engine.num_waiting == 0
    drain(engine)
    assert b.num_output == 0
    assert b.finish_reason == "abort"


def test_a_request_without_output_is_refused() -> None:
    with pytest.raises(SimulationError):
        Engine(profile()).add(SimRequest("x", [1, 2, 3], [], 0.0))


# -- prefix caching ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_out", "hit"), [(28, 112), (29, 128)])
def test_the_next_turn_hits_every_full_block_of_the_last_turn(n_out: int, hit: int) -> None:
    """Turn 1 computed its prompt and all but its last generated token (that token's KV is never computed)."""
    engine = Engine(profile())
    prompt = tokens(1, 100)
    turn1 = request("t1", prompt, n_out)
    engine.add(turn1)
    now, _ = drain(engine)
    assert turn1.cached_tokens == 0
    turn2 = request("t2", prompt + list(turn1.output) + tokens(2, 20), 5, now)
    engine.add(turn2)
    queries, hits = engine.stats.prefix_queries, engine.stats.prefix_hits
    drain(engine, now)
    assert turn2.cached_tokens == hit
    assert engine.stats.prefix_hits - hits == hit
    assert engine.stats.prefix_queries - queries == len(turn2.prompt)


def test_a_hit_leaves_at_least_one_prompt_token_to_compute() -> None:
    engine = Engine(profile())
    prompt = tokens(1, 64)
    turn1 = request("t1", prompt, 17)  # computes 80 tokens: 5 full blocks
    engine.add(turn1)
    now, _ = drain(engine)
    same = request("same", list(prompt), 1, now)  # exactly 4 cached blocks, capped at 63 tokens: 3 blocks
    longer = request("longer", prompt + list(turn1.output)[:16], 1, now)  # 80 tokens, capped at 79: 4 blocks
    engine.add(same)
    now, results = drain(engine, now)
    engine.add(longer)
    drain(engine, now)
    assert same.cached_tokens == 48
    assert results[0].batch.new_tokens == 16
    assert longer.cached_tokens == 64


def test_no_hits_with_prefix_caching_off() -> None:
    engine = Engine(profile(prefix_caching=False))
    prompt = tokens(1, 100)
    engine.add(request("a", prompt, 3))
    now, _ = drain(engine)
    b = request("b", [*prompt, 1], 3, now)
    engine.add(b)
    drain(engine, now)
    assert b.cached_tokens == 0
    assert engine.stats.prefix_hits == 0


# -- preemption ----------------------------------------------------------------------------------------------


def test_preemption_takes_the_most_recently_admitted_and_requeues_it_first() -> None:
    # 12 blocks; three 48-token prompts fill 9, their first decoded block fills the pool, the next boundary
    # (64 tokens computed) cannot be met for all three.
    engine = Engine(profile(num_blocks=12, max_seqs=3, max_model_len=192))
    a, b, c = (request(n, tokens(i, 48), 60) for i, n in enumerate("abc"))
    d = request("d", tokens(9, 8), 5)  # small, waits only for a sequence slot
    for r in (a, b, c, d):
        engine.add(r)
    now = 0.0
    res = engine.step(now)
    assert engine.running == [a, b, c]
    while not res.preempted:
        now = res.end
        res = engine.step(now)
    assert res.preempted == [c]
    assert engine.running == [a, b]
    # The victim goes to the head of the queue; nothing is admitted in the step that preempted, although d
    # would have fitted (a free sequence slot and a free block).
    assert list(engine.waiting) == [c, d]
    assert engine.kv.num_free >= 1
    assert res.batch.num_requests == 2
    assert c.num_output == 17
    assert c.preemptions == 1
    assert engine.stats.preemptions == 1
    recomputed = engine.stats.recomputed_tokens
    assert recomputed == 0

    order: list[str] = []
    now = res.end
    while engine.has_work():
        res = engine.step(now)
        for r in engine.running:
            if r.request_id not in order and r in (c, d):
                order.append(r.request_id)
        now = res.end
    assert order == ["c", "d"]  # the victim resumes before the request that waited behind it
    assert engine.stats.recomputed_tokens > 0
    assert c.num_output == len(c.output)
    assert c.cached_tokens == 0
    assert engine.kv.num_free == 12


def test_a_request_that_can_never_fit_stalls_the_queue_instead_of_crashing() -> None:
    engine = Engine(profile(num_blocks=32, budget=1024, max_model_len=512))
    engine.add(request("huge", tokens(1, 600), 1))  # one 38-block chunk: more than the pool
    res = engine.step(0.0)
    assert res.batch.num_requests == 0
    assert res.duration == 0.0
    assert engine.num_waiting == 1


# -- limits and chunking ---------------------------------------------------------------------------------------


def test_max_num_seqs_and_the_token_budget_hold() -> None:
    prof = profile(num_blocks=512, budget=128, max_seqs=4)
    engine = Engine(prof)
    rng = random.Random(3)
    for i in range(30):
        engine.add(request(f"r{i}", tokens(i, rng.randrange(40, 200)), rng.randrange(5, 30)))
    _, results = drain(engine)
    assert all(r.batch.new_tokens <= 128 for r in results)
    assert all(r.batch.num_requests <= 4 for r in results)
    # Both limits were reached, so the test could have failed.
    assert any(r.batch.new_tokens == 128 for r in results)
    assert any(r.batch.num_requests == 4 for r in results)
    assert sum(engine.stats.finished.values()) == 30


def test_a_long_prompt_is_prefilled_in_chunks() -> None:
    engine = Engine(profile(num_blocks=128, budget=256, max_model_len=2048))
    req = request("long", tokens(1, 1000), 3)
    engine.add(req)
    _, results = drain(engine)
    assert [r.batch.new_tokens for r in results] == [256, 256, 256, 232, 1, 1]
    assert [len(r.emitted) for r in results] == [0, 0, 0, 1, 1, 1]
    assert req.first_token == results[3].end
    assert req.finished_at == results[-1].end
    assert engine.stats.prompt_tokens == 1000
    assert engine.stats.prefill_tokens_computed == 1000
    assert engine.stats.generation_tokens == 3
    # Later chunks read more context, so they take longer.
    assert results[0].duration < results[1].duration < results[2].duration


def test_decoders_share_a_step_with_a_chunked_prefill() -> None:
    engine = Engine(profile(num_blocks=128, budget=64))
    short = request("short", tokens(1, 10), 20)
    engine.add(short)
    engine.step(0.0)
    long = request("long", tokens(2, 200), 2)
    engine.add(long)
    res = engine.step(1.0)
    # The running decoder takes its one token first; the newcomer gets what is left of the budget.
    assert res.batch.num_requests == 2
    assert res.batch.new_tokens == 64
    assert long.num_computed == 63


# -- sliding windows and offload ------------------------------------------------------------------------------


def test_sliding_groups_hold_a_window_while_full_groups_grow() -> None:
    prof = profile(num_blocks=400, budget=128, max_model_len=2048, model=HYBRID_MODEL)
    full = [i for i, g in enumerate(prof.layout.groups) if g.window is None]
    sliding = [i for i, g in enumerate(prof.layout.groups) if g.window is not None]
    assert sliding
    cap = -(-(64 - 1) // BS) + 1
    engine = Engine(prof)
    req = request("long", tokens(1, 1200), 40)
    engine.add(req)
    now = 0.0
    full_sizes = []
    while engine.has_work():
        res = engine.step(now)
        now = res.end
        if req.finished_at is None:
            assert all(len(req.blocks[g]) <= cap for g in sliding)
            full_sizes.append(len(req.blocks[full[0]]))
            held = sum(len(blocks) for blocks in req.blocks)
            assert engine.kv.num_blocks - engine.kv.num_free == held
    assert req.blocks == []  # a finished request holds no table (its own went to the pool's next request)
    assert full_sizes[-1] == -(-(1200 + 39) // BS) > cap
    assert full_sizes == sorted(full_sizes)
    assert engine.kv.num_free == 400


def _offload_run(offload_gib: float) -> tuple[Engine, SimRequest]:
    engine = Engine(profile(num_blocks=32, budget=512, offload_gib=offload_gib))
    prompt = tokens(1, 300)
    first = request("first", prompt, 2)  # computes 301 tokens: 18 full blocks cached
    engine.add(first)
    now, _ = drain(engine)
    flood = request("flood", tokens(2, 500), 2)  # needs all 32 blocks: evicts every block of "first"
    engine.add(flood)
    now, _ = drain(engine, now)
    follow = request("follow", prompt + list(first.output) + tokens(3, 50), 2, now)
    engine.add(follow)
    drain(engine, now)
    return engine, follow


def test_an_evicted_prefix_is_loaded_from_the_offload_tier_instead_of_recomputed() -> None:
    with_tier, fast = _offload_run(0.01)
    without, slow = _offload_run(0.0)
    assert with_tier.profile.offload_blocks > 18
    assert with_tier.stats.offload_hit_tokens == 18 * BS
    assert without.stats.offload_hit_tokens == 0
    # Usage reports loaded tokens as cached (vLLM counts a KV connector's hits in num_cached_tokens) ...
    assert (fast.cached_tokens, slow.cached_tokens) == (18 * BS, 0)
    # ... but they are not GPU prefix-cache hits.
    assert with_tier.stats.prefix_hits == without.stats.prefix_hits
    computed = (with_tier.stats.prefill_tokens_computed, without.stats.prefill_tokens_computed)
    assert computed[1] - computed[0] == 18 * BS
    assert fast.first_token is not None
    assert slow.first_token is not None
    assert fast.first_token - fast.arrival < slow.first_token - slow.arrival


# -- fast mode ---------------------------------------------------------------------------------------------------

SPARSE_HYBRID_MODEL = HYBRID_MODEL.replace('name = "hybrid-tiny"', 'name = "hybrid-sparse"\nsparse_read_tokens = 96')

FAST_CASES: dict[str, dict[str, Any]] = {
    "dense, preempting": {"num_blocks": 40, "budget": 64, "max_seqs": 8},
    "hybrid window + sparse reads": {"num_blocks": 120, "budget": 96, "max_seqs": 8, "model": SPARSE_HYBRID_MODEL},
    "offload tier": {"num_blocks": 40, "budget": 128, "max_seqs": 6, "offload_gib": 0.005},
    "more sequences than budget": {"num_blocks": 200, "budget": 8, "max_seqs": 16},
}


def _traffic(fast: bool, seed: int, **kw: Any) -> tuple[list[object], list[object], EngineStats]:
    """Per-step outcomes, per-request end states and the counters of a random run with aborts."""
    engine = Engine(profile(**kw), fast=fast)
    rng = random.Random(seed)
    shared = tokens(seed, 200)
    submitted: list[SimRequest] = []
    steps: list[object] = []
    now = 0.0
    while len(submitted) < 300 or engine.has_work():
        if len(submitted) < 300 and rng.random() < 0.3:
            prompt = shared[: rng.randrange(0, 150)] + tokens(len(submitted), rng.randrange(1, 80))
            req = request(f"r{len(submitted)}", prompt, rng.randrange(1, 120), now)
            engine.add(req)
            submitted.append(req)
        if engine.running and rng.random() < 0.01:
            engine.abort(engine.running[rng.randrange(engine.num_running)])
        if not engine.has_work():
            now += 0.01
            continue
        res = engine.step(now)
        ids = [[r.request_id for r in group] for group in (res.emitted, res.finished, res.preempted)]
        steps.append((res.duration, res.end, ids, res.batch, engine.kv.num_free, engine.num_waiting))
        now = res.end
    engine.kv.check_invariants()
    engine.sync()
    ends: list[object] = [
        (r.num_output, r.num_computed, r.cached_tokens, r.first_token, r.finished_at, r.preemptions, r.finish_reason)
        for r in submitted
    ]
    return steps, ends, engine.stats


@pytest.mark.parametrize("case", FAST_CASES)
def test_fast_mode_gives_the_step_by_step_results(case: str) -> None:
    exact = _traffic(False, 11, **FAST_CASES[case])
    fast = _traffic(True, 11, **FAST_CASES[case])
    assert fast[2] == exact[2]
    assert fast[1] == exact[1]
    assert fast[0] == exact[0]
    # The runs covered what fast mode has to get right.
    stats = exact[2]
    assert stats.generation_tokens > 10_000
    assert stats.finished.get("abort", 0) > 0
    if case == "dense, preempting":
        assert stats.preemptions > 10
    if case == "offload tier":
        assert stats.offload_hit_tokens > 0


def test_read_units_follow_the_step_time_models_read_span() -> None:
    for prof in (profile(), profile(model=HYBRID_MODEL), profile(model=SPARSE_HYBRID_MODEL)):
        units = ReadUnits(prof.model)
        layers = prof.model.num_layers
        for context in [0, 1, 15, 63, 64, 65, 95, 96, 97, 1000, 40_000]:
            assert units.units(context) / layers == pytest.approx(prof.step_model.read_span(context), rel=1e-12)
            assert units.slope(context) == units.units(context + 1) - units.units(context)


# -- determinism -------------------------------------------------------------------------------------------------


def _emission_trace(seed: int) -> list[tuple[int, str, int]]:
    """(step, request id, token index) of every token, over a fixed request set that preempts."""
    engine = Engine(profile(num_blocks=40, budget=64, max_seqs=6))
    rng = random.Random(seed)
    arrivals = sorted((rng.randrange(0, 200), i) for i in range(40))
    shared = tokens(99, 120)
    trace: list[tuple[int, str, int]] = []
    now = 0.0
    step = 0
    pending = list(arrivals)
    while pending or engine.has_work():
        while pending and pending[0][0] <= step:
            _, i = pending.pop(0)
            prompt = shared[: rng.randrange(0, 120)] + tokens(i, rng.randrange(1, 150))
            engine.add(request(f"r{i}", prompt, rng.randrange(1, 40), now))
        if engine.has_work():
            res = engine.step(now)
            trace.extend((step, r.request_id, r.num_output - 1) for r in res.emitted)
            now = res.end
        step += 1
    assert engine.stats.preemptions > 0
    return trace


def test_the_same_requests_give_the_same_token_order() -> None:
    assert _emission_trace(5) == _emission_trace(5)
    assert _emission_trace(5) != _emission_trace(6)


def test_pinned_emission_order() -> None:
    engine = Engine(profile(budget=64))
    for rid, n_prompt, n_out in (("r0", 40, 3), ("r1", 100, 2), ("r2", 10, 2)):
        engine.add(request(rid, tokens(len(rid) + n_prompt, n_prompt), n_out))
    trace: list[tuple[int, str, int]] = []
    now = 0.0
    for i in range(10):
        res = engine.step(now)
        trace.extend((i, r.request_id, r.num_output - 1) for r in res.emitted)
        now = res.end
    assert not engine.has_work()
    # Step 0: r0 prefills 40, r1 gets the other 24 of the budget. Step 1: r0 decodes, r1 continues with 63.
    # Step 2: r0 decodes (and finishes), r1 completes its prefill, r2 is admitted and prefilled in full.
    assert trace == [
        (0, "r0", 0),
        (1, "r0", 1),
        (2, "r0", 2),
        (2, "r1", 0),
        (2, "r2", 0),
        (3, "r1", 1),
        (3, "r2", 1),
    ]


def test_the_first_block_of_the_pool_is_vllms_null_block() -> None:
    # A 9-block pool as vLLM reports it holds 8: two 63-token prompts take 4 blocks of 16 each and leave none
    # free — and usage reads 100 % as vLLM's does (held ÷ the 8 usable blocks, not ÷ 9).
    prof = profile(num_blocks=8, budget=512, max_seqs=4, max_model_len=128)
    assert prof.num_blocks == 9
    engine = Engine(prof)
    assert engine.kv.num_blocks == 8
    for i in range(2):
        engine.add(request(f"r{i}", tokens(i, 63), 2))  # 63 + 1 computed = 64 tokens = 4 blocks of 16
    engine.step(0.0)
    assert engine.kv.num_free == 0
    assert engine.kv.usage == 1.0


def test_a_pool_of_only_the_null_block_is_refused() -> None:
    text = 'name = "x"\ngpu = "h100"\nmodel = "qwen2.5-0.5b"\nmax_model_len = 16\n[kv_pool]\nnum_blocks = 1\n'
    with pytest.raises(SimulationError, match="holds nothing"):
        Engine(parse_profile(text, "test"))
