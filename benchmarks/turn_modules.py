"""Which agentload modules one agent turn walks, for `bench`, `suite` and `run`: how much of one path they share.

Each command runs in process against the embedded simulator with one agent, under ``sys.setprofile``. A turn is
the span from one ``ChatClient.chat`` call of the agent's task to its next one: the request, its retries, the
reply's handling, the tools it calls and the pause before the next request. Counted for that span:

* the walk — every agentload module a function of the agent's task runs in, plus the modules on the task's stack
  when the turn starts (the driver and the runner that started it, down to the event loop: what called
  ``asyncio.run`` started the process, not the turn), plus loop callbacks that run outside any task (the
  transport's protocol receiving bytes); split into modules that call on into another agentload module and
  modules that are only called (records, parsers, helpers);
* call-backs — module A calls B and, within the same turn, B (or a module B calls) calls A: a cycle in the
  caller → callee graph of the modules, which is what "no module called back by one it calls" forbids.

The simulator's own modules (``agentload.sim.*``) are the server, not the turn, and are left out — except
``sim/inprocess.py``, the in-process transport that stands in for a socket. The third turn is reported (the first
ones open connections and size tokens); with ``--turn K`` another.

    .venv/bin/python benchmarks/turn_modules.py            # all three commands
    .venv/bin/python benchmarks/turn_modules.py --only bench
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import agentload

PKG = Path(agentload.__file__).resolve().parent
ASYNCIO = str(Path(asyncio.__file__).resolve().parent)
ROOT = Path(__file__).resolve().parent.parent


def module_of(filename: str) -> str | None:
    """``bench/runner`` for a file of the package, None for anything else (the simulator's modules too)."""
    try:
        rel = Path(filename).resolve().relative_to(PKG)
    except ValueError:
        return None
    name = rel.with_suffix("").as_posix()
    if name.startswith("sim/") and name != "sim/inprocess":
        return None
    return name


class TurnTracer:
    """A profile hook that splits each task's execution into turns at its ``ChatClient.chat`` calls."""

    def __init__(self) -> None:
        self.turns: dict[int, int] = defaultdict(lambda: -1)  # task id → index of its current turn
        self.modules: dict[tuple[int, int], set[str]] = defaultdict(set)
        self.edges: dict[tuple[int, int], set[tuple[str, str]]] = defaultdict(set)
        self._chat_frames: set[int] = set()
        self._keep: list[FrameType] = []  # keep traced chat frames alive so their ids stay unique
        self._tasks: list[asyncio.Task[Any]] = []  # likewise for the tasks' ids
        self._mod_cache: dict[str, str | None] = {}

    def _mod(self, filename: str) -> str | None:
        if filename not in self._mod_cache:
            self._mod_cache[filename] = module_of(filename)
        return self._mod_cache[filename]

    def busiest(self) -> tuple[int, int]:
        """The task with the most turns (the agent, not the token-sizing probe), and its turn count."""
        tid = max(self.turns, key=lambda t: self.turns[t])
        return tid, self.turns[tid] + 1

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        mod = self._mod(frame.f_code.co_filename)
        if mod is None:
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        # A new call of the client's ``chat``, not a resumption of its coroutine, starts the task's next turn.
        starts_turn = mod == "endpoint/client" and frame.f_code.co_name == "chat"
        if task is not None and starts_turn and id(frame) not in self._chat_frames:
            self._chat_frames.add(id(frame))
            self._keep.append(frame)
            if id(task) not in self.turns:
                self._tasks.append(task)
            self.turns[id(task)] += 1
            key = (id(task), self.turns[id(task)])
            # The task's stack when the turn starts: the driver and the runner that started it — down to the event
            # loop, not past it (what called ``asyncio.run`` started the process, not this turn).
            f: FrameType | None = frame
            while f is not None and not f.f_code.co_filename.startswith(ASYNCIO):
                m = self._mod(f.f_code.co_filename)
                if m is not None:
                    self.modules[key].add(m)
                f = f.f_back
        if task is None:
            # A loop callback outside any task (the transport's protocol): part of every turn in flight.
            keys = [(tid, n) for tid, n in self.turns.items() if n >= 0]
        elif id(task) in self.turns:
            keys = [(id(task), self.turns[id(task)])]
        else:
            return
        caller = frame.f_back
        cm = self._mod(caller.f_code.co_filename) if caller is not None else None
        for key in keys:
            self.modules[key].add(mod)
            if cm is not None and cm != mod:
                self.edges[key].add((cm, mod))


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        group.append(w)
                        if w == node:
                            break
                    if len(group) > 1:
                        out.append(sorted(group))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter
                counter += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(graph[nxt])))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
    return out


def run_traced(argv: list[str]) -> TurnTracer:
    from typer.testing import CliRunner

    from agentload.cli.main import app

    tracer = TurnTracer()
    runner = CliRunner()
    sys.setprofile(tracer)
    try:
        result = runner.invoke(app, argv, catch_exceptions=True)
    finally:
        sys.setprofile(None)
    if result.exit_code != 0:
        print(result.output[-2000:], file=sys.stderr)
        raise SystemExit(f"agentload {' '.join(argv)} exited {result.exit_code}")
    return tracer


BENCH = ["bench", "--sim", "qwen3-235b-gb300", "--agents", "1", "--warmup", "10s", "--window", "60s", "--json"]
SUITE = ["suite", "--agents", "1", "--tests", "T1,T2,T3,T5", "--json"]
RUN = ["run", str(ROOT / "examples" / "fleet.toml"), "--virtual", "--progress", "none", "--json"]
COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "bench": lambda out: [*BENCH, "--out", str(out)],
    "suite": lambda out: [*SUITE, "--out", str(out)],
    "run": lambda out: [*RUN, "--out", str(out)],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(COMMANDS), action="append")
    ap.add_argument("--turn", type=int, default=2, help="which turn of the agent to report (0-based; default 2)")
    args = ap.parse_args()
    walks: dict[str, set[str]] = {}
    for name in args.only or list(COMMANDS):
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["AGENTLOAD_RUNS"] = tmp
            tracer = run_traced(COMMANDS[name](Path(tmp)))
        tid, count = tracer.busiest()
        if count < 2:
            raise SystemExit(f"{name}: the agent made {count} request(s); a turn needs the next one to end it")
        turn = min(args.turn, count - 2)  # never the last: it runs on into the run's end
        mods = tracer.modules[(tid, turn)]
        edges = tracer.edges[(tid, turn)]
        walks[name] = mods
        loops = cycles(edges)
        leaves = mods - {a for a, _ in edges}
        print(f"{name}: turn {turn} of {count} walks {len(mods)} modules "
              f"({len(mods) - len(leaves)} that call on, {len(leaves)} only called)")  # fmt: skip
        print("  calling: " + ", ".join(sorted(mods - leaves)))
        print("  only called: " + ", ".join(sorted(leaves)))
        if loops:
            for group in loops:
                back = sorted((a, b) for a, b in edges if a in group and b in group)
                print(f"  called back: {' ↔ '.join(group)}  ({'; '.join(f'{a} → {b}' for a, b in back)})")
        else:
            print("  no module is called back by one it calls")
    if len(walks) > 1:
        common = set.intersection(*walks.values())
        print(f"shared by all: {len(common)} modules: {', '.join(sorted(common))}")
        for name, mods in walks.items():
            print(f"  only {name}: {', '.join(sorted(mods - common)) or '-'}")


if __name__ == "__main__":
    main()
