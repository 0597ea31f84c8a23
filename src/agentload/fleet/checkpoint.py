"""The run directory: a manifest, an append-only JSONL log of finished turns, and the results at the end.

``RUN_DIR/manifest.json`` the store's manifest every run kind carries (kind, id, status, headline: ``store.manifest``)
``RUN_DIR/run.json``      what was asked: the fleet (whole, so a resume runs the very same agents), server, model,
                          the width settings (``--mode``, ``--width``, ``--max-width``) and the key's variable
``RUN_DIR/turns.jsonl``   one line per event, appended, flushed and fsynced before the run goes on:
                          ``segment`` (a process started or resumed the run), ``turn`` (an agent finished a turn:
                          the whole ``TurnLog``), ``agent`` (an agent finished), ``limit`` (the width changed),
                          ``interrupt`` (a turn the server failed, or one cancelled on the way: its attempts,
                          kept as measurements, but not a committed turn — the agent sends that round again),
                          ``control`` (a pause, resume, stop, or one agent's stop or restart from the dashboard:
                          for the replay)
``RUN_DIR/results.json``  the compiled result (written at the end of each segment)
``RUN_DIR/workspaces/``   one directory per agent, for its file tools

A turn is committed when its line is on disk: the agent loop's ``on_turn`` hook awaits the write before the
agent goes on, so after a SIGKILL every turn is either in the log (and is not sent again on resume) or was never
acknowledged (and is sent again) — no turn lost, none repeated. A kill can tear only the line being written; it
has no newline, and ``load_log`` drops it and truncates the file there so later appends start on a clean line.
The appending (``JsonlWriter.append``: the line, then its fsync), the reading and the cut are ``store.jsonl``'s,
shared with the bench's records and samples.
A complete line that does not parse is damage, not a kill, and stops the resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agentload.agent.loop import TurnLog
from agentload.endpoint.records import RequestRecord
from agentload.errors import CheckpointError
from agentload.fleet.config import FleetConfig
from agentload.fleet.limiter import LimitChange, Mode
from agentload.load.collector import collector_for_load
from agentload.store.atomic import write_atomic
from agentload.store.jsonl import JsonlReader, JsonlWriter, cut_torn_tail

MANIFEST = "run.json"
LOG = "turns.jsonl"
RESULTS = "results.json"
WORKSPACES = "workspaces"

Outcome = Literal["done", "failed", "skipped"]


class RunManifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal[1] = 1
    run_id: str
    fleet: FleetConfig
    fleet_source: str = ""
    url: str | None = Field(description="None: the embedded simulator")
    profile: str | None = Field(default=None, description="the embedded simulator's profile")
    model: str | None = None
    virtual: bool = Field(default=False, description="the in-process simulator in simulated time")
    behaviour: str | None = Field(default=None, description="the embedded simulator's model; a resume keeps it")
    # The width settings as given, so a resume runs the way the run was started; None in a run.json written before
    # they were stored (a resume then reads the first segment line of the log).
    mode: Mode | None = None
    width: int | None = Field(default=None, description="--width as given (parallel: the width; auto: the start)")
    max_width: int | None = Field(default=None, description="--max-width as given")
    api_key_env: str | None = Field(default=None, description="the variable the key was read from (never the key)")


class SegmentLine(BaseModel):
    kind: Literal["segment"] = "segment"
    segment: int
    mode: Mode
    start_width: int
    reason: str
    # The width policy's bounds (auto's min and max; a fixed width's own): a replay shows them as they were. None in
    # logs written before they were recorded.
    min_limit: int | None = None
    max_limit: int | None = None


class TurnLine(BaseModel):
    kind: Literal["turn"] = "turn"
    agent: str
    round: int
    segment: int  # which process committed it (0 = the first run, 1 = the first resume, ...)
    elapsed_s: float  # the agent's active seconds up to the end of this turn, over every segment
    turn: TurnLog


class AgentLine(BaseModel):
    kind: Literal["agent"] = "agent"
    agent: str
    outcome: Outcome
    stop_reason: str = ""
    elapsed_s: float = 0.0
    final_content: str = ""
    detail: str = ""


class LimitLine(BaseModel):
    kind: Literal["limit"] = "limit"
    segment: int
    change: LimitChange
    # Set when the change replaced the width policy (the dashboard's mode switch): the new policy's mode and bounds,
    # which a replay shows from here on. None for the policy's own decisions.
    mode: Mode | None = None
    min_limit: int | None = None
    max_limit: int | None = None


class InterruptLine(BaseModel):
    """A turn not committed, with the attempts it made: the server failed it (the run stopped, the agent did not
    end), or it was cancelled on the way (the run stopped for another agent's failure or its time, or the agent was
    restarted). Either way the agent sends that round again."""

    kind: Literal["interrupt"] = "interrupt"
    agent: str
    round: int
    segment: int
    records: list[RequestRecord]  # every attempt, the last one final
    detail: str = ""


ControlAction = Literal["pause", "resume", "stop", "stop_agent", "restart_agent"]


class ControlLine(BaseModel):
    """What someone did from the dashboard (besides the width, a ``LimitLine``), for the replay: a pause, a resume,
    a stop of the fleet, a stop or restart of one agent. Evidence, not a commitment: a resume reads nothing from it
    (a pause ends with its process; a stopped agent is resumable, a restarted one resumes from its last committed
    turn like any other)."""

    kind: Literal["control"] = "control"
    segment: int
    t: float  # on the segment's process clock, the clock the turn records are stamped with
    action: ControlAction
    agent: str | None = None  # stop_agent and restart_agent's


AnyLine = SegmentLine | TurnLine | AgentLine | LimitLine | InterruptLine | ControlLine
Line = Annotated[AnyLine, Field(discriminator="kind")]
_LINE: TypeAdapter[AnyLine] = TypeAdapter(Line)


@dataclass
class LogState:
    """What a log says: committed turns per agent (rounds 0..n-1, each once), finished agents, segments."""

    turns: dict[str, list[TurnLine]] = field(default_factory=dict)
    finished: dict[str, AgentLine] = field(default_factory=dict)
    segments: list[SegmentLine] = field(default_factory=list)
    limits: list[LimitLine] = field(default_factory=list)
    interrupts: dict[str, list[InterruptLine]] = field(default_factory=dict)
    controls: list[ControlLine] = field(default_factory=list)
    torn_bytes: int = 0  # length of a torn last line that was dropped

    def add(self, line: AnyLine, where: str) -> None:
        if isinstance(line, TurnLine):
            have = self.turns.setdefault(line.agent, [])
            if line.agent in self.finished:
                raise CheckpointError(f"{where}: a turn of agent {line.agent!r} after it finished")
            if line.round != len(have) or line.turn.round != line.round:
                raise CheckpointError(
                    f"{where}: agent {line.agent!r} round {line.round} follows {len(have)} committed rounds "
                    "(a turn lost or repeated)"
                )
            have.append(line)
        elif isinstance(line, AgentLine):
            if line.agent in self.finished:
                raise CheckpointError(f"{where}: agent {line.agent!r} finished twice")
            self.finished[line.agent] = line
        elif isinstance(line, SegmentLine):
            self.segments.append(line)
        elif isinstance(line, InterruptLine):
            if line.agent in self.finished:
                raise CheckpointError(f"{where}: agent {line.agent!r} was interrupted after it finished")
            self.interrupts.setdefault(line.agent, []).append(line)
        elif isinstance(line, ControlLine):
            self.controls.append(line)
        else:
            self.limits.append(line)

    def committed(self, agent: str) -> list[TurnLog]:
        return [t.turn for t in self.turns.get(agent, [])]

    def elapsed(self, agent: str) -> float:
        turns = self.turns.get(agent)
        return turns[-1].elapsed_s if turns else 0.0


def load_log(path: Path, *, repair: bool = True) -> LogState:
    """Read a log; a torn last line (no newline: the process died mid-write) is dropped and, with ``repair``,
    cut off the file (``store.jsonl``: the same reader and the same cut as every other run's logs)."""
    state = LogState()
    reader = JsonlReader(path, _LINE, what="checkpoint line")
    # A run's log is read whole (at a resume, and at the end for the results): thousands of turns' lines of nested
    # objects, which under the default thresholds set the cyclic collector off every 700 of them, walking the
    # whole process's objects every few passes (142 passes and 0.17 s of the 0.25 s read of a 4,000-turn log at a
    # fleet run's end); the load's settings (``load.collector``) make that a pass or two.
    with collector_for_load():
        for number, line in reader.numbered():
            state.add(line, f"{path}:{number}")
    state.torn_bytes = reader.torn_bytes
    if state.torn_bytes and repair:
        cut_torn_tail(path)
    return state


# The run's log: the store's append-only writer of these lines (``JsonlWriter.append`` writes a line and fsyncs it
# off the event loop before the agent goes on; ``sync=False`` in simulated time).
CheckpointLog = JsonlWriter[AnyLine]


def write_manifest(run_dir: Path, manifest: RunManifest) -> None:
    write_atomic(run_dir / MANIFEST, manifest.model_dump_json(indent=2))


def read_manifest(run_dir: Path) -> RunManifest:
    path = run_dir / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CheckpointError(f"{run_dir} is not a run directory (no {MANIFEST})") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path} is not a run manifest: not UTF-8 text (byte {exc.start})") from exc
    try:
        return RunManifest.model_validate_json(text)
    except ValidationError as exc:
        raise CheckpointError(f"{path} is not a run manifest: {exc.errors()[0]['msg']}") from exc
