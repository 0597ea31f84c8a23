"""A finished or interrupted bench run, replayed from its run directory (``agentload dashboard RUN``).

From what the bench wrote as it ran (``store.rundir``): ``samples.jsonl`` (the server's gauges and counters, each
with the level it was taken in, on the run's own time axis), ``levels.jsonl`` (each level's summary as it ended)
and ``result.json`` or ``bench.json`` (the mode, the tolerance and the SLO). ``BenchReplay.at(t)`` is the page's
snapshot at ``t``, in the shape ``LiveState.snapshot`` sends for a live bench: the server's timelines up to ``t``,
the level running then, the level table with the levels that had ended, and the knee search's steps so far.

A level ends at its last sample. The search's steps are judged again from the summaries, in the order the levels
ran, by the search's own rule (``bench.search.Search.verdicts``), so they say what the live search saw then; the
phase is read from the order (doubling while no level is past the knee, then bisecting). The output-token rate is
the server's own generation counter; turns per second and TTFT percentiles over time are not drawn (the records
are on another clock than the samples), and a level that never ended has no row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentload.bench.results import LevelSummary
from agentload.bench.search import Search, Slo, parse_slo
from agentload.dashboard.state import level_row
from agentload.endpoint.scrape import prefix_hit_rate
from agentload.errors import CheckpointError, ConfigError
from agentload.store.catalog import run_status
from agentload.store.manifest import read_info
from agentload.store.rundir import LevelSample, RunDir


async def _never(agents: int) -> LevelSummary:
    raise AssertionError("a replayed search measures nothing")


class BenchReplay:
    """A bench run directory, read once; ``at(t)`` is the page's snapshot at ``t``."""

    kind = "bench"

    def __init__(self, run_dir: Path) -> None:
        run = RunDir(run_dir)
        samples: list[LevelSample] = run.samples() if (run_dir / "samples.jsonl").exists() else []
        self.summaries = run.levels()
        if not samples and not self.summaries:
            raise CheckpointError(f"{run_dir} has no server samples or levels to replay")
        info = read_info(run_dir)
        self.run_id = info.run_id if info is not None and info.run_id else run_dir.name
        # The run's status as `agentload runs` lists it (the store's one reading), shown once the replay is at its end.
        self.status = run_status(run_dir)
        mode, tolerance, slo, target, workload = self._settings(run)
        self.meta = {"mode": mode, "target": target, "workload": workload, "run_id": self.run_id}
        self.samples = sorted(samples, key=lambda s: s.sample.t)
        self.start = self.samples[0].sample.t if self.samples else 0.0
        self.end = (self.samples[-1].sample.t - self.start) if self.samples else 0.0
        spans: dict[int, list[float]] = {}
        for s in self.samples:
            span = spans.setdefault(s.level, [s.sample.t, s.sample.t])
            span[0], span[1] = min(span[0], s.sample.t), max(span[1], s.sample.t)
        self.spans = {level: (a - self.start, b - self.start) for level, (a, b) in spans.items()}
        self.ended = {s.level: self.spans.get(s.level, (0.0, 0.0))[1] for s in self.summaries}
        self.steps = self._steps(mode, tolerance, slo)
        self.points = self._points()

    @staticmethod
    def _settings(run: RunDir) -> tuple[str, float, Slo | None, str, str]:
        """Mode, tolerance, SLO, target and workload: from the result, else the invocation it was started with."""
        if run.finished:
            r = run.result()
            tolerance = r.settings.get("tolerance")
            slo = r.settings.get("slo")
            return (r.mode, float(tolerance) if isinstance(tolerance, int | float) else 0.10,
                    _slo(slo), r.target, r.workload)  # fmt: skip
        try:
            flags = run.invocation()
        except CheckpointError:
            flags = {}
        mode = "find-knee" if flags.get("find_knee") else "sweep" if flags.get("sweep") else "single"
        tolerance = flags.get("tolerance", 0.10)
        target = str(flags.get("url") or (f"sim:{flags['sim']}" if flags.get("sim") else ""))
        return (mode, float(tolerance) if isinstance(tolerance, int | float) else 0.10, _slo(flags.get("slo")),
                target, str(flags.get("workload", "")))  # fmt: skip

    def _steps(self, mode: str, tolerance: float, slo: Slo | None) -> list[tuple[float, dict[str, Any]]]:
        if mode not in ("find-knee", "sweep", "grid"):
            return []
        searches: dict[int, Search] = {}
        steps: list[tuple[float, dict[str, Any]]] = []
        for s in self.summaries:
            search = searches.setdefault(s.context, Search(_never, tolerance=tolerance, slo=slo, context=s.context))
            if mode == "find-knee" and s.agents in search.levels:
                continue  # the synthetic arm at the knee, or a repeat: not a step of the search
            search.levels[s.agents] = s
            verdicts = search.verdicts()
            before = [n for n, v in verdicts.items() if not v.past]
            after = [n for n, v in verdicts.items() if v.past]
            earlier = [n for n in search.levels if n != s.agents]
            phase = "sweep"
            if mode == "find-knee":
                doubling = all(not verdicts[n].past for n in earlier) and s.agents in (1, *(2 * n for n in earlier))
                phase = "doubling" if doubling else "bisecting"
            verdict = verdicts[s.agents]
            step = {"phase": phase, "agents": s.agents, "context": s.context, "past": verdict.past,
                    "reason": verdict.reason if verdict.past else "", "lo": max(before, default=None),
                    "hi": min(after, default=None)}  # fmt: skip
            steps.append((self.ended.get(s.level, 0.0), step))
        return steps

    def _points(self) -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = []
        agents = {s.level: s.agents for s in self.summaries}
        prev: LevelSample | None = None
        preempt0: float | None = None
        gen0: float | None = None
        for x in self.samples:
            s = x.sample
            hit = None
            if prev is not None:
                p0 = prev.sample
                hit = prefix_hit_rate(p0.prefix_queries, p0.prefix_hits, s.prefix_queries, s.prefix_hits)
            if s.preemptions is not None and preempt0 is None:
                preempt0 = s.preemptions
            if s.generation_tokens is not None and gen0 is None:
                gen0 = s.generation_tokens
            points.append(
                {
                    "t": s.t - self.start, "kv": s.kv_usage, "running": s.running, "waiting": s.waiting, "hit": hit,
                    "preempt": None if s.preemptions is None or preempt0 is None else s.preemptions - preempt0,
                    "width": None, "live": agents.get(x.level), "turns": None,
                    "out": None if s.generation_tokens is None or gen0 is None else s.generation_tokens - gen0,
                    "ttft_p50": None, "ttft_p95": None,
                }
            )  # fmt: skip
            prev = x
        return points

    def at(self, t: float) -> dict[str, Any]:
        t = min(max(t, 0.0), self.end)
        done = [s for s in self.summaries if self.ended.get(s.level, 0.0) <= t]
        current = None
        for s in self.summaries:
            a, b = self.spans.get(s.level, (0.0, 0.0))
            if a <= t < b:
                current = {"level": s.level, "agents": s.agents, "context": s.context, "workload": s.workload,
                           "warmup_s": s.warmup_s, "window_s": s.window_s, "t": a}  # fmt: skip
        return {
            "summary": {
                "fleet": self.meta["workload"],
                "run_id": self.run_id,
                "t": t,
                "counts": {},
                "turns": sum(s.turns for s in done),
                "limiter": None,
                "watchdog": None,
                "control": {"paused": False, "stopping": False},
                "finished": t >= self.end,
                "status": self.status[0] if self.status else None,
                "status_why": self.status[1] if self.status else "",
                "replay": {"t": t, "end": self.end, "segments": [], "kind": self.kind},
                "bench": {**self.meta, "current": current},
            },
            "agents": [],
            "decisions": [],
            "points": [p for p in self.points if p["t"] <= t],
            "levels": [level_row(s) for s in done],
            "steps": [step for at, step in self.steps if at <= t],
        }


def _slo(text: object) -> Slo | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_slo(text)
    except ConfigError:
        return None  # an SLO this agentload cannot read: the steps are judged without it
