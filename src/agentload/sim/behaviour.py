"""What the simulated model says: a pluggable behaviour.

* ``FillerBehaviour`` — load: filler text of the requested length (or a lognormal sample when the request sets
  no limit), and a syntactically valid tool call when the request forces one.
* ``OracleBehaviour`` — the hook for the behaviour suite: a conversation that opens the way a scenario registered
  in a ``ScenarioBook`` opens (its ``Opening``: the system prompt, the first user message and the names of the
  offered tools, equal up to white space) is answered by that scenario — correctly, or, with probability
  ``error_rate`` or always when ``known_bad`` names one, by one of the scenario's named known-bad behaviours, so
  every scorer can be shown to fail when it should. The suite sends a server nothing but its tests' own prompts, so
  the oracle recognises a test by what its conversation says, never by a tag added for it. A hand-written client
  may still name a scenario outright with ``[agentload:scenario=ID]`` in its system prompt (``MARKER``): the
  built-in scenarios, which have no fixed opening, are reached only that way. Three known-bad behaviours are
  generic (``GENERIC_BAD``): ``refuse``, and two cheats a weak model uses — ``echo-result`` (the raw tool results
  handed back as the answer) and ``placeholder-args`` (every offered tool called with placeholders, then an
  invented outcome). Any other conversation gets the fallback behaviour.
* ``GuardedBehaviour`` — what the server actually calls: any behaviour, unable to turn a request into a 500.

A reply becomes a list of token pieces; each piece is one generated token (the engine emits one per step), and
its text is what the tokenizer would cut from the rendered reply, so the next turn's prompt re-hits the cache.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agentload.errors import ConfigError
from agentload.sim.chat import Message, Tool
from agentload.sim.tokens import split_tokens

log = logging.getLogger("agentload.sim")

# Plain English filler: every word is one token of the simulator's tokenizer ("word ").
_WORDS = [
    "the",
    "agent",
    "reads",
    "the",
    "file",
    "and",
    "then",
    "runs",
    "a",
    "test",
    "to",
    "check",
    "the",
    "result",
    "before",
    "it",
    "writes",
    "a",
    "patch",
    "for",
    "the",
    "failing",
    "build",
    "so",
    "that",
    "every",
    "step",
    "of",
    "the",
    "plan",
    "is",
    "verified",
    "with",
    "tools",
    "and",
    "logs",
    "while",
    "the",
    "context",
    "grows",
    "with",
    "each",
    "turn",
    "of",
    "the",
    "session",
    "until",
    "the",
    "task",
    "is",
    "done",
]


@dataclass(frozen=True)
class Piece:
    """One generated token: content text, the start of a tool call (carries its name), or argument text."""

    kind: Literal["content", "call_start", "call_args"]
    text: str
    call_index: int = 0
    name: str = ""  # the tool's name, on a call_start piece


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: str  # a JSON object as text


@dataclass
class Reply:
    content: str = ""
    tool_calls: list[PlannedCall] = field(default_factory=list)

    def pieces(self) -> list[Piece]:
        out = [Piece("content", p) for p in split_tokens(self.content)] if self.content else []
        for i, call in enumerate(self.tool_calls):
            # The call's opening tag and name are one token; its arguments are tokenized like any text.
            out.append(Piece("call_start", f'<tool_call>\n{{"name": "{call.name}", "arguments": ', i, call.name))
            out.extend(Piece("call_args", p, i) for p in split_tokens(call.arguments or "{}"))
        return out


@dataclass
class Turn:
    """What a behaviour sees of one request."""

    messages: list[Message]
    tools: list[Tool]
    tool_choice: str | dict[str, Any] | None
    max_tokens: int | None  # what the request asked for
    max_output: int  # the hard cap: max_model_len − prompt tokens
    rng: random.Random

    def system_text(self) -> str:
        return "\n".join(m.text() for m in self.messages if m.role in ("system", "developer"))

    def opening(self) -> Opening:
        """How this conversation began: its system text before the first user message, that message, the tools."""
        system: list[str] = []
        user = ""
        for m in self.messages:
            if m.role == "user":
                user = m.text()
                break
            if m.role in ("system", "developer"):
                system.append(m.text())
        return Opening("\n".join(system), user, tuple(t.function.name for t in self.tools))

    def last_user_text(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user":
                return m.text()
        return ""

    def forced_tool(self) -> str | None:
        tc = self.tool_choice
        if isinstance(tc, dict):
            fn = tc.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return str(fn["name"])
        if tc == "required" and self.tools:
            return self.tools[0].function.name
        return None


class Behaviour(Protocol):
    name: str

    def reply(self, turn: Turn) -> Reply: ...


def _placeholder_args(tool: Tool | None) -> str:
    """Arguments for a forced call: every required property gets a value of its declared type."""
    if tool is None:
        return "{}"
    # A client's schema may be any JSON (a fuzzer sends "properties": null): read only what fits.
    params = tool.function.parameters if isinstance(tool.function.parameters, dict) else {}
    found = params.get("properties")
    props: dict[str, Any] = found if isinstance(found, dict) else {}
    required = params.get("required", list(props))
    keys = [k for k in required if isinstance(k, str) and k in props] if isinstance(required, list) else []
    defaults = {"string": "example", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    args = {}
    for k in keys:
        kind = props[k].get("type", "string") if isinstance(props[k], dict) else "string"
        args[k] = defaults.get(kind, "example") if isinstance(kind, str) else "example"
    return json.dumps(args)


@dataclass
class FillerBehaviour:
    """Filler of the requested length; lognormal lengths (median ``median_tokens``) when no limit is set."""

    median_tokens: int = 256
    sigma: float = 0.7
    name: str = "filler"

    def length(self, turn: Turn) -> int:
        if turn.max_tokens is not None:
            return max(1, min(turn.max_tokens, turn.max_output))
        sampled = int(turn.rng.lognormvariate(0.0, self.sigma) * self.median_tokens)
        return max(1, min(sampled, turn.max_output))

    def reply(self, turn: Turn) -> Reply:
        forced = turn.forced_tool()
        if forced is not None:
            tool = next((t for t in turn.tools if t.function.name == forced), None)
            return Reply(tool_calls=[PlannedCall(forced, _placeholder_args(tool))])
        n = self.length(turn)
        words = turn.rng.choices(_WORDS, k=n)
        return Reply(content=" ".join(words) + " ")


ScenarioFn = Callable[[Turn], Reply]


def _squash(text: str) -> str:
    return " ".join(text.split())


OpeningKey = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True)
class Opening:
    """What a scenario's conversation opens with: the system prompt, the first user message, the offered tools.

    Two openings are the same when their texts are equal after white space is collapsed (a client may re-wrap or
    trim a prompt) and they offer the same tool names in any order; nothing looser, so a conversation that only
    resembles a test — another system prompt, another request, other tools — is not taken for it.
    """

    system: str
    user: str
    tools: tuple[str, ...] = ()

    def key(self) -> OpeningKey:
        return _squash(self.system), _squash(self.user), tuple(sorted(self.tools))


@dataclass(frozen=True)
class Scenario:
    """One behaviour-suite test as the oracle plays it: the correct reply and named known-bad replies, and the
    openings of the conversations it answers (none: it is reached only by name, through ``MARKER``)."""

    id: str
    correct: ScenarioFn
    bad: Mapping[str, ScenarioFn] = field(default_factory=dict)
    openings: tuple[Opening, ...] = ()


MARKER = re.compile(r"\[agentload:scenario=([A-Za-z0-9_.:-]+)\]")


class ScenarioBook:
    """The scenarios an oracle knows, by id and by the openings they answer; the behaviour suite registers its
    tests here."""

    def __init__(self, scenarios: Iterable[Scenario] = ()) -> None:
        self._by_id: dict[str, Scenario] = {}
        self._by_opening: dict[OpeningKey, Scenario] = {}
        for s in scenarios:
            self.register(s)

    def register(self, scenario: Scenario) -> None:
        if scenario.id in self._by_id:
            raise ConfigError(f"scenario {scenario.id!r} is registered twice")
        keys = {o.key() for o in scenario.openings}
        for key in keys:
            other = self._by_opening.get(key)
            if other is not None:
                # Two scenarios on one opening: the oracle could not tell which test a conversation is.
                raise ConfigError(f"scenarios {other.id!r} and {scenario.id!r} open the same conversation")
        self._by_id[scenario.id] = scenario
        self._by_opening.update(dict.fromkeys(keys, scenario))

    def get(self, scenario_id: str) -> Scenario | None:
        return self._by_id.get(scenario_id)

    def recognise(self, turn: Turn) -> Scenario | None:
        """The scenario whose opening this conversation has, else the one its system prompt names, else None."""
        found = self._by_opening.get(turn.opening().key())
        if found is not None:
            return found
        named = MARKER.search(turn.system_text())
        return self._by_id.get(named.group(1)) if named else None

    def ids(self) -> list[str]:
        return sorted(self._by_id)

    def bad_names(self) -> set[str]:
        return {name for s in self._by_id.values() for name in s.bad}


def _refuse(turn: Turn) -> Reply:
    """The generic known-bad reply: prose that calls no tool and answers nothing."""
    return Reply(content="I am not able to help with that right now. ")


def _since_user(turn: Turn) -> list[Message]:
    for i in range(len(turn.messages) - 1, -1, -1):
        if turn.messages[i].role == "user":
            return turn.messages[i + 1 :]
    return []


def _echo_result(scenario: Scenario, turn: Turn) -> Reply:
    """Cheat: make the calls the test wants, then hand back the raw tool results as the answer.

    With no tool to call it echoes the request. A scorer that a bare ``404``, ``null`` or error string satisfies
    ("said it was not found") passes this; every test must fail it.
    """
    since = _since_user(turn)
    if since and since[-1].role in ("tool", "function"):
        start = max((i for i, m in enumerate(since) if m.role == "assistant"), default=-1) + 1
        return Reply(content="\n".join(m.text() for m in since[start:]))
    first = scenario.correct(turn)
    return first if first.tool_calls else Reply(content=turn.last_user_text())


def _placeholder_calls(scenario: Scenario, turn: Turn) -> Reply:
    """Cheat: call every offered tool once with type-correct placeholders, then invent a confident answer."""
    if turn.tools and not any(m.tool_calls for m in _since_user(turn)):
        return Reply(tool_calls=[PlannedCall(t.function.name, _placeholder_args(t)) for t in turn.tools])
    return Reply(content="Done: I have taken care of that, and everything is in order now. ")


# Known-bad behaviours every scenario plays the same way, on top of the ones a scenario names itself.
GENERIC_BAD: dict[str, Callable[[Scenario, Turn], Reply]] = {
    "refuse": lambda _scenario, turn: _refuse(turn),
    "echo-result": _echo_result,
    "placeholder-args": _placeholder_calls,
}


@dataclass
class OracleBehaviour:
    book: ScenarioBook
    error_rate: float = 0.0
    known_bad: str | None = None
    fallback: Behaviour = field(default_factory=FillerBehaviour)
    name: str = "oracle"

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"oracle error rate must be in [0, 1], got {self.error_rate}")
        known = self.book.bad_names() | set(GENERIC_BAD)
        if self.known_bad is not None and self.known_bad not in known:
            raise ConfigError(f"unknown known-bad behaviour {self.known_bad!r}; known: {', '.join(sorted(known))}")

    def reply(self, turn: Turn) -> Reply:
        scenario = self.book.recognise(turn)
        if scenario is None:
            return self.fallback.reply(turn)
        try:
            return self._play(scenario, turn)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            # A scenario reads the tool results it expects; a foreign client's results (or none) are not those.
            log.warning("oracle scenario %s could not read this conversation (%s: %s); answering without it",
                        scenario.id, type(exc).__name__, exc)  # fmt: skip
            return self.fallback.reply(turn)

    def _play(self, scenario: Scenario, turn: Turn) -> Reply:
        if self.known_bad is not None:
            if self.known_bad in scenario.bad:
                return scenario.bad[self.known_bad](turn)
            return GENERIC_BAD.get(self.known_bad, GENERIC_BAD["refuse"])(scenario, turn)
        if self.error_rate and turn.rng.random() < self.error_rate:
            names = sorted(scenario.bad)
            return scenario.bad[turn.rng.choice(names)](turn) if names else _refuse(turn)
        return scenario.correct(turn)


@dataclass
class GuardedBehaviour:
    """Any behaviour, made unable to fail a request: what it cannot interpret gets a plain answer and one log line.

    The server wraps its behaviour in this: a foreign client sends content no behaviour was written
    for, and a reply is the model's business — never an HTTP 500.
    """

    inner: Behaviour
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.inner.name

    def reply(self, turn: Turn) -> Reply:
        try:
            reply = self.inner.reply(turn)
            reply.pieces()  # a malformed reply fails here, inside the guard, not in the response writer
            return reply
        except Exception as exc:  # the point of the guard: nothing a behaviour raises may reach HTTP
            log.warning("behaviour %s could not interpret a request (%s: %s); answered in plain text",
                        self.inner.name, type(exc).__name__, exc)  # fmt: skip
            return Reply(content="I could not make sense of that conversation; could you rephrase the request? ")


def guarded(behaviour: Behaviour) -> Behaviour:
    return behaviour if isinstance(behaviour, GuardedBehaviour) else GuardedBehaviour(behaviour)


def truncate(pieces: list[Piece], limit: int) -> tuple[list[Piece], bool]:
    """Cut a reply at ``limit`` tokens; True when it was cut (finish_reason "length")."""
    if len(pieces) <= limit:
        return pieces, False
    return pieces[:limit], True


def hold_eos(pieces: list[Piece], length: int, rng: random.Random) -> list[Piece]:
    """A plain reply made ``length`` tokens long, as vLLM's ``ignore_eos`` / ``min_tokens`` make a model go on.

    A real model held past its end-of-sequence token keeps generating text; the simulator appends filler words, so
    a behaviour whose answers are short (the agent model's ~48 words) still gives a benchmark exactly the output it
    asked for. A reply that calls a tool is left as it is: the simulator's model stops at the call (vLLM's tool
    parser would see whatever followed it as content, which no client asking for tools wants).
    """
    if len(pieces) >= length or any(p.kind != "content" for p in pieces):
        return pieces
    out = list(pieces)
    if out and not out[-1].text[-1:].isspace():
        # Re-tokenising must give back one token a piece, so the last word is closed before more are added.
        out[-1] = Piece("content", out[-1].text + " ")
    out.extend(Piece("content", w + " ") for w in rng.choices(_WORDS, k=length - len(out)))
    return out
