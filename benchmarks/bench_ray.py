"""How many concurrent streams one process carries against two Ray actors, and what the Ray driver costs.

**Streams carried.** The simulated server runs in its own process with ``--stamp-chunks`` (every token's text is
the server's CLOCK_MONOTONIC time when it was written) on a profile whose every step takes ``1 / --per-stream``
seconds, so each stream gets ``--per-stream`` chunks a second and every stream's chunk of a step is written in one
burst. The client — agentload's ``ChatClient`` — keeps N streams open for ``--seconds``: in this process (local),
or split over Ray async actors (``--workers``), each with its own client on its own event loop. Lag is arrival −
the server's stamp, over the run less its first second. ``--stamps select`` (the default) stamps a chunk when the
event loop's select saw its socket ready, so the lag includes the client's own queue: how long a burst waits for
the client to get to it (and, on a machine with fewer cores than busy processes, for the scheduler).
``--stamps kernel`` uses the kernel's receive stamps, as agentload's records do on Linux: the records' timing stays
true while the client is behind, and the lag is the kernel's delivery. A count is carried when the lag p99 is at
most ``--max-lag-ms`` (10) and no request failed; each row also shows the chunks received a second against what
the streams were asked for (N × per-stream), and the server's CPU (when it nears 100 %, the server sets the pace).

**The driver's CPU.** Then one real ``bench`` level (``bench.runner.run_level``), in one process and with a
``RayCluster`` of ``LevelWorker``s: with Ray the agents run on the actors and this process — the driver — pulls
their records every 0.5 s, writes them to a run directory and samples the server. CPU time of this process over the
level ÷ the records it received. **A fleet's driver** (``--skip fleet`` to leave it out): ``agentload run`` at
``--agents`` wide, in one process and with ``--executor ray`` (the agents, limiter and log in this process, the
streams on the actors), for two kinds of turn — ``--agents`` agents × ``--rounds`` tool-calling rounds (short
replies), and 4 × ``--agents`` agents × one ``--reply-tokens`` reply: CPU time of this process (Ray's import left
out, its start-up in) ÷ the turns committed.

Ray binds the machine's address, so the script re-runs itself in a namespace that has only loopback (``unshare``,
with its own PID namespace so nothing Ray starts outlives it), as the tests do; ``--in-place`` runs it as it is.

    .venv/bin/python benchmarks/bench_ray.py [--streams 1000,2000,3000,4000] [--per-stream 2] [--seconds 12]

Measured 4 December 2026 on this 2-core machine (server, driver and actors sharing both cores), 2 chunks/s a
stream: kernel stamps, lag p99 0.03 ms at 1,000-4,000 streams for one process and two actors alike (both carry
4,000); select stamps, lag p99 10.4 / 24.2 / 51.8 / 388 ms (one process) and 27.0 / 135.9 / 28.3 / 77.0 ms (two
actors) at 1,000 / 2,000 / 3,000 / 4,000: neither carries 1,000 by that measure here, and two actors are not
better. Driver: 156 ms of CPU per 1,000 records (256 agents, 2,362 records) against 899 ms for one process
running the agents.

Fleet arm, same machine and day (``--skip carried --skip driver --agents 256 --rounds 8 --reply-tokens 256``):
tool turns (5 tokens a reply), 500 ms of CPU per 1,000 turns in one process against 796 ms for the driver with two
actors — a Ray call costs the driver more than so short a stream; 256-token replies, 3,470 ms against 1,184 ms
(2.9× less). Wall clock 6.7 / 13.6 s and 21.7 / 28.4 s: Ray's start-up (~6 s) is in the Ray figures, and on two
shared cores the actors compete with the simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from agentload.endpoint import transport as transport_module
from agentload.endpoint.client import ChatClient
from agentload.load.cluster import ACTOR_ENV
from simproc import cpu_seconds, fast_profile, sim_process

# A user, network, PID and mount namespace: only loopback (brought up inside), and every process Ray starts in it
# ends with it (its first process is the namespace's init), whatever happens to the run.
NAMESPACE = ("unshare", "-rn", "--pid", "--fork", "--mount-proc")
REQUEST_S = 8.0  # each request streams this long: streams stay open, few requests start and end in a run
SETTLE_S = 1.0  # the first second (connections opening, first prefills) is left out of the figures


async def _streams(url: str, streams: int, seconds: float, tokens: int) -> Result:
    """Every chunk's (arrival, lag), failed requests and CPU seconds of ``streams`` streams for ``seconds``."""
    client = ChatClient(url, api_key_env=None)
    arrivals: list[float] = []
    lags: list[float] = []
    failed = 0
    stop_at = time.monotonic() + seconds
    body = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": tokens}

    async def one() -> None:
        nonlocal failed
        while time.monotonic() < stop_at:
            r = await client.chat(body)
            if not r.ok:
                failed += 1
                continue
            # Each request's first token waits for its admission and prefill: not the client's lag.
            pairs = list(zip(r.content.split(), r.chunk_times, strict=False))[1:]
            arrivals.extend(arrived for _, arrived in pairs)
            lags.extend(arrived - float(sent) for sent, arrived in pairs)

    cpu0 = time.process_time()
    await asyncio.gather(*(one() for _ in range(streams)))
    cpu = time.process_time() - cpu0
    await client.aclose()
    return np.asarray(arrivals), np.asarray(lags) * 1e3, failed, cpu


Result = tuple[np.ndarray, np.ndarray, int, float]


def run_streams(url: str, streams: int, seconds: float, tokens: int, select: bool) -> Result:
    transport_module._KERNEL_STAMPS = not select and transport_module._KERNEL_STAMPS
    return asyncio.run(_streams(url, streams, seconds, tokens))


class StreamActor:
    """A Ray async actor that runs its share of the streams with its own client."""

    def __init__(self, select: bool) -> None:
        transport_module._KERNEL_STAMPS = not select and transport_module._KERNEL_STAMPS

    async def run(self, url: str, streams: int, seconds: float, tokens: int) -> Result:
        return await _streams(url, streams, seconds, tokens)


def line(name: str, streams: int, per_stream: float, result: Result, t0: float, seconds: float,
         max_lag: float, server: float) -> bool:  # fmt: skip
    """One row; True when the count was carried. Figures over the run less its first second and its tail."""
    arrivals, lags, failed, cpu = result
    lo, hi = t0 + SETTLE_S, t0 + seconds
    inside = (arrivals >= lo) & (arrivals < hi)
    rate = int(inside.sum()) / (hi - lo)
    asked = streams * per_stream
    p50, p99 = np.percentile(lags[inside], (50, 99)) if inside.any() else (float("nan"), float("nan"))
    ok = bool(p99 <= max_lag and failed == 0)
    per_chunk = 1e6 * cpu / max(len(arrivals), 1)
    print(f"{name:>8} {streams:>8,} {rate:>10,.0f} {asked:>10,.0f} {p50:>8.2f} {p99:>9.2f} {per_chunk:>10.1f} "
          f"{100 * server:>7.0f}% {failed:>6}  {'yes' if ok else 'no'}")  # fmt: skip
    return ok


def carried(args: argparse.Namespace) -> None:
    import ray

    counts = [int(s) for s in args.streams.split(",")]
    select = args.stamps == "select"
    print(f"streams carried: {args.per_stream:g} chunks/s a stream, {args.seconds:g} s, {args.stamps} stamps, "
          f"carried: lag p99 <= {args.max_lag_ms:g} ms, no request failed")  # fmt: skip
    print(f"{'client':>8} {'streams':>8} {'chunks/s':>10} {'asked':>10} {'lag p50':>8} {'lag p99':>9} "
          f"{'µs/chunk':>10} {'server':>8} {'failed':>6}  carried")  # fmt: skip
    ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, configure_logging=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(StreamActor)
    actors = [remote.options(runtime_env=ACTOR_ENV).remote(select) for _ in range(args.workers)]
    best = {"local": 0, "ray": 0}
    tokens = max(2, round(args.per_stream * REQUEST_S))
    for n in counts:
        for name in ("local", "ray"):
            # No core pinning: the server, this process and the actors all get what the scheduler gives them.
            with sim_process(fast_profile(1.0 / args.per_stream), "--stamp-chunks", pin=False) as (srv, host, port):
                url = f"http://{host}:{port}"
                t0, srv0 = time.monotonic(), cpu_seconds(srv.pid)
                if name == "local":
                    result = run_streams(url, n, args.seconds, tokens, select)
                else:
                    shares = [n // args.workers + (1 if i < n % args.workers else 0) for i in range(args.workers)]
                    calls = [a.run.remote(url, k, args.seconds, tokens)  # type: ignore[attr-defined]  # a Ray handle
                             for a, k in zip(actors, shares, strict=True)]  # fmt: skip
                    parts = ray.get(calls)
                    result = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                              sum(p[2] for p in parts), sum(p[3] for p in parts))  # fmt: skip
                server = (cpu_seconds(srv.pid) - srv0) / (time.monotonic() - t0)
            if line(name, n, args.per_stream, result, t0, args.seconds, args.max_lag_ms, server):
                best[name] = max(best[name], n)
    print(f"most streams carried: one process {best['local']:,}, {args.workers} Ray actors {best['ray']:,}")
    for a in actors:
        ray.kill(a)  # type: ignore[arg-type]  # an actor handle


def driver_cost(args: argparse.Namespace) -> None:
    from agentload.bench.distributed import LevelWorker
    from agentload.bench.runner import run_level
    from agentload.bench.target import Target, http_target
    from agentload.clock import LoopClock
    from agentload.endpoint.transport import Endpoint
    from agentload.load.cluster import ExecutorSpec, RayCluster
    from agentload.store.rundir import RunWriter
    from agentload.store.runstore import RunStore
    from agentload.workload.agentic import AgenticWorkload

    for name in ("local", "ray"):
        with sim_process(fast_profile(0.05), pin=False) as (_, host, port), tempfile.TemporaryDirectory() as tmp:
            url = f"http://{host}:{port}"
            target = http_target(url, "qwen2.5-0.5b", "agentload-sim")
            cluster = None
            if name == "ray":
                cluster = RayCluster(ExecutorSpec("ray", workers=args.workers))
                cluster.start(LevelWorker, Endpoint(url, None))
            writer = RunStore(Path(tmp)).create()

            async def level(cluster: RayCluster | None, target: Target, writer: RunWriter) -> tuple[int, float, float]:
                if cluster is not None:
                    await cluster.measure_offsets()
                cpu0, t0 = time.process_time(), time.monotonic()
                data = await run_level(target, AgenticWorkload("hold"), agents=args.agents, context=2048, level=0,
                                       run_id=writer.run_id, run_t0=LoopClock().now(), warmup_s=2.0,
                                       window_s=args.seconds, min_window_s=args.seconds, sink=writer.record,
                                       cluster=cluster)  # fmt: skip
                await target.transport.aclose()
                return len(data.records), time.process_time() - cpu0, time.monotonic() - t0

            records, cpu, wall = asyncio.run(level(cluster, target, writer))
            writer.close()
            if cluster is not None:
                cluster.close()
        who = "one process (agents and all)" if name == "local" else f"the driver ({args.workers} actors run agents)"
        print(f"{who}: {records:,} records of {args.agents} agents in {wall:.1f} s, {cpu:.2f} CPU s: "
              f"{1e3 * cpu / max(records, 1) * 1e3:.0f} ms of CPU per 1,000 records")  # fmt: skip


# Two kinds of turn: an agent's tool calls (short replies, many rounds: the simulator's agent behaviour), and long
# replies with no tools (one round each: its filler behaviour), where the stream is most of a turn's client work.
TOOL_TURNS = """
[defaults]
tools = ["search"]
tool_choice = "required"
max_rounds = {rounds}
max_tokens = 32
think_time_s = 0.5
context_tokens = 1024
tool_result_tokens = 64

[[tasks]]
id = "w"
prompt = "Work item {{replica}}."
count = {agents}
"""
LONG_REPLIES = """
[defaults]
tools = []
max_rounds = 1
max_tokens = {tokens}
context_tokens = 1024

[[tasks]]
id = "w"
prompt = "Write item {{replica}} out in full."
count = {agents}
"""


def fleet_cost(args: argparse.Namespace) -> None:
    from agentload.fleet.app import FleetApp, FleetSettings
    from agentload.fleet.limiter import Mode
    from agentload.load.cluster import ExecutorSpec, require_ray

    require_ray()  # imported before the clock starts: its import is not the run's cost
    kinds = (
        ("tool turns", TOOL_TURNS.format(rounds=args.rounds, agents=args.agents), "agent", args.agents),
        (f"{args.reply_tokens}-token replies", LONG_REPLIES.format(tokens=args.reply_tokens, agents=4 * args.agents),
         "filler", args.agents),
    )  # fmt: skip
    for kind, fleet, behaviour, width in kinds:
        for name in ("local", "ray"):
            with sim_process(fast_profile(0.02), "--behaviour", behaviour, pin=False) as (_, host, port), \
                    tempfile.TemporaryDirectory() as tmp:  # fmt: skip
                spec = Path(tmp) / "fleet.toml"
                spec.write_text(fleet)
                executor = ExecutorSpec("ray", workers=args.workers) if name == "ray" else ExecutorSpec()
                opts = FleetApp(FleetSettings(fleet=spec, url=f"http://{host}:{port}", mode=Mode.PARALLEL, width=width,
                                  out=Path(tmp) / "runs", progress="none", executor=executor))  # fmt: skip
                cpu0, t0 = time.process_time(), time.monotonic()
                result = asyncio.run(opts.run())
                cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
            t = result.totals
            who = "one process (agents and streams)" if name == "local" else f"the driver ({args.workers} actors)"
            print(f"fleet of {kind}, {who}: {t.turns:,} turns ({t.completion_tokens:,} tokens) of {t.agents} agents "
                  f"({t.done} done) in {wall:.1f} s, {cpu:.2f} CPU s: {1e3 * cpu / max(t.turns, 1) * 1e3:.0f} ms of "
                  "CPU per 1,000 turns")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="1000,2000,3000,4000")
    ap.add_argument("--per-stream", type=float, default=2.0, help="chunks a second each stream gets")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--stamps", choices=("select", "kernel"), default="select")
    ap.add_argument("--max-lag-ms", type=float, default=10.0)
    ap.add_argument("--agents", type=int, default=256, help="agents of the driver-cost level")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of each agent of the fleet arm")
    ap.add_argument("--reply-tokens", type=int, default=256, help="tokens of each reply of the fleet arm")
    ap.add_argument("--skip", choices=("carried", "driver", "fleet"), action="append", default=[])
    ap.add_argument("--in-place", action="store_true", help="do not re-run in a loopback-only network namespace")
    args = ap.parse_args()
    if not args.in_place and os.environ.get("AGENTLOAD_NETNS") != "1":
        cmd = f"ip link set lo up && exec {sys.executable} {' '.join(map(_quote, sys.argv))}"
        env = {**os.environ, "AGENTLOAD_NETNS": "1", "RAY_DISABLE_USAGE_STATS": "1"}
        raise SystemExit(subprocess.run([*NAMESPACE, "bash", "-c", cmd], env=env).returncode)
    if "carried" not in args.skip:
        carried(args)
    if "driver" not in args.skip:
        driver_cost(args)
    if "fleet" not in args.skip:
        fleet_cost(args)


def _quote(s: str) -> str:
    return shlex.quote(s)


if __name__ == "__main__":
    main()
