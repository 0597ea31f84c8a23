"""Trace replay pacing at scale: how late a conversation trace's turns go out against the times the trace gives them.

Design. A synthetic conversation trace in the published Claude Code format (``workload/conversation_trace.py``) of
``--sessions`` conversations (10,000 by default), each ``--turns`` small requests (a few 64-token blocks, 2 output
tokens, so the server is never the bottleneck) with think times drawn uniformly from 0.5-1.5 × ``--think``, is
written to a temporary file and read back through ``trace:FILE`` as bench reads it. One process replays it at
``--time-scale`` with ``--agents`` closed-loop agents through the bench's runner (``load.runner.run_load``) and
client (``endpoint.client.ChatClient``, real time, HTTP), each agent replaying its share of the sessions (the
k-th session drawn is conversation k, so every conversation is replayed once), against the simulator in a process
of its own (``benchmarks/simproc.py``: a step of 0.1 ms, pinned to the other core when there are two).

What is measured. For every turn after a session's first, its **start-time error**: the time its request was sent
(its record's ``t_sent``) minus the time the trace schedules it, the previous reply's end (``t_done``) plus the
turn's recorded ``think_time`` times ``--time-scale``. That is the replay's own lateness: the event loop's lag
behind the wait, building the prompt and the client's path to the socket. A session's first turn has no
recorded time (a tree starts when its agent draws it) and is left out. Printed: p50 / p95 / p99 / max of the
error, the turns measured, the sessions, failures, and the wall time. Goal: p99 ≤ 10 ms.

    .venv/bin/python benchmarks/trace_pacing.py [--sessions 10000] [--agents 1000] [--turns 5] [--think 20]
        [--time-scale 0.1] [--seed 0]

The figures go into docs/traces.md ("Pacing"), dated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from agentload.clock import LoopClock
from agentload.endpoint.backend import RecordingBackend, SingleAttemptBackend
from agentload.endpoint.client import ChatClient
from agentload.endpoint.records import RequestIds
from agentload.load.runner import run_load
from agentload.workload.base import AgentDriver
from agentload.workload.conversation_trace import ConversationTraceWorkload
from agentload.workload.registry import get_workload
from agentload.workload.sizing import SIMULATOR_SIZING, TokenSizing
from simproc import cpu_seconds, fast_profile, sim_process

BLOCK = 64
MODEL = "bench-fast"  # simproc's fast profile, which the simulator serves under its name


def synthetic_trace(sessions: int, turns: int, think_s: float, seed: int) -> list[dict[str, Any]]:
    """Conversations whose request j repeats request j - 1's blocks and adds one, each ``think_time`` after the
    previous reply (uniform over 0.5-1.5 × ``think_s``)."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for i in range(sessions):
        thinks = rng.uniform(0.5 * think_s, 1.5 * think_s, turns)
        requests, t = [], 0.0
        for j in range(turns):
            think = 0.0 if j == 0 else float(thinks[j])
            t += think
            ids = [i * (turns + 1) + b for b in range(j + 1)]
            requests.append({"t": round(t, 3), "type": "s", "in": len(ids) * BLOCK + 16, "out": 2, "hash_ids": ids,
                             "think_time": round(think, 3)})  # fmt: skip
        out.append({"id": f"s{i}", "block_size": BLOCK, "requests": requests})
    return out


@dataclass
class _Level:
    """The load's context (``workload.base.LoadContext``): a level that never stops on time; each agent stops by
    its own quota (``_Quota``)."""

    backend: RecordingBackend  # every attempt's record, in .records
    clock: LoopClock = field(default_factory=LoopClock)
    sizing: TokenSizing = SIMULATOR_SIZING
    model: str = MODEL
    run_id: str = "pacing"
    level: int = 0
    done: dict[str, int] = field(default_factory=dict)
    failed: int = 0

    @property
    def text_salt(self) -> str:
        return self.run_id

    def should_stop(self) -> bool:
        return False

    def session_done(self, agent_id: str, *, ok: bool, passed: int | None = None, scored: int | None = None) -> None:
        self.done[agent_id] = self.done.get(agent_id, 0) + 1
        self.failed += not ok

    def reply_clamped(self, ids: RequestIds, drawn: int) -> None:
        return None


@dataclass
class _Quota:
    """One agent's view of the level: it stops once it has replayed its ``quota`` sessions (so the agents replay
    each conversation once between them, and none is cut mid-session)."""

    shared: _Level
    agent_id: str
    quota: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)

    def should_stop(self) -> bool:
        return self.shared.done.get(self.agent_id, 0) >= self.quota


class _Agent:
    def __init__(self, inner: AgentDriver, quota: int) -> None:
        self.inner, self.quota, self.agent_id = inner, quota, inner.agent_id

    async def run(self, ctx: _Level) -> None:
        await self.inner.run(_Quota(ctx, self.inner.agent_id, self.quota))


async def _timer_lateness(out: list[float], period_s: float = 0.01) -> None:
    """How late the loop wakes a sleeper, every ``period_s``: the floor under any turn's error (the loop's timer
    rounding, the other tasks' work ahead of it, and the machine's other processes)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period_s
        await asyncio.sleep(period_s)
        out.append(loop.time() - due)


async def replay(
    url: str, workload: ConversationTraceWorkload, sessions: int, agents: int
) -> tuple[_Level, list[float]]:
    client = ChatClient(url, api_key_env=None)
    late: list[float] = []
    probe = asyncio.create_task(_timer_lateness(late))
    try:
        level = _Level(RecordingBackend(SingleAttemptBackend(client), []))
        drivers = workload.agents(agents, context=0, seed=0)
        quotas = [sessions // agents + (i < sessions % agents) for i in range(agents)]
        outcome = await run_load([_Agent(d, q) for d, q in zip(drivers, quotas, strict=True)], level)
        assert outcome.ended == "done", outcome
        return level, late
    finally:
        probe.cancel()
        await client.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--agents", type=int, default=1_000, help="closed-loop agents replaying the sessions")
    ap.add_argument("--turns", type=int, default=5, help="requests per session")
    ap.add_argument("--think", type=float, default=20.0, help="mean recorded think time, s")
    ap.add_argument("--time-scale", type=float, default=0.1, help="the replay's time_scale")
    ap.add_argument("--step-s", type=float, default=1e-4, help="the simulator's step time")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if min(args.sessions, args.agents, args.turns) < 1 or args.agents > args.sessions or args.think < 0:
        ap.error("--sessions, --agents and --turns must be positive, --agents at most --sessions")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pacing.json"
        path.write_text(json.dumps(synthetic_trace(args.sessions, args.turns, args.think, args.seed)))
        workload = get_workload(f"trace:{path}", time_scale=args.time_scale)
        assert isinstance(workload, ConversationTraceWorkload)
        with sim_process(fast_profile(args.step_s)) as (proc, host, port):
            cpu0, server0, t0 = time.process_time(), cpu_seconds(proc.pid), time.perf_counter()
            level, late = asyncio.run(replay(f"http://{host}:{port}", workload, args.sessions, args.agents))
            wall = time.perf_counter() - t0
            cpu, server_cpu = time.process_time() - cpu0, cpu_seconds(proc.pid) - server0
    records = level.backend.records
    truth = workload.pace(records)
    err = np.asarray(truth.lateness_s if truth else ()) * 1000
    p50, p95, p99 = np.percentile(err, [50, 95, 99]) if err.size else (math.nan,) * 3
    failed = sum(not r.ok for r in records)
    print(f"{args.sessions:,} sessions × {args.turns} turns, {args.agents:,} agents, time_scale {args.time_scale:g}, "
          f"mean think {args.think * args.time_scale:g} s as replayed")  # fmt: skip
    print(
        f"requests {len(records):,} (failed {failed}), sessions done {sum(level.done.values()):,} "
        f"(failed {level.failed}), wall {wall:.1f} s, client CPU {cpu:.1f} s, server CPU {server_cpu:.1f} s"
    )
    print(
        f"turn start error over {err.size:,} paced turns: p50 {p50:.2f} ms, p95 {p95:.2f} ms, p99 {p99:.2f} ms, "
        f"max {err.max() if err.size else math.nan:.2f} ms, min {err.min() if err.size else math.nan:.2f} ms"
    )
    if truth is not None:
        realised, recorded = truth.realised_wait_s, truth.recorded_wait_s
        print(f"think time: realised mean {realised:.4f} s, recorded × time_scale {recorded:.4f} s")
    lat = np.asarray(late) * 1000
    print(f"the loop's timer lateness (a 10 ms sleeper, {lat.size:,} wakes): p50 {np.percentile(lat, 50):.2f} ms, "
          f"p99 {np.percentile(lat, 99):.2f} ms, max {lat.max():.2f} ms")  # fmt: skip
    print(f"p99 ≤ 10 ms: {'met' if p99 <= 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
