"""How fast the simulator runs in virtual time: simulated seconds per wall second, on one core.

Scenarios (pick with ``--scenario``; default: all):

* ``fleet`` — the issue's goal (≥ 1,000× real time): 256 coding agents × 40 turns, contexts growing from 12k to
  ~100k tokens (1,800 tool-result tokens + 400 output tokens per turn, 2 s of tool time), on Qwen3-235B-A22B
  (fp4 weights, fp8 KV) over 4 × GB300 with max_model_len 131,072 and the pool derived from memory
  (9.46M tokens): the fleet starts inside the pool and ends far past it, so the run crosses the KV knee.
* ``fleet-fits`` — the same fleet on Llama-3.1-8B (fp8 weights and KV) over 8 × B200, pool derived from memory
  (19.4M tokens): the fleet fits until its last turns, so ~200 agents decode together in every step — the
  decode-heavy regime, where the cohort fast path does the work.
* ``fleet-1gpu`` — the same fleet on the built-in single DGX Station GB300 (997,753-token pool, max_model_len
  raised to 131,072): deep past the knee from the start, every turn a re-prefill.
* ``qwen-24`` / ``deepseek-48`` — the capacity-curve runs of tests/test_virtual.py at 900 s (300 s warm-up):
  Qwen3-235B at its knee (24 sessions near 40k tokens) and the sliding-window model at 48 sessions.

Measured (2 December 2026, one core of a shared 2-core machine, CPU-time figures, each the mean of two
runs alternated with the code before the change): fleet 465× → 600× (the goal is 1,000×), fleet-fits 54× → 69×
(the goal is 300×), fleet-1gpu 475× → 503×, qwen-24 968× → 1,013×, deepseek-48 290× → 290×; every digest unchanged
(8bed5aede8701ca9, 72d2ca5a1e8e212f, b7eb7a44515e5c6a, b2ea95e559aa5191, fbcde2e32dc056b0). What is left is
mostly random reads over a pool of 0.6–1.2 M blocks (hash index, reference counts) and turning each token into a
Python int to hash it; the wall-clock figure reads lower whenever the machine is busy.

3 December 2026 (same machine, pinned to one core, CPU time, alternated with the code before): a session's
conversation kept as an int64 buffer instead of a list of Python ints (25M int objects at the end of a fleet run)
took fleet-fits from 11.3 / 9.8 to 7.5 / 7.2 CPU s (system time 3.9 / 2.9 → 0.3 s, peak RSS 1.41 → 0.62 GB); one
32-byte row per block for its count, stamp, hash and group gave another 4-8 %. The machine's speed drifted by 30 %
within the hour: over two alternated rounds of every scenario, session start → now, fleet 559 / 650× → 573 / 804×,
fleet-fits 63 / 83× → 68 / 87× (100-109× in quieter runs), fleet-1gpu 471 / 593× → 526 / 593×; every digest unchanged
(26dc9fc991745306, 08dabec8a78fe5c7, 95dba94c494b01df, f81c55390280e5e3, b306e6bccc5a54d6: the null block and the
calibrated tokenizer changed them since the figures above). The goals (1,000× / 300×) are not met: what is left is
spread over the pool's numpy passes (hash index, reference counts, free queue: memory-bound random reads), none
above 12 %; the same modules compiled with mypyc ran 1.22-1.26× faster, not enough for the 8×B200 goal either.

5 December 2026 (same machine, pinned to one core): the pool's bookkeeping loops in C (sim/poolkernel.c, compiled on
first use; numpy where there is no compiler) and a conversation's block hashes computed in C from its buffer. Across
runs that day, fleet 607× (numpy) → 1,217-1,527×, fleet-fits 71× → 113-146×, fleet-1gpu 1,132-1,282×, qwen-24
1,327-1,442×, deepseek-48 398-438×; every digest unchanged. The fleet goal (1,000×) is met; fleet-fits (300×) is
not: what is left is the engine's own Python per step and per decoded block (a block allocated and cached every 16
tokens of every running request, 250k of each in that run) and, on this VM, the first touch of the run's ~600 MB
(up to a second of system time, varying from run to run). The first line printed says which code ran the pool.

5 December 2026, later (same machine, pinned to one core, alternated with the code before, three rounds): the
cohort's block events on a wheel (a member allocates at ticks ≡ its phase and caches a block the tick before: no
event per block, no sorting) and a single-group pool growing the members due at a tick in one pass; an array's
address for the kernel at a quarter of the cost. fleet-fits user CPU 4.68-4.74 → 4.17-4.51 s, 169-170× → 180-191×
(a run of the code before that hit the VM's slow first touch: 132×); fleet user CPU 5.91 → 5.58 s; function calls
in a fleet-fits run 11.1 M → 7.5 M; every digest unchanged. Still short of 300× for fleet-fits, for the reason above.

5 December 2026, evening: two tries that did not help, kept out. (1) The engine, pool and driver modules
(sim/engine.py, sim/kvcache.py, sim/virtual.py) compiled with mypyc, unchanged but for one annotation: fleet-fits
190-200× against 162-176× for the same code interpreted, alternated three times (1.13×; same digest) — the time left is
spread over the pool's calls and numpy, which mypyc does not speed up. (2) Software prefetching in every kernel loop
(asking for element i + 8's pool row and hash slot while working on element i): user CPU 4.49-4.63 s against
4.52-4.69 s, no change — the loops' elements are independent, so the processor already overlaps their cache misses.

5 December 2026, second session (same machine, pinned to one core, alternated with the session's start, f8d2472):
the goals are met. What the time went to, from a py-spy profile of fleet-fits: fixed costs around small operations,
not the operations. (1) The pool's buffers reused: a finished request's block table goes, empty, to the next request, so
a turn's blocks no longer grow and copy a fresh list (the largest single step: 2.48 → 2.33 CPU s); a take's blocks
come back in a reusable buffer; a chain's hashes reach the kernel by address (a read-only view's address had taken
numpy's slow way) and go from C straight into the chain's int64 mirror. (2) One pass where there were two: a free
queues each block as its last reference goes; a prefix hit's references are taken before the fit check (given back
if it fails) instead of counted first. (3) Per-block work: a decode step's filled blocks are staged in two arrays
and cached in one kernel call; a growing session hashes its reply's blocks ahead in one C call and the engine takes
each as it fills. (4) Token draws in C, exactly numpy's ``Generator.integers(0, high, n)`` (Lemire's bounded
integers on the bit generator's own ``next_uint32``; checked against numpy, generator state included, when the
kernel loads): numpy's call cost ~3 µs before its first draw, twice a turn. Two rounds of every scenario, session
start → now: fleet 1,981 / 2,011× → 2,566 / 2,813×; **fleet-fits 225 / 229× → 305 / 309×** (2.33 CPU s = 320×
in three runs of fleet-fits alone, against 3.14-3.20 s = 233-237× for the start); fleet-1gpu 1,728 / 1,733× → 1,914
/ 1,961×; qwen-24 2,296 / 2,227× → 2,485 / 2,533×; deepseek-48 676 / 675× → 720 / 755×. Every digest unchanged, and
fleet-fits' also with ``--exact`` and with ``AGENTLOAD_POOL_KERNEL=0`` (numpy, 109×). Tried and left out: a hash
index of two slots a block instead of four (no change).

``--exact`` runs the step-by-step path (no fast-forwarding of decode steps) for comparison; both must print the
same simulation figures, and the same ``digest``: a hash of every field of the result, each float by its exact
``repr`` and every TTFT included, so two runs that print the same digest agree to the last bit. ``--profile``
prints the top of a cProfile of each run.

    .venv/bin/python benchmarks/bench_virtual.py [--scenario fleet] [--exact] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import pstats
import time
from collections.abc import Callable
from dataclasses import dataclass

from agentload.capacity.profile import ServingProfile, load_profile, parse_profile
from agentload.sim import poolkernel
from agentload.sim.virtual import SessionShape, VirtualRunResult, run_sessions

QWEN_4X_GB300 = """
name = "qwen3-235b-4xgb300-128k"
model = "qwen3-235b-a22b"
gpu = "gb300"
num_gpus = 4
weight_dtype = "fp4"
kv_cache_dtype = "fp8"
max_model_len = 131072
"""

LLAMA_8X_B200 = """
name = "llama-8b-8xb200-128k"
model = "llama-3.1-8b"
gpu = "b200"
num_gpus = 8
weight_dtype = "fp8"
kv_cache_dtype = "fp8"
max_model_len = 131072
"""

QWEN_1X_GB300_128K = """
name = "qwen3-235b-gb300-128k"
model = "qwen3-235b-a22b"
gpu = "dgx-station-gb300"
weight_dtype = "fp4"
kv_cache_dtype = "fp8"
max_model_len = 131072
[kv_pool]
tokens = 997753
"""

CODING_AGENT = SessionShape(
    context=100_000,
    start_context=12_000,
    growth="grow",
    system_tokens=2_000,
    turn_input_tokens=1_800,
    output_tokens=400,
    think_s=2.0,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    profile: Callable[[], ServingProfile]
    sessions: int
    shape: SessionShape
    duration_s: float
    warmup_s: float
    turns: int | None = None


SCENARIOS = [
    Scenario("fleet", lambda: parse_profile(QWEN_4X_GB300, "bench"), 256, CODING_AGENT, 24 * 3600.0, 0.0, 40),
    Scenario("fleet-fits", lambda: parse_profile(LLAMA_8X_B200, "bench"), 256, CODING_AGENT, 24 * 3600.0, 0.0, 40),
    Scenario("fleet-1gpu", lambda: parse_profile(QWEN_1X_GB300_128K, "bench"), 256, CODING_AGENT, 1800.0, 0.0),
    Scenario("qwen-24", lambda: load_profile("qwen3-235b-gb300"), 24, SessionShape(context=40_000), 900.0, 300.0),
    Scenario(
        "deepseek-48", lambda: load_profile("deepseek-sliding-gb300"), 48, SessionShape(context=40_000), 900.0, 300.0
    ),
]


def run(sc: Scenario, *, fast: bool) -> VirtualRunResult:
    return run_sessions(
        sc.profile(),
        sc.sessions,
        sc.shape,
        duration_s=sc.duration_s,
        warmup_s=sc.warmup_s,
        turns_per_session=sc.turns,
        fast=fast,
    )


def digest(res: VirtualRunResult) -> str:
    """A hash of every field of the result: floats by their exact repr, the TTFT list in full, the step count."""
    fields = {f.name: getattr(res, f.name) for f in dataclasses.fields(res)}
    return hashlib.sha256(repr(sorted(fields.items())).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=[s.name for s in SCENARIOS], action="append")
    parser.add_argument("--exact", action="store_true", help="step by step, without the decode fast path")
    parser.add_argument("--profile", action="store_true", help="print a cProfile summary of each run")
    args = parser.parse_args()
    chosen = [s for s in SCENARIOS if not args.scenario or s.name in args.scenario]
    print(f"KV pool: {poolkernel.describe(poolkernel.load())}", flush=True)
    for sc in chosen:
        prof = sc.profile()
        profiler = cProfile.Profile() if args.profile else None
        t0, c0 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        res = run(sc, fast=not args.exact)
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"{sc.name:12s} {prof.name} pool {prof.pool_tokens:,} tokens, {sc.sessions} sessions: "
            f"{res.end_s:,.0f} virtual s in {wall:.2f} wall s = {res.end_s / wall:,.0f}x real time "
            f"({cpu:.2f} CPU s = {res.end_s / cpu:,.0f}x); "
            f"{res.wall_events:,} steps ({res.wall_events / wall:,.0f}/s), {res.turns_completed:,} turns; "
            f"output {res.output_tps:,.1f} tok/s, prefill {res.prefill_tps:,.0f} tok/s, "
            f"hit {res.prefix_hit_rate:.3f}, preemptions {res.preemptions}, running {res.mean_running:.1f}; "
            f"digest {digest(res)}",
            flush=True,
        )
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
