"""The planner's knee against bench's on the same deployment and the same workload, in virtual time.

Design: ``agentload plan`` simulates its throughput curve with its own agent (held at the context, fixed replies and
think time) on the profile it plans (``capacity.planner.planned_profile``: its pool, its ``--max-num-seqs``); bench,
run by default, uses the ``agentic-hold`` workload on a built-in profile. The two knees differ for those reasons
alone unless the workload and profile are made the same, which this script does: it builds the plan, then runs
bench on the planned profile with ``agentic-hold`` given the plan's agent (``sim.curve.held_agent_options``), as a
knee search and, with ``--sweep``, at the plan's own curve counts (``plan``) or counts of your choice with full
windows, and prints the knees with their levels. Everything runs in virtual time in this process, so the figures
do not depend on the machine's load (only the wall time does).

    python benchmarks/plan_vs_bench.py                       # qwen3-235b on a GB300 with a 200 GiB CPU tier
    python benchmarks/plan_vs_bench.py --offload-gib 0       # the same without the tier
    python benchmarks/plan_vs_bench.py --sweep plan          # also a sweep at the plan's counts, full windows
"""

from __future__ import annotations

import argparse
import time

from agentload.bench.orchestrate import BenchPlan, Mode, run_bench
from agentload.bench.results import RunResult
from agentload.bench.target import Target
from agentload.capacity.planner import PlanSpec, plan, planned_profile
from agentload.capacity.profile import ServingProfile
from agentload.clock import run_virtual
from agentload.sim.agentmodel import AgentBehaviour
from agentload.sim.curve import add_throughput_curve, held_agent_options
from agentload.sim.inprocess import InProcessTransport
from agentload.sim.server import SimConfig, SimServer
from agentload.workload.agentic import AgenticWorkload


def target(profile: ServingProfile) -> Target:
    server = SimServer(SimConfig(profile=profile, behaviour=AgentBehaviour()))
    return Target(InProcessTransport(server), "http://sim.invalid", server.model_name, f"sim:{profile.name}",
                  virtual=True, profile=profile, engine="agentload-sim")  # fmt: skip


def bench(profile: ServingProfile, workload: AgenticWorkload, context: int, mode: Mode, agents: list[int]) -> RunResult:
    spec = BenchPlan(make_target=lambda: target(profile), workload=workload, contexts=[context], mode=mode,
                     agents=agents)  # fmt: skip
    result: RunResult = run_virtual(run_bench(spec))[0]
    return result


def show(label: str, result: RunResult, seconds: float) -> None:
    knee = result.knee[0]
    print(f"bench {label}: knee {knee.agents} (first past {knee.past_at}, {knee.bound}; decided by "
          f"{knee.decided_by or '-'}) in {seconds:.0f} s wall")  # fmt: skip
    for s in sorted(result.levels, key=lambda s: s.agents):
        print(f"  {s.agents:5d} agents  {s.output_tps:7.0f} tok/s  TTFT p50 {s.ttft_s.p50 or 0:7.2f} s  "
              f"turns {s.turns:5d}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-235b-a22b")
    ap.add_argument("--gpu", default="dgx-station-gb300")
    ap.add_argument("--weight-dtype", default="fp4")
    ap.add_argument("--kv-cache-dtype", default="fp8")
    ap.add_argument("--max-model-len", type=int, default=40_960)
    ap.add_argument("--pool-tokens", type=int, default=997_753)
    ap.add_argument("--offload-gib", type=float, default=200.0)
    ap.add_argument(
        "--sweep", default="", help="also bench with full windows: 'plan' (the plan's curve counts) or counts"
    )
    args = ap.parse_args()
    spec = PlanSpec(model=args.model, gpu=args.gpu, weight_dtype=args.weight_dtype, kv_cache_dtype=args.kv_cache_dtype,
                    max_model_len=args.max_model_len, pool_tokens=args.pool_tokens,
                    offload_gib=args.offload_gib)  # fmt: skip
    start = time.perf_counter()
    planned = add_throughput_curve(plan(spec))
    curve = planned.curve
    assert curve is not None
    print(f"plan: knee {curve.knee} (first past {curve.first_past_knee}) in {time.perf_counter() - start:.0f} s wall")
    for p in curve.points:
        print(f"  {p.agents:5d} agents  {p.output_tps:7.0f} tok/s  TTFT p50 {p.ttft_p50_s or 0:7.2f} s")
    context = planned.agents.context
    workload = AgenticWorkload("hold", shape_options=held_agent_options(context, planned.spec.agent))
    profile = planned_profile(planned)
    start = time.perf_counter()
    show("--find-knee", bench(profile, workload, context, "find-knee", []), time.perf_counter() - start)
    if args.sweep:
        plans = args.sweep == "plan"
        counts = [p.agents for p in curve.points] if plans else sorted({int(c) for c in args.sweep.split(",")})
        label = "--sweep (the plan's counts)" if plans else f"--sweep {args.sweep}"
        start = time.perf_counter()
        show(label, bench(profile, workload, context, "sweep", counts), time.perf_counter() - start)


if __name__ == "__main__":
    main()
