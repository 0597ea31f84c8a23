"""Sequential vs auto: the wall clock of the same 64-agent job on the ``laptop`` simulator profile.

The job is ``--agents`` copies of one agent: ``--context`` tokens of unique context, ``--rounds`` tool-calling
turns that each add ~``--result`` tokens, ``--think`` seconds between turns. ``sequential`` runs one agent at a
time (the "safe" default of harnesses that never use a server's concurrency); ``auto`` starts where the probe's
preflight says and lets the limiter find the width. Prints both wall clocks, their ratio, and auto's width.

By default both run on the in-process simulator in simulated time (the same client, agents and limiter on a
``VirtualTimeLoop``: seconds of wall clock). ``--real-time`` runs them over HTTP against two embedded simulators
at once; sequential then takes as long as it says (≈ agents × (rounds × think + prefill)).

    .venv/bin/python benchmarks/bench_fleet_modes.py                       # 64 laptop-knee agents, simulated
    .venv/bin/python benchmarks/bench_fleet_modes.py --real-time --context 3000 --rounds 4 --think 2
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from agentload.clock import run_virtual
from agentload.fleet.app import FleetApp, FleetSettings
from agentload.fleet.limiter import Mode
from agentload.fleet.results import FleetResult

FLEET = """
name = "bench-{agents}"

[defaults]
system = "You are a code-review agent. Use the search tool to read what you need, one query per turn."
tools = ["search"]
tool_choice = "required"
max_rounds = {rounds}
max_tokens = 64
think_time_s = {think}
context_tokens = {context}
tool_result_tokens = {result}

[[tasks]]
id = "review"
prompt = "Review module {{replica}} of the storage service and list its defects."
count = {agents}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--context", type=int, default=7000, help="unique context tokens per agent")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--think", type=float, default=5.0, help="seconds between an agent's turns")
    ap.add_argument("--result", type=int, default=80, help="tokens each tool result adds")
    ap.add_argument("--profile", default="laptop")
    ap.add_argument("--real-time", action="store_true", help="over HTTP on the wall clock (slow: see above)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        fleet = Path(tmp) / "fleet.toml"
        fleet.write_text(
            FLEET.format(
                agents=args.agents, rounds=args.rounds, think=args.think, context=args.context, result=args.result
            )
        )

        def opts(mode: Mode) -> FleetApp:
            return FleetApp(
                FleetSettings(
                    fleet=fleet,
                    mode=mode,
                    out=Path(tmp) / mode.value,
                    profile=args.profile,
                    progress="none",
                    virtual=not args.real_time,
                )
            )

        started = time.monotonic()
        if args.real_time:

            async def both() -> list[FleetResult]:
                return list(await asyncio.gather(opts(Mode.SEQUENTIAL).run(), opts(Mode.AUTO).run()))

            seq, auto = asyncio.run(both())
        else:
            seq = run_virtual(opts(Mode.SEQUENTIAL).run())
            auto = run_virtual(opts(Mode.AUTO).run())
        took = time.monotonic() - started

    clock = "wall clock" if args.real_time else "simulated time"
    print(
        f"\n{args.agents} agents × {args.rounds} rounds, {args.context:,}-token contexts, {args.think:g} s think, "
        f"profile {args.profile} ({clock}; the benchmark took {took:.0f} s)"
    )
    for r in (seq, auto):
        print(
            f"  {r.mode.value:<10} {r.wall_s:8.1f} s  {r.turns_per_s:6.3f} turns/s  "
            f"{r.totals.done}/{r.totals.agents} done  width: started {r.start_width}, "
            f"settled {r.settled_width:.1f}, {len(r.limiter.history)} changes"
        )
    print(f"  sequential ÷ auto wall clock: {seq.wall_s / auto.wall_s:.1f}×")
    print(f"  auto started at {auto.start_width}: {auto.start_reason}")


if __name__ == "__main__":
    main()
