"""The FLEET.toml schema: which agents to run, what each is asked, with which tools and limits, in which order.

A fleet file has optional top-level ``name``, a ``[defaults]`` table that every task inherits, and one
``[[tasks]]`` table per task::

    name = "review"

    [defaults]
    tools = ["search"]
    max_rounds = 8
    think_time_s = 2.0

    [[tasks]]
    id = "setup"
    prompt = "Write a plan to notes.md."
    tools = ["write_file"]

    [[tasks]]
    id = "review"
    prompt = "Review module {replica} of the service."
    count = 16                # sixteen agents: review.00 … review.15
    depends_on = ["setup"]    # they start once every setup agent is done

Everything is checked before anything runs (unknown keys, tool names, dependency ids, cycles), and each problem
becomes one ``ConfigError`` line. ``expand`` turns the file into one ``AgentPlan`` per agent: ``count`` replicas,
and waves — wave 0 holds the tasks without dependencies, wave k those whose deepest dependency is in wave k − 1.
The runner starts a task as soon as its own dependencies are done (waves are for reading, not barriers).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentload.agent.loop import AgentSpec
from agentload.errors import ConfigError
from agentload.fleet.toolbox import BUILTIN_TOOLS
from agentload.inputs import parse_toml, read_text

_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
T = TypeVar("T")

# Built-in values for what neither a task nor [defaults] sets.
DEFAULT_MAX_ROUNDS = 20
DEFAULT_TOOL_RESULT_TOKENS = 200
# Upper bounds: far past any real fleet, low enough that a typo cannot ask for gigabytes of filler or
# millions of agents. A fleet of 2e9 context_tokens grew to 3 GB before it could even notice --stop-after.
MAX_CONTEXT_TOKENS = 2_000_000  # filler words per agent (≈ 2.6M tokens, past the largest context windows)
MAX_OUTPUT_TOKENS = 1_000_000
MAX_TOOL_RESULT_TOKENS = 1_000_000
MAX_SECONDS = 86_400.0  # a think time or tool latency of a day
MAX_TASKS = 10_000
MAX_AGENTS = 100_000  # agents in the whole fleet, every task's count summed


class TaskSettings(BaseModel):
    """Settings a task may take from ``[defaults]``; None means "not set here"."""

    # NaN passes no bound and inf passes a lower one: a number in a fleet file must be finite.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: str | None = None
    system: str | None = None
    tools: list[str] | None = None
    tool_choice: str | None = Field(
        default=None, description='"auto", "required", "none", or a tool name to force that tool'
    )
    max_rounds: int | None = Field(default=None, ge=1, le=10_000)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(default=None, ge=0)
    think_time_s: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    tool_latency_s: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    context_tokens: int | None = Field(
        default=None,
        ge=0,
        le=MAX_CONTEXT_TOKENS,
        description="words of filler, unique per agent, added to the prompt: a stand-in for the files and "
        "documents a real agent has read, so its context (and KV footprint) has a realistic size",
    )
    tool_result_tokens: int | None = Field(
        default=None, ge=1, le=MAX_TOOL_RESULT_TOKENS, description="words each search result returns"
    )


class TaskConfig(TaskSettings):
    id: str
    prompt: str = Field(min_length=1)
    count: int = Field(default=1, ge=1, le=MAX_AGENTS)
    depends_on: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id_shape(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError("use 1-64 letters, digits, '_' or '-'")
        return v


class FleetConfig(BaseModel):
    """A parsed, validated fleet file (kept whole in the run directory, so a resume runs the very same fleet)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "fleet"
    defaults: TaskSettings = Field(default_factory=TaskSettings)
    tasks: list[TaskConfig] = Field(min_length=1, max_length=MAX_TASKS)

    @field_validator("name")
    @classmethod
    def _name_shape(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError("use 1-64 letters, digits, '_' or '-'")
        return v


@dataclass(frozen=True)
class AgentPlan:
    """One agent of the fleet, fully resolved: everything needed to build its ``AgentSpec`` and tools."""

    agent_id: str
    task_id: str
    replica: int
    index: int  # position in the fleet (scheduling order within a wave)
    wave: int
    depends_on: tuple[str, ...]  # task ids
    model: str | None
    system: str | None
    prompt: str
    tools: tuple[str, ...]
    tool_choice: str | None
    max_rounds: int
    max_tokens: int | None
    temperature: float | None
    think_time_s: float
    tool_latency_s: float
    context_tokens: int
    tool_result_tokens: int

    def spec(
        self, model: str, dependency_results: Mapping[str, str] | None = None, handed_files: Sequence[str] = ()
    ) -> AgentSpec:
        """The agent's task as the loop runs it; the same plan, results and files always give the same messages.

        ``handed_files``: the dependencies' files copied into this agent's workspace (fleet/handoff.py), named in
        the prompt so the agent can read them.
        """
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        text = self.prompt.replace("{replica}", str(self.replica)).replace("{agent}", self.agent_id)
        if handed_files:
            # Part of the instruction (its first paragraph), not pasted material: the files are there to be read.
            text += "\nFiles from the tasks this one depends on, in your workspace: " + ", ".join(handed_files)
        if self.context_tokens:
            text += "\n\nContext:\n" + filler(self.agent_id, self.context_tokens)
        if dependency_results:
            parts = [f"[{dep}]\n{out}" for dep, out in dependency_results.items()]
            text += "\n\nResults of the tasks this one depends on:\n" + "\n\n".join(parts)
        messages.append({"role": "user", "content": text})
        choice: str | dict[str, Any] | None = self.tool_choice
        if choice is not None and choice not in ("auto", "required", "none"):
            choice = {"type": "function", "function": {"name": choice}}
        return AgentSpec(
            agent_id=self.agent_id,
            model=self.model or model,
            messages=messages,
            max_rounds=self.max_rounds,
            max_tokens=self.max_tokens,
            think_time_s=self.think_time_s,
            temperature=self.temperature,
            tool_choice=choice if self.tools else None,
        )

    def planned_context(self) -> int:
        """Rough tokens this agent's context reaches by its last round (for the preflight's width estimate)."""
        # ~1.3 tokens per English word in BPE vocabularies; the filler's words are common ones, about one each.
        words = len((self.system or "").split()) + len(self.prompt.split())
        per_round = (self.max_tokens or 256) + (self.tool_result_tokens if self.tools else 0)
        return int(words * 1.3) + self.context_tokens + self.max_rounds * per_round


_FILLER_TEXT = (
    "module function returns value config parser request handler cache layer index query result error retry "
    "timeout session token buffer stream client server worker queue batch schedule thread lock event signal "
    "metric counter gauge histogram build test patch review commit branch merge deploy release rollback trace "
    "span log level debug warning field schema table column row key hash block page memory disk network socket "
    "packet header body payload encode decode compress checksum version upgrade migrate backup restore replica "
    "shard partition leader follower vote term election snapshot compaction offset cursor iterator generator"
)
_FILLER_WORDS = _FILLER_TEXT.split()


def filler(seed: str, words: int) -> str:
    """``words`` words of plausible technical text, the same for the same seed in every process."""
    rng = random.Random(seed)  # str seeds hash with SHA-512: stable across runs and PYTHONHASHSEED
    out = rng.choices(_FILLER_WORDS, k=words)
    return " ".join(out)


def parse_fleet(text: str, source: str = "fleet file") -> FleetConfig:
    data = parse_toml(text, source)
    try:
        fleet = FleetConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _location(first["loc"], data)
        raise ConfigError(f"{source}: {where}: {first['msg']}") from exc
    check_fleet(fleet, source)
    return fleet


def load_fleet(path: Path) -> FleetConfig:
    text = read_text(path, "fleet file")
    data_name = path.stem if _ID.match(path.stem) else "fleet"
    fleet = parse_fleet(text, str(path))
    if "name" not in fleet.model_fields_set:
        fleet = fleet.model_copy(update={"name": data_name})
    return fleet


def _location(loc: Sequence[int | str], data: Mapping[str, Any]) -> str:
    """A pydantic error location as the user wrote it: ``tasks[2] (id "review").max_rounds``."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
            tasks = data.get("tasks")
            if i == 1 and loc[0] == "tasks" and isinstance(tasks, list) and part < len(tasks):
                task = tasks[part]
                if isinstance(task, Mapping) and isinstance(task.get("id"), str):
                    out += f' (id "{task["id"]}")'
        else:
            out += ("." if out else "") + part
    return out or "file"


def check_fleet(fleet: FleetConfig, source: str = "fleet file") -> None:
    """Ids unique, tools known, dependencies known and acyclic; raise one ConfigError for the first problem."""
    seen: set[str] = set()
    for task in fleet.tasks:
        if task.id in seen:
            raise ConfigError(f"{source}: task id {task.id!r} is used twice")
        seen.add(task.id)
    agents = sum(t.count for t in fleet.tasks)
    if agents > MAX_AGENTS:
        raise ConfigError(f"{source}: {agents:,} agents in all; a fleet holds at most {MAX_AGENTS:,}")
    known = ", ".join(sorted(BUILTIN_TOOLS))
    for where, settings in [("[defaults]", fleet.defaults), *((f"task {t.id!r}", t) for t in fleet.tasks)]:
        for name in settings.tools or []:
            if name not in BUILTIN_TOOLS:
                raise ConfigError(f"{source}: {where} names unknown tool {name!r}; built-in tools: {known}")
    for task in fleet.tasks:
        tools = task.tools if task.tools is not None else fleet.defaults.tools or []
        choice = task.tool_choice or fleet.defaults.tool_choice
        if choice not in (None, "auto", "required", "none") and choice not in tools:
            raise ConfigError(f"{source}: task {task.id!r} forces tool {choice!r}, which it does not have")
        for dep in task.depends_on:
            if dep not in seen:
                raise ConfigError(f"{source}: task {task.id!r} depends on {dep!r}, which no task defines")
    cycle = _find_cycle({t.id: t.depends_on for t in fleet.tasks})
    if cycle:
        raise ConfigError(f"{source}: dependency cycle: {' → '.join(cycle)}")


def _find_cycle(graph: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A dependency cycle as a path that returns to its start, or None (iterative DFS, three colours)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    for root in graph:
        if state.get(root):
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0:
                state[node] = 1
                path.append(node)
            deps = graph[node]
            if i < len(deps):
                stack.append((node, i + 1))
                nxt = deps[i]
                if state.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if not state.get(nxt):
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                path.pop()
    return None


def _waves(fleet: FleetConfig) -> dict[str, int]:
    """Each task's wave: 0 without dependencies, else one past its deepest dependency's.

    Iterative (a post-order walk with an explicit stack): a dependency chain is as long as the file makes it, and
    recursion died on a chain of 350 tasks. The graph is acyclic (``check_fleet``).
    """
    depth: dict[str, int] = {}
    by_id = {t.id: t for t in fleet.tasks}
    for t in fleet.tasks:
        stack = [t.id]
        while stack:
            tid = stack[-1]
            if tid in depth:
                stack.pop()
                continue
            pending = [d for d in by_id[tid].depends_on if d not in depth]
            if pending:
                stack.extend(pending)
                continue
            deps = by_id[tid].depends_on
            depth[tid] = 1 + max(depth[d] for d in deps) if deps else 0
            stack.pop()
    return depth


def expand(fleet: FleetConfig) -> list[AgentPlan]:
    """One plan per agent, in scheduling order (wave, then file order, then replica)."""
    waves = _waves(fleet)
    d = fleet.defaults
    plans: list[AgentPlan] = []
    for task in sorted(fleet.tasks, key=lambda t: waves[t.id]):
        width = len(str(task.count - 1))
        for r in range(task.count):
            agent_id = task.id if task.count == 1 else f"{task.id}.{r:0{width}d}"
            plans.append(
                AgentPlan(
                    agent_id=agent_id,
                    task_id=task.id,
                    replica=r,
                    index=len(plans),
                    wave=waves[task.id],
                    depends_on=tuple(task.depends_on),
                    model=_pick(task.model, d.model),
                    system=_pick(task.system, d.system),
                    prompt=task.prompt,
                    tools=tuple(_pick(task.tools, d.tools) or ()),
                    tool_choice=_pick(task.tool_choice, d.tool_choice),
                    max_rounds=_pick(task.max_rounds, d.max_rounds) or DEFAULT_MAX_ROUNDS,
                    max_tokens=_pick(task.max_tokens, d.max_tokens),
                    temperature=_pick(task.temperature, d.temperature),
                    think_time_s=_pick(task.think_time_s, d.think_time_s) or 0.0,
                    tool_latency_s=_pick(task.tool_latency_s, d.tool_latency_s) or 0.0,
                    context_tokens=_pick(task.context_tokens, d.context_tokens) or 0,
                    tool_result_tokens=_pick(task.tool_result_tokens, d.tool_result_tokens)
                    or DEFAULT_TOOL_RESULT_TOKENS,
                )
            )
    return plans


def _pick(own: T | None, default: T | None) -> T | None:
    return own if own is not None else default
