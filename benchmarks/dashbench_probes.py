"""What ``bench_dashboard.py`` measures inside a client process: the dashboard's own CPU timed in place, the cyclic
collector's passes, the event loop's CPU by what it ran, this process's CPU and context switches; and the stretch
of the dashboard's flush schedule a run under callgrind needs. What times code in place patches agentload's classes
or asyncio's, for the benchmark's process only."""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from agentload.dashboard.server import Flusher
from agentload.dashboard.state import LiveState


def process_cpu() -> float:
    """This process's CPU so far: user + system seconds."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def switches() -> tuple[int, int, int]:
    """This process's context switches so far: voluntary (it waited: the event loop slept) and involuntary; and its
    minor page faults (memory the allocator gave back to the kernel and took again faults in page by page)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw, r.ru_nivcsw, r.ru_minflt


@dataclass
class OwnTime:
    """The dashboard's own CPU in a run, timed in place around its code: steadier than the difference of two whole
    runs, whose client CPU moves by up to 14 % between identical runs on a shared machine.

    Timed with ``time.perf_counter`` (a vDSO read, ~50 ns), not ``time.process_time`` (a system call, ~600 ns here):
    the hooks were called ~20,000 times a run, and the CPU clock's own cost, twice a call, was itself a measurable
    part of the "with" arm. The timed code never blocks or awaits, so its wall time is its CPU time but for the
    moments the OS gives its core to another process (which only overstates the share).

    ``state``: the live state's hooks the run calls (turns, requests, agent states, scrapes) and the flusher's
    refresh, delta and encoding, outermost call only. ``reader``: the event-stream reader's parsing when it runs in
    this process (``--reader-in-process``); ``reader_process``: the CPU of the reader's own process otherwise (a
    browser's, not the client's). ``writes``: aiohttp writing the stream's events to the socket. Not in any: the event
    loop running the flusher's and the stream's tasks at each flush, and the pause check each turn makes.
    """

    state: float = 0.0
    flushes: float = 0.0  # the part of ``state`` in the flusher's refresh, snapshot, delta and encoding
    reader: float = 0.0
    reader_process: float = 0.0
    writes: float = 0.0  # the event stream's writes (aiohttp's web server, to the socket)
    # How long each change waited to be sent: from the first change after a delta to the next delta that carried it.
    ages: list[float] = field(default_factory=list)
    _pending: float | None = None
    _depth: int = 0

    def install(self, ages: bool = False) -> None:
        """Time every hook of the live state and the flusher's encoding (class-wide, once per process); with
        ``ages``, also how long each change waits to be sent (a wrapper on every change: off for the CPU figures)."""
        hooks = ("agent", "turn", "limiter_changed", "stream_started", "agent_control", "touch", "record",
                 "control_changed", "on_scrape", "refresh", "snapshot", "delta")  # fmt: skip
        flushing = {"refresh", "snapshot", "delta", "encoded_delta"}
        for owner, names in ((LiveState, hooks), (Flusher, ("encoded_delta",))):
            for name in names:
                setattr(owner, name, self._timed(getattr(owner, name), flush=name in flushing))
        # The event stream's writes (the client's own requests use aiohttp's client, never a StreamResponse, and the
        # simulator is another process: every StreamResponse write here is the dashboard's). Timed to the end of the
        # await: a write that waited for the socket to drain would count other tasks' work too, which can only
        # overstate the share.
        write = web.StreamResponse.write

        async def timed_write(response: web.StreamResponse, data: Any) -> None:
            t0 = time.perf_counter()
            try:
                await write(response, data)
            finally:
                self.writes += time.perf_counter() - t0

        setattr(web.StreamResponse, "write", timed_write)  # noqa: B010  (patched for the benchmark's process)
        if ages:
            self._install_ages()

    def _install_ages(self) -> None:
        # The age of what a delta sends: a change marks the time if none is waiting; a delta sent clears it.
        bump, encoded, snapshot = LiveState._bump, Flusher.encoded_delta, LiveState.snapshot

        def marked_bump(state: LiveState, *args: Any, **kwargs: Any) -> None:
            if self._pending is None:
                self._pending = time.perf_counter()
            bump(state, *args, **kwargs)

        def aged_delta(flusher: Flusher, cursor: Any) -> bytes | None:
            event = encoded(flusher, cursor)
            if event is not None and self._pending is not None:
                self.ages.append(time.perf_counter() - self._pending)
                self._pending = None
            return event

        def fresh_snapshot(state: LiveState) -> Any:
            self._pending = None  # a page's first view holds everything so far: no change waits once it is taken
            return snapshot(state)

        setattr(LiveState, "_bump", marked_bump)  # noqa: B010  (patched for the benchmark's process)
        setattr(LiveState, "snapshot", fresh_snapshot)  # noqa: B010
        setattr(Flusher, "encoded_delta", aged_delta)  # noqa: B010

    def _timed(self, fn: Any, *, flush: bool) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # called from another timed method: already counted
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                self.state += took
                if flush:
                    self.flushes += took
                self._depth -= 1

        return timed


@dataclass
class GcTime:
    """The cyclic collector's passes and their CPU (``gc.callbacks``), summed over the runs of one arm."""

    passes: int = 0
    full: int = 0  # passes over the oldest generation
    cpu: float = 0.0
    _t0: float = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
            return
        self.passes += 1
        self.full += info["generation"] == 2
        self.cpu += time.process_time() - self._t0


class LoopProfile:
    """``--loop-profile``: this process's CPU in each run by what its event loop ran — each callback's time
    (``time.perf_counter`` around ``asyncio.Handle._run``: a callback never blocks, so its wall time is its CPU time
    but for preemptions), summed by the coroutine a task step resumed (the agents' ``drive``, the dashboard's stream
    and flusher, the server monitor) or the callback's name (a socket's reads). It shows which work differs between
    the arms: the dashboard's own tasks, and the agents' work, which is the same in both arms (the same steps, the same
    requests) and whose time moves with the machine. Installed for the whole process: both arms pay its timer."""

    def __init__(self) -> None:
        self.runs: list[tuple[bool, dict[str, list[float]]]] = []  # (with the dashboard, name → [steps, seconds])
        self._current: dict[str, list[float]] | None = None

    def install(self) -> None:
        run = asyncio.Handle._run
        clock = time.perf_counter

        def timed(handle: asyncio.Handle) -> None:
            t0 = clock()
            run(handle)
            took = clock() - t0
            if (current := self._current) is not None:
                name = handle_name(handle)
                entry = current.get(name)
                if entry is None:
                    entry = current[name] = [0.0, 0.0]
                entry[0] += 1
                entry[1] += took

        setattr(asyncio.Handle, "_run", timed)  # noqa: B010  (patched for the benchmark's process)

    def start(self, dashboard: bool) -> None:
        self._current = {}
        self.runs.append((dashboard, self._current))

    def stop(self) -> None:
        self._current = None

    def report(self, top: int = 8) -> None:
        names: dict[str, float] = {}
        for _, run in self.runs:
            for name, (_, took) in run.items():
                names[name] = names.get(name, 0.0) + took
        print("  the loop's CPU by what it ran, s a run (each run in order; * with the dashboard):")
        for name in sorted(names, key=lambda n: -names[n])[:top]:
            per_run = " ".join(f"{r.get(name, [0, 0.0])[1]:.3f}{'*' if d else ' '}" for d, r in self.runs)
            print(f"    {name[:60]:60s} {per_run}")


def handle_name(handle: asyncio.Handle) -> str:
    """What a callback runs: the coroutine a task's step resumes, else the callback's own name."""
    callback = handle._callback  # type: ignore[attr-defined]  # asyncio's, read only here
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return str(getattr(owner.get_coro(), "__qualname__", "task"))
    return str(getattr(callback, "__qualname__", None) or type(callback).__name__)


def scale_flushes(scale: float) -> None:
    """Stretch the dashboard's flush schedule by ``scale`` (``--callgrind``: a run under valgrind is that much slower,
    so the same run's page gets about as many flushes as at full speed, each carrying as much)."""
    init = Flusher.__init__

    def scaled(flusher: Flusher, state: LiveState, interval_s: float, **kw: Any) -> None:
        init(flusher, state, interval_s * scale, **kw)

    setattr(Flusher, "__init__", scaled)  # noqa: B010  (patched for the benchmark's child process)
