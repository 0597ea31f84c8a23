"""A trained model's knee on a real llama-server, and the calibrated simulator's knee for the same search.

Design: against a llama-server already serving SmolLM2-135M-Instruct (``scripts/llamacpp-tier/setup.sh smollm2``
prints the binary and the GGUF; start it with SLOTS slots, ``-np SLOTS -c SLOTS×SLOT_CONTEXT --metrics --slots
--cache-ram 0 -t 1``, as scripts/llamacpp-tier/README.md shows with the reason for one thread), this runs
``agentload probe``, then ``agentload bench --find-knee`` with held sessions (``agentic-hold``) at one context small
enough that the pool (SLOTS × SLOT_CONTEXT) holds more sessions than there are slots, so the slots give out first.
Bench pins each agent to slot agent mod SLOTS (``id_slot``): past the slot count two agents share a slot, a turn
waits for it (``llamacpp:requests_deferred``) and finds the other agent's prompt there. The search uses the
llama.cpp tier's knee tolerance (tests/integration/test_llamacpp_knee.py): ``--tolerance 0.25``, since the slot
cliff is a fall of more than half while two busy cores make neighbouring levels differ by more than the default
10 %. The script prints the knee, the cause bench gives, the slot count and pool ÷ realised context, and every level
with its mean running and waiting requests. Then ``agentload calibrate`` fits a profile to the same server (slot
mode: ``slots = SLOTS``), and ``bench --sim PROFILE`` runs the same knee search (same arguments, same words:
``--same-text``) in virtual time, against the simulator ``agentload sim --profile PROFILE`` would serve; the script
prints both knees and, per level both searches measured, simulated ÷ real agent-turns/s and output tok/s, and
whether each lies within ±10 %. Each command runs as a user runs it (``python -m agentload``, JSON results read back
from its run directory), so the figures are the CLI's.

    python benchmarks/smollm2_llama.py --url http://127.0.0.1:8081 --model smollm2-135m-instruct

A real search is up to 2.5 minutes per level (half of ``--warmup``, then up to ``--window``), calibrate about six
more on a busy machine; ``--max-agents`` bounds the ladder.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from agentload.bench.results import LevelSummary, RunResult
from smollm2_vllm import agentload, compare, knee_search, level_line  # benchmarks run as plain scripts


def slot_line(lv: LevelSummary) -> str:
    """A level as the vLLM benchmark prints it, plus what shows a slot server's queue: requests running and waiting."""
    return f"{level_line(lv)}  running {lv.mean_running or 0:.2f}  waiting {lv.mean_waiting or 0:.2f}"


def show(label: str, run: RunResult, seconds: float, pool: int | None) -> None:
    """The knee, its cause and the estimate beside it; ``pool`` is probe's (slots × per-slot context), since a slot
    server's estimate carries the slot count rather than a pool."""
    knee = run.knee[0]
    capacity = run.capacity[0]
    ratio = "-" if knee.measured_over_predicted is None else f"{knee.measured_over_predicted:.2f}"
    per_context = "?" if not pool else f"{pool / capacity.context:.2f}"
    print(
        f"{label}: knee {knee.agents} agents (past at {knee.past_at}, decided by {knee.decided_by or '-'}, cause "
        f"{knee.explanation.cause}); estimate {capacity.sessions} sessions: slots {capacity.slots}, pool {pool} ÷ "
        f"realised context {capacity.context} = {per_context}; measured ÷ predicted {ratio}; pinned "
        f"{run.settings.get('pin_slots')}; {seconds:.0f} s wall\n  why: {knee.explanation.summary}"
    )
    for lv in sorted(run.levels, key=lambda lv: lv.agents):
        print(slot_line(lv))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True, help="the served model name (llama-server's -a)")
    parser.add_argument("--context", type=int, default=1024, help="held context per agent, server tokens")
    parser.add_argument("--max-agents", type=int, default=6, help="the ladder 1, 2, 4 brackets 3 slots")
    # A search level warms up for half of --warmup, and every agent's opening prefill (the whole context, ~1,000
    # tokens) must end within it: on a busy core SmolLM2 prefills 25-130 tokens/s, so four agents take ~80 s. A
    # shorter warm-up cuts those turns at the window's start and their agents' new sessions prefill inside the
    # window, which lowers the hit rate within the slots and puts the knee at 1 (seen with 30 s).
    parser.add_argument("--warmup", default="180s")
    parser.add_argument("--window", default="60s", help="each level's cap (a level ends sooner with enough turns)")
    parser.add_argument("--min-turns", type=int, default=8)
    parser.add_argument("--tolerance", default="0.25", help="the knee rule's tolerance, as the llama.cpp tier's")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs and the profile here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="smollm2-llama-"))
    out.mkdir(parents=True, exist_ok=True)

    probe: dict[str, Any] = json.loads(agentload("probe", args.url, "--json"))
    pool, slots = probe.get("pool_tokens"), probe.get("parallel_slots")
    print(f"server: {probe.get('engine')} {probe.get('version')}, model {probe.get('model')}, {slots} slots × "
          f"{probe.get('max_context')} tokens, pool {pool} tokens; pool ÷ context "
          f"{pool / args.context if pool else '?'}")  # fmt: skip
    search = ["--workload", "agentic-hold", "--context", str(args.context), "--warmup", args.warmup,
              "--window", args.window, "--min-turns", str(args.min_turns), "--tolerance", args.tolerance,
              "--same-text", "--max-agents", str(args.max_agents)]  # fmt: skip
    real, seconds = knee_search(out / "real", ["--url", args.url, "--model", args.model], search)
    show("real", real, seconds, pool)

    profile = out / "profile.toml"
    began = time.monotonic()
    # The largest batch is the slot count: llama-server runs no more requests at once than it has slots.
    agentload("calibrate", "--url", args.url, "--model", args.model, "-o", str(profile), "--repeats", "2",
              "--max-batch", str(slots or 1))  # fmt: skip
    print(f"calibrated in {time.monotonic() - began:.0f} s: {profile}")
    sim, seconds = knee_search(out / "sim", ["--sim", str(profile)], search)
    show("simulated", sim, seconds, pool)
    compare(real, sim)
    print(f"runs and profile: {out}")


if __name__ == "__main__":
    main()
