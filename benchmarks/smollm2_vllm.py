"""A trained model's knee on real vLLM-CPU, and the calibrated simulator's knee for the same search.

Design: against a vLLM server already serving SmolLM2-135M-Instruct (``scripts/vllm-tier/setup.sh smollm2``, then
``serve.sh start`` with ``AGENTLOAD_VLLM_MODEL_DIR=$tier/model-smollm2``; its README shows the commands), this runs
``agentload bench --find-knee`` with held sessions (``agentic-hold``) at one context, on a pool small enough that the
KV pool gives out before compute does, and prints the knee against pool ÷ realised context, bench's own
measured ÷ predicted, and every level. Then ``agentload calibrate`` fits a profile to the same server, and ``bench
--sim PROFILE`` runs the same knee search (same arguments, same words: ``--same-text``) in virtual time; the script
prints both knees and, per level both searches measured, simulated ÷ real agent-turns/s and output tok/s, and
whether each lies within ±10 %. Each command runs as a user runs it (``python -m agentload``, JSON results read
back from its run directory), so the figures are the CLI's.

    python benchmarks/smollm2_vllm.py --url http://127.0.0.1:8000 --model smollm2-135m-instruct --context 2048

A real search is minutes per level on two cores; ``--window`` and ``--max-agents`` bound it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentload.bench.results import LevelSummary, RunResult

TOLERANCE = 0.10


def agentload(*args: str) -> str:
    """Run ``agentload ARGS`` in a process of its own; its stdout (stops the script on a failure)."""
    done = subprocess.run([sys.executable, "-m", "agentload", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"agentload {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def knee_search(out: Path, target: list[str], search: list[str]) -> tuple[RunResult, float]:
    began = time.monotonic()
    agentload("bench", *target, *search, "--find-knee", "--json", "--out", str(out))
    (result,) = out.glob("*/result.json")
    return RunResult.model_validate_json(result.read_text()), time.monotonic() - began


def level_line(lv: LevelSummary) -> str:
    return (
        f"  {lv.agents:3d} agents  {lv.turns:4d} turns  {lv.turns / lv.window_s if lv.window_s else 0:6.3f} turns/s  "
        f"{lv.output_tps:7.1f} tok/s  hit {lv.prefix_hit_rate_server or 0:.3f} server / "
        f"{lv.prefix_hit_rate_usage or 0:.3f} usage  context {lv.context_mean or 0:6.0f}  "
        f"TTFT p50 {lv.ttft_s.p50 or 0:6.2f} s  preemptions {lv.preemptions or 0:.0f}"
    )


def show(label: str, run: RunResult, seconds: float) -> None:
    knee = run.knee[0]
    capacity = run.capacity[0]
    ratio = "-" if knee.measured_over_predicted is None else f"{knee.measured_over_predicted:.2f}"
    print(
        f"{label}: knee {knee.agents} agents (past at {knee.past_at}, decided by {knee.decided_by or '-'}, cause "
        f"{knee.explanation.cause}); pool ÷ realised context {capacity.sessions} (context {capacity.context}); "
        f"measured ÷ predicted {ratio}; {seconds:.0f} s wall"
    )
    for lv in sorted(run.levels, key=lambda lv: lv.agents):
        print(level_line(lv))


def within(ratio: float) -> str:
    return "ok" if abs(ratio - 1) <= TOLERANCE else "MISS"


def compare(real: RunResult, sim: RunResult) -> None:
    knee_real, knee_sim = real.knee[0].agents, sim.knee[0].agents
    print(f"knee: real {knee_real}, simulated {knee_sim} ({within(knee_sim / knee_real)} at ±{TOLERANCE:.0%})")
    real_by, sim_by = {lv.agents: lv for lv in real.levels}, {lv.agents: lv for lv in sim.levels}
    for n in sorted(set(real_by) & set(sim_by)):
        r, s = real_by[n], sim_by[n]
        if r.turns == 0 or r.output_tps <= 0:
            print(f"  {n:3d} agents  the real level served nothing")
            continue
        turns = (s.turns / s.window_s) / (r.turns / r.window_s)
        tps = s.output_tps / r.output_tps
        print(f"  {n:3d} agents  sim ÷ real turns/s {turns:5.2f} ({within(turns)})  output tok/s {tps:5.2f} "
              f"({within(tps)})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--context", type=int, default=2048, help="held context per agent, server tokens")
    parser.add_argument("--max-agents", type=int, default=8)
    parser.add_argument("--warmup", default="20s")
    parser.add_argument("--window", default="90s", help="each level's cap (a level ends sooner with enough turns)")
    parser.add_argument("--min-turns", type=int, default=12)
    parser.add_argument("--max-batch", type=int, default=4, help="calibrate's largest batch")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs and the profile here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="smollm2-vllm-"))
    out.mkdir(parents=True, exist_ok=True)

    probe: dict[str, Any] = json.loads(agentload("probe", args.url, "--json"))
    pool = probe.get("pool_tokens")
    print(f"server: {probe.get('engine')} {probe.get('version')}, model {probe.get('model')}, pool {pool} tokens, "
          f"max context {probe.get('max_context')}; pool ÷ context {pool / args.context if pool else '?'}")  # fmt: skip
    search = ["--workload", "agentic-hold", "--context", str(args.context), "--warmup", args.warmup,
              "--window", args.window, "--min-turns", str(args.min_turns), "--same-text",
              "--max-agents", str(args.max_agents)]  # fmt: skip
    real, seconds = knee_search(out / "real", ["--url", args.url, "--model", args.model], search)
    show("real", real, seconds)

    profile = out / "profile.toml"
    began = time.monotonic()
    agentload("calibrate", "--url", args.url, "--model", args.model, "-o", str(profile), "--repeats", "2",
              "--max-batch", str(args.max_batch))  # fmt: skip
    print(f"calibrated in {time.monotonic() - began:.0f} s: {profile}")
    sim, seconds = knee_search(out / "sim", ["--sim", str(profile)], search)
    show("simulated", sim, seconds)
    compare(real, sim)
    print(f"runs and profile: {out}")


if __name__ == "__main__":
    main()
