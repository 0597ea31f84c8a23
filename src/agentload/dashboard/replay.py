"""A finished or interrupted fleet run, replayed from its run directory (``agentload dashboard RUN``).

Everything comes from what the run wrote — ``turns.jsonl`` (each committed turn with every attempt's send, first
token and end; the width changes; the turns the server failed; each agent's outcome), ``run.json`` and, when the
segment finished, ``results.json`` — never from a live process. ``FleetReplay.at(t)`` compiles the page's
snapshot at time ``t`` (the same shape ``LiveState.snapshot`` sends, so the page draws both the same way).

The time axis is the replay's own: segment 0 starts at 0, and each later segment (a resume, in another process)
is laid after the one before it with a ``SEGMENT_GAP_S`` gap. Within a segment, times are the records' own
(one monotonic clock per process), shifted so the segment's first request is its start.

The server's gauges (KV usage, running and waiting requests, prefix hits, preemptions) come from ``server.jsonl``
(``fleet.samples``: each scrape with its segment, on the same clock as the turns); a run from before it was
recorded has none, and its charts stay empty. Each sample also carries the stall watchdog's decisions so far in its
segment (extensions granted and refused, by phase): the replay shows them summed over the segments up to ``t``.

What was done from the live page is in the log as ``control`` lines (``dashboard.control``): the run shows paused
between a pause and its resume, and stopping from a stop of the fleet, each until its segment ended; an agent
stopped from the page shows *stopping* until its turn in flight ended, then *stopped* until a later segment runs
it again; a restart counts on its card. A run recorded before these lines has only their effect (fewer turns, no
outcome line). An agent held because an agent it depends on was stopped is not marked: nothing of it was logged.

An agent's outcome line carries no time; it is placed at the end of the agent's last committed turn (a skipped
agent: when its last dependency ended). A turn cut short by a stop or a kill left no record, so the agent shows
*think* from its last committed turn to the end of that segment, then *interrupted*.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agentload.dashboard.benchreplay import BenchReplay
from agentload.dashboard.state import reply_preview
from agentload.endpoint.records import RequestRecord
from agentload.endpoint.scrape import prefix_hit_rate
from agentload.errors import CheckpointError
from agentload.fleet.checkpoint import LOG, MANIFEST, RESULTS, LogState, load_log, read_manifest
from agentload.fleet.config import expand
from agentload.fleet.results import FleetResult
from agentload.fleet.samples import SegmentSample, read_samples
from agentload.store.catalog import run_status
from agentload.store.manifest import read_info
from agentload.store.rundir import LEVELS, SAMPLES

# Between two segments on the replay's time axis (the real gap — until someone resumed — is not recorded).
SEGMENT_GAP_S = 1.0
# One timeline point per this many seconds of replay.
POINT_S = 1.0
# A server sample older than this at a point is not drawn there: the server stopped answering, or the segment ended.
STALE_S = 3.0


@dataclass(frozen=True)
class _Turn:
    """One request window on the replay's axis: a committed turn, or a turn the server failed (not committed)."""

    sent: float
    first_token: float | None
    done: float
    segment: int
    committed: bool
    context: int = 0
    out: int = 0
    ttft: float | None = None
    preview: str = ""


@dataclass
class _Agent:
    id: str
    group: str
    wave: int
    depends_on: list[str]
    turns: list[_Turn] = field(default_factory=list)  # in order of sending
    outcome: str | None = None  # done / failed / skipped, from its agent line
    ended_at: float | None = None
    detail: str = ""


class FleetReplay:
    """A fleet run directory, compiled once into request windows; ``at(t)`` is the page's snapshot at ``t``."""

    kind = "fleet"

    def __init__(self, run_dir: Path) -> None:
        manifest = read_manifest(run_dir)
        state = load_log(run_dir / LOG, repair=False)  # read-only: a torn last line is skipped, not cut
        self.run_id = manifest.run_id or run_dir.name
        # The run's status as `agentload runs` lists it (the store's one reading), shown once the replay is at its end.
        self.status = run_status(run_dir)
        self.fleet = manifest.fleet.name
        plans = expand(manifest.fleet)
        results: FleetResult | None = None
        try:
            results = FleetResult.model_validate_json((run_dir / RESULTS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            results = None  # killed before its first segment ended: the log alone
        self.offsets: dict[int, tuple[float, float]] = {}  # segment → (its start on its clock, its replay start)
        self.segments: list[dict[str, Any]] = []
        self._lay_segments(state)
        self.end = self.segments[-1]["end"] if self.segments else 0.0
        self.ends: dict[int, float] = {s["segment"]: s["end"] for s in self.segments}
        self.agents: dict[str, _Agent] = {
            p.agent_id: _Agent(p.agent_id, p.task_id, p.wave, list(p.depends_on)) for p in plans
        }
        self._read_turns(state)
        self._place_outcomes(state)
        self.policies: list[tuple[float, str, int | None, int | None]] = []
        self.widths: list[tuple[float, int, dict[str, Any]]] = []
        self._read_widths(state, results)
        # The page's controls: (t, segment, action, agent) on the replay's axis, in order; one before its segment's
        # first request is placed at that request.
        self.controls: list[tuple[float, int, str, str | None]] = sorted(
            (max(self._t(c.segment, c.t), self.offsets[c.segment][1]), c.segment, c.action, c.agent)
            for c in state.controls
            if c.segment in self.offsets
        )
        self.agent_controls: dict[str, list[tuple[float, int, str]]] = {}  # the controls of one agent, in order
        for at, segment, action, who in self.controls:
            if who is not None:
                self.agent_controls.setdefault(who, []).append((at, segment, action))
        samples = read_samples(run_dir)
        self.gauges = self._gauges(samples)
        self.watchdogs = self._watchdogs(samples)
        self.points = self._points()

    # -- compiling the log, once ------------------------------------------------------------------------------
    def _lay_segments(self, state: LogState) -> None:
        """Lay the segments on the replay's axis, one after the other (``offsets``, ``segments``)."""
        # Each segment's first send and last end (or last action from the page), on its process's clock.
        spans: dict[int, list[float]] = {}

        def stretch(segment: int, records: list[RequestRecord]) -> None:
            span = spans.setdefault(segment, [math.inf, -math.inf])
            for r in records:
                span[0] = min(span[0], r.t_sent)
                span[1] = max(span[1], r.t_done)

        for lines in state.turns.values():
            for line in lines:
                stretch(line.segment, line.turn.records)
        for interrupts in state.interrupts.values():
            for x in interrupts:
                stretch(x.segment, x.records)
        for c in state.controls:  # a stop from the page ends its segment: the turns it cut short left no record
            if c.segment in spans:
                spans[c.segment][1] = max(spans[c.segment][1], c.t)
        at = 0.0
        for seg in sorted(spans):
            first, last = spans[seg]
            self.offsets[seg] = (first, at)
            self.segments.append({"segment": seg, "start": at, "end": at + last - first})
            at += last - first + SEGMENT_GAP_S

    def _read_turns(self, state: LogState) -> None:
        """Each agent's request windows on the replay's axis: its committed turns and those the server failed."""
        for aid, lines in state.turns.items():
            agent = self._agent(aid)
            for line in lines:
                final = line.turn.final
                agent.turns.append(
                    _Turn(
                        sent=self._t(line.segment, line.turn.records[0].t_sent),
                        first_token=None if final.t_first_token is None else self._t(line.segment, final.t_first_token),
                        done=self._t(line.segment, final.t_done),
                        segment=line.segment,
                        committed=True,
                        context=final.prompt_tokens,
                        out=sum(r.completion_tokens for r in line.turn.records),
                        ttft=final.ttft,
                        preview=reply_preview(final),
                    )
                )
        for aid, interrupts in state.interrupts.items():
            agent = self._agent(aid)
            for x in interrupts:
                final = x.records[-1]
                agent.turns.append(
                    _Turn(
                        sent=self._t(x.segment, x.records[0].t_sent),
                        first_token=None,
                        done=self._t(x.segment, final.t_done),
                        segment=x.segment,
                        committed=False,
                        preview=x.detail,
                    )
                )
            agent.turns.sort(key=lambda t: t.sent)

    def _place_outcomes(self, state: LogState) -> None:
        """Each agent's outcome, at the end of its last turn (a skipped one's: when its last dependency ended)."""
        by_task: dict[str, list[_Agent]] = {}
        for agent in self.agents.values():
            by_task.setdefault(agent.group, []).append(agent)
        # Wave by wave so that a skipped agent's dependencies are placed before it.
        for agent in sorted(self.agents.values(), key=lambda a: a.wave):
            ended = state.finished.get(agent.id)
            if ended is None:
                continue
            agent.outcome, agent.detail = ended.outcome, ended.detail
            if agent.turns:
                agent.ended_at = agent.turns[-1].done
            else:
                deps = [d.ended_at or 0.0 for task in agent.depends_on for d in by_task.get(task, [])]
                agent.ended_at = max(deps, default=0.0)

    def _read_widths(self, state: LogState, results: FleetResult | None) -> None:
        """The width's changes and the width policy in force, in order on the replay's axis."""
        # Width changes: each segment starts at its start width; ``t`` of a change is from its segment's start.
        # The width policy in force (mode, min, max): each segment's, then each switch from the dashboard. A log
        # written before the bounds were recorded falls back to the run's last (results.json's).
        end_min = results.limiter.min_limit if results is not None else None
        end_max = results.limiter.max_limit if results is not None else None
        for s in state.segments:
            if s.segment in self.offsets:
                start = self.offsets[s.segment][1]
                self.widths.append((start, s.start_width, {}))
                bounds = (end_min, end_max) if s.min_limit is None else (s.min_limit, s.max_limit)
                self.policies.append((start, s.mode.value, *bounds))
        for limit in state.limits:
            if limit.segment in self.offsets:
                t = self.offsets[limit.segment][1] + limit.change.t
                change = limit.change.model_dump(mode="json") | {"t": round(t, 3)}
                self.widths.append((t, limit.change.new, change))
                if limit.mode is not None:
                    self.policies.append((t, limit.mode.value, limit.min_limit, limit.max_limit))
        self.widths.sort(key=lambda w: w[0])
        self.policies.sort(key=lambda p: p[0])

    def _agent(self, aid: str) -> _Agent:
        agent = self.agents.get(aid)
        if agent is None:  # in the log but not in the fleet (cannot happen for a log this fleet wrote): kept
            agent = self.agents[aid] = _Agent(aid, "", 0, [])
        return agent

    def _t(self, segment: int, t: float) -> float:
        first, start = self.offsets[segment]
        return start + t - first

    def _next_start(self, segment: int) -> float:
        """When the segment after ``segment`` started (infinity: none did)."""
        return float(next((s["start"] for s in self.segments if s["segment"] > segment), math.inf))

    # -- one agent at t ---------------------------------------------------------------------------------------
    def _card(self, a: _Agent, t: float) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": a.id, "group": a.group, "wave": a.wave, "depends_on": a.depends_on, "state": "waiting",
            "phase": "queued", "turn": 0, "context": 0, "out": 0, "ttft": None, "preview": "", "error": "",
            "stopping": False, "restarts": 0,
        }  # fmt: skip
        latest: _Turn | None = None
        for turn in a.turns:
            if turn.sent > t:
                break
            latest = turn
            if turn.committed and turn.done <= t:
                card["turn"] += 1
                card["context"], card["ttft"], card["preview"] = turn.context, turn.ttft, turn.preview
                card["out"] += turn.out
        stopped: int | None = None  # the segment the agent was stopped in from the page
        for at, segment, action in self.agent_controls.get(a.id, ()):
            if at > t:
                break
            if action == "restart_agent":
                card["restarts"] += 1
            elif action == "stop_agent":
                stopped = segment
        if a.outcome is not None and a.ended_at is not None and t >= a.ended_at:
            card.update(state=a.outcome, phase="", error=a.detail)
            return card
        # Stopped until the next segment started (a resume runs it again); not if it has run since.
        if stopped is not None and t < self._next_start(stopped) and (latest is None or latest.segment <= stopped):
            card["stopping"] = True
            if latest is None or t >= latest.done:  # its turn in flight (committed, or cut short) is over
                card.update(state="stopped", phase="")
                return card
        if latest is None:
            return card
        if t < latest.done:
            card["state"] = "running"
            card["phase"] = "streaming" if latest.first_token is not None and t >= latest.first_token else "prefilling"
        elif not latest.committed:
            card.update(state="interrupted", phase="", error=latest.preview)
        elif t < self.ends[latest.segment]:
            card.update(state="running", phase="think")
        else:
            card.update(state="interrupted", phase="")  # its segment ended (a stop, a kill) with it unfinished
        return card

    # -- the timelines ---------------------------------------------------------------------------------------
    def _policy_at(self, t: float) -> tuple[str, int | None, int | None]:
        """The width policy in force at ``t``: its mode, min and max."""
        p = _latest(self.policies, t)
        return ("", None, None) if p is None else (p[1], p[2], p[3])

    def _width_at(self, t: float) -> int | None:
        w = _latest(self.widths, t)
        return None if w is None else w[1]

    def _gauges(self, samples: list[SegmentSample]) -> list[tuple[float, float, dict[str, Any]]]:
        """The server's samples on the replay's axis, in order: (t, its segment's end, the gauges a point shows).
        The prefix-hit rate is between a sample and the one before it in its segment; preemptions count from the
        run's first sample, each segment's added to the ones before (a resumed run may face a restarted server,
        whose counters start again)."""
        gauges: list[tuple[float, float, dict[str, Any]]] = []
        ends = self.ends
        prev: SegmentSample | None = None
        carried = 0.0  # preemptions counted in the segments before
        span: list[float] = []  # the preemption counter's first and latest value in this segment
        for x in samples:
            if x.segment not in self.offsets:
                continue  # a segment with no request: not on the axis
            first, at = self.offsets[x.segment]
            t = at + x.t - first
            if not at <= t <= ends[x.segment]:
                continue  # before its segment's first request or after its last
            if prev is not None and prev.segment != x.segment:
                carried += span[1] - span[0] if span else 0.0
                prev, span = None, []
            hit = None
            if prev is not None:
                hit = prefix_hit_rate(prev.prefix_queries, prev.prefix_hits, x.prefix_queries, x.prefix_hits)
            preempt = None
            if x.preemptions is not None:
                span = [span[0] if span else x.preemptions, x.preemptions]
                preempt = carried + span[1] - span[0]
            shown = {"kv": x.kv_usage, "running": x.running, "waiting": x.waiting, "hit": hit, "preempt": preempt}
            gauges.append((t, ends[x.segment], shown))
            prev = x
        return gauges

    def _watchdogs(self, samples: list[SegmentSample]) -> list[tuple[float, dict[str, dict[str, int]]]]:
        """The watchdog's decisions by ``t``: (t, granted and refused by phase, summed over the segments so far). A
        sample taken after its segment's last request still counts (a give-up ends a segment, and the scrape that
        saw it comes after), placed at the segment's end."""
        out: list[tuple[float, dict[str, dict[str, int]]]] = []
        ends = self.ends
        carried: dict[str, dict[str, int]] = {"granted": {}, "refused": {}}  # the segments before, at their ends
        last: dict[str, dict[str, int]] | None = None  # this segment's latest counts
        segment: int | None = None
        for x in samples:
            if x.segment not in self.offsets or x.granted is None or x.refused is None:
                continue
            if segment is not None and x.segment != segment and last is not None:
                carried = {k: _add(carried[k], last[k]) for k in carried}
            segment, last = x.segment, {"granted": x.granted, "refused": x.refused}
            first, at = self.offsets[x.segment]
            t = min(max(at + x.t - first, at), ends[x.segment])
            out.append((t, {k: _add(carried[k], last[k]) for k in carried}))
        return out

    def _watchdog_at(self, t: float) -> dict[str, dict[str, int]] | None:
        """None for a run recorded without the watchdog's counts (the page then shows nothing of it)."""
        if not self.watchdogs:
            return None
        w = _latest(self.watchdogs, t)
        return {"granted": {}, "refused": {}} if w is None else w[1]

    def _control_at(self, t: float) -> dict[str, bool]:
        """Paused and stopping at ``t``: from a pause to its resume, from a stop on; neither past its segment."""
        paused: int | None = None  # the segment paused in
        stopping: int | None = None
        for at, segment, action, _ in self.controls:
            if at > t:
                break
            if action == "pause":
                paused = segment
            elif action == "resume":
                paused = None
            elif action == "stop":
                stopping = segment
        return {
            "paused": paused is not None and t <= self.ends[paused],
            "stopping": stopping is not None and t <= self.ends[stopping],
        }

    def _points(self) -> list[dict[str, Any]]:
        """One point per ``POINT_S``: the width, live agents, cumulative turns and output tokens, the TTFT
        percentiles (nearest rank) of the turns committed since the previous point, and the server's gauges from
        its latest sample (none older than ``STALE_S``, none from a segment that had ended)."""
        committed = sorted(
            (turn.done, turn.out, turn.ttft) for a in self.agents.values() for turn in a.turns if turn.committed
        )
        spans: list[list[float]] = []  # each agent's activity per segment: first send to last end
        for a in self.agents.values():
            by_seg: dict[int, list[float]] = {}
            for turn in a.turns:
                s = by_seg.setdefault(turn.segment, [turn.sent, turn.done])
                s[0], s[1] = min(s[0], turn.sent), max(s[1], turn.done)
            spans.extend(by_seg.values())
        points: list[dict[str, Any]] = []
        i = turns = out = j = 0
        none = {"kv": None, "running": None, "waiting": None, "hit": None, "preempt": None}
        steps = math.ceil(self.end / POINT_S) if self.end > 0 else 0
        for k in range(steps + 1):
            t = min(k * POINT_S, self.end)
            while j < len(self.gauges) and self.gauges[j][0] <= t:
                j += 1
            gauge = self.gauges[j - 1] if j else None
            server = gauge[2] if gauge is not None and t - gauge[0] <= STALE_S and t <= gauge[1] else none
            ttfts = []
            while i < len(committed) and committed[i][0] <= t:
                turns += 1
                out += committed[i][1]
                if committed[i][2] is not None:
                    ttfts.append(committed[i][2])
                i += 1
            ttfts.sort()
            points.append(
                {
                    "t": t, **server,
                    "width": self._width_at(t), "live": sum(1 for s0, s1 in spans if s0 <= t <= s1),
                    "turns": turns, "out": out,
                    "ttft_p50": ttfts[(len(ttfts) - 1) // 2] if ttfts else None,
                    "ttft_p95": ttfts[math.ceil(0.95 * len(ttfts)) - 1] if ttfts else None,
                }
            )  # fmt: skip
        return points

    # -- the page's snapshot at t -----------------------------------------------------------------------------
    def at(self, t: float) -> dict[str, Any]:
        t = min(max(t, 0.0), self.end)
        agents = [self._card(a, t) for a in self.agents.values()]
        counts: dict[str, int] = {}
        for c in agents:
            counts[c["state"]] = counts.get(c["state"], 0) + 1
        decisions = [d for at, _, d in self.widths if d and at <= t]
        mode, low, high = self._policy_at(t)
        return {
            "summary": {
                "fleet": self.fleet,
                "run_id": self.run_id,
                "t": t,
                "counts": counts,
                "turns": sum(c["turn"] for c in agents),
                "limiter": {
                    "mode": mode,
                    "limit": self._width_at(t),
                    "min": low,
                    "max": high,
                    "live": counts.get("running", 0),
                    "queued": None,
                    "parked_total": None,
                    "decisions": len(decisions),
                },
                "watchdog": self._watchdog_at(t),
                "control": self._control_at(t),
                "finished": t >= self.end,
                "status": self.status[0] if self.status else None,
                "status_why": self.status[1] if self.status else "",
                "replay": {"t": t, "end": self.end, "segments": self.segments, "kind": self.kind},
            },
            "agents": agents,
            "decisions": decisions,
            "points": [p for p in self.points if p["t"] <= t],
        }


class Replay(Protocol):
    """What the replay server serves (``FleetReplay`` and ``dashboard.benchreplay.BenchReplay`` fit)."""

    kind: str
    end: float

    def at(self, t: float) -> dict[str, Any]: ...


def open_replay(run_dir: Path) -> Replay:
    """The replay of a fleet or bench run directory; anything else is a ``CheckpointError``."""
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir} is not a run directory")
    info = read_info(run_dir)
    kind = info.kind if info is not None else None
    if kind == "fleet" or (kind is None and (run_dir / MANIFEST).is_file()):
        return FleetReplay(run_dir)
    if kind == "bench" or (kind is None and any((run_dir / f).is_file() for f in (SAMPLES, LEVELS))):
        return BenchReplay(run_dir)
    what = f"a {kind} run" if kind else "not a fleet or bench run directory"
    raise CheckpointError(f"{run_dir} is {what}: agentload dashboard replays fleet and bench runs")


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in a.keys() | b.keys()}


_Timed = TypeVar("_Timed", bound=tuple[Any, ...])


def _latest(items: Sequence[_Timed], t: float) -> _Timed | None:
    """The last of ``items`` (in order of their first field, a time) at or before ``t``; None before the first."""
    i = bisect.bisect_right(items, t, key=lambda x: x[0])
    return items[i - 1] if i else None
