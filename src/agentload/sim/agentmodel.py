"""``AgentBehaviour``: a simulated model that finishes multi-step tool tasks the way a careful model would.

Filler text is the right load but no use to someone rehearsing their own agent harness. This behaviour reads the
conversation with rules instead of weights, deterministically for a seed:

* **a plan** — the request is cut into clauses ("…, then …" orders them); each offered tool is scored against
  each clause (``agent_tools``) by the words its name (its verb most), description and parameters share with it,
  plus evidence (an ID wants a tool that takes an id, "3 * 7" a calculator, "42 km to miles" a converter). A tool
  that changes the world (add, send, ``list_remove``…) is only used when the request asks for that act.
  ``tool_choice`` is honoured: ``none`` answers, ``required`` and a named function always call (the best-scoring
  tool, with the best values found, when nothing fits).
* **arguments** (``agent_fill``, ``agent_extract``) — each value from the clause that asked for the tool, then
  the request, then earlier results: IDs of common shapes, quoted and capitalised names, cities, numbers with
  units, dates, files, URLs, the object of a search verb, enum values from the schema. Optional parameters only
  when the request grounds them. Several candidates in a clause ("add 'a', 'b' and 'c'") fan out into calls
  (four at most); a turn's calls are kept within its ``max_tokens`` (long text shortened) so none is cut mid-JSON.
  Material the request carries under a heading ("Context:") is data, not steps to plan.
* **chaining** (``agent_chain``) — later clauses wait for earlier ones; a value a step needs comes from a result
  (a ``customer_id`` a lookup returned, numbers a file gave for the calculator); a record naming a relative the
  request asks about ("their manager" → ``manager_id``) is looked up before what depends on it; a result that
  names the next step (a ``next_key``, "see next.md", a URL) is followed with a tool already in use or one the
  request points at; a tool error that lists the valid values is retried once with the closest one. It stops
  when every clause's tools have answered and no result points further, or after ``max_rounds`` rounds.
* **the answer** (``agent_answer``) — sentences built from the results and the request; raw JSON when asked;
  the computed number for arithmetic; it refuses when no tool can do an asked act, asks when a required value is
  missing; instructions inside tool results are data, never followed.
* **rehearsing failures** — with probability ``error_rate`` a turn goes wrong in one of three named ways: a wrong
  tool, a bad argument, an invented fact.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentload.errors import ConfigError
from agentload.sim import agent_extract as ex
from agentload.sim.agent_answer import arithmetic, compose
from agentload.sim.agent_chain import follow, relation, retry
from agentload.sim.agent_conv import Conversation, canonical
from agentload.sim.agent_fill import Filler, Unfilled, schema_props
from agentload.sim.agent_tools import AgentTool, fits
from agentload.sim.behaviour import PlannedCall, Reply, Turn
from agentload.sim.tokens import split_tokens, tokenize

MISTAKES = ("wrong-tool", "bad-argument", "invented-fact")

# What a request asks the model to do when no tool can (said in the refusal).
_ASKED_ACT = re.compile(
    r"^(?:please\s+|can you\s+|could you\s+)?(text|sms|message|send|email|e-mail|call|phone|ring|book|order|buy|"
    r"pay|transfer|post|tweet|delete|cancel|print|upload|publish|schedule|notify)\b",
    re.I,
)


# A call fans out over at most this many of the values a clause names ("read a.md, b.md, c.md …"): a sample of a
# long list, so one turn's calls stay few.
_FAN_OUT = 4


@dataclass
class _Step:
    tool: AgentTool
    clause: ex.Clause


@dataclass
class AgentBehaviour:
    """A rule-based tool-calling model; see the module docstring."""

    median_tokens: int = 48  # plain answers: lognormal word counts around this
    sigma: float = 0.6
    max_rounds: int = 60
    error_rate: float = 0.0
    name: str = "agent"
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"agent error rate must be in [0, 1], got {self.error_rate}")
        if self.max_rounds < 1:
            raise ConfigError("the agent behaviour needs at least one round")

    def reply(self, turn: Turn) -> Reply:
        mistake = turn.rng.choice(MISTAKES) if self.error_rate and turn.rng.random() < self.error_rate else None
        conv = Conversation.read(turn.messages)
        tools = [AgentTool.of(t) for t in turn.tools if isinstance(t.function.name, str) and t.function.name]
        choice = turn.tool_choice
        named = _named_choice(choice)
        if choice == "none" or not tools:
            return Reply(content=self._answer(conv, tools, turn, mistake))
        if named is not None:
            tool = next((t for t in tools if t.name == named), None)
            if tool is None:
                return Reply(tool_calls=[PlannedCall(named, "{}")])
            if tool.final:
                return self._final(tool, conv, tools, turn, mistake)
            return Reply(tool_calls=[self._best_effort(tool, conv)])
        calls: list[PlannedCall] = []
        missing: str | None = None
        if conv.rounds < self.max_rounds:
            calls, missing = self._next_calls(conv, tools)
        if calls:
            return Reply(tool_calls=_mistaken(_within(calls, turn), tools, mistake, turn))
        required = choice == "required"
        final = next((t for t in tools if t.final), None)
        if final is not None and (conv.results or required or not missing):
            return self._final(final, conv, tools, turn, mistake)
        if required:
            best = max(tools, key=lambda t: t.score(conv.request)[0])
            return Reply(tool_calls=[self._best_effort(best, conv)])
        if missing and not conv.results:
            return Reply(content=f"I can do that, but I need to know the {missing} first. What should I use? ")
        return Reply(content=self._answer(conv, tools, turn, mistake))

    # -- planning ------------------------------------------------------------------------------------------------

    def _steps(self, conv: Conversation, tools: list[AgentTool]) -> list[_Step]:
        clauses = ex.clauses(conv.instruction)
        steps: list[_Step] = []
        usable = [t for t in tools if not t.final]
        for tool in usable:
            whole_score, whole_named = tool.score(conv.instruction)
            scored = [(tool.score(c.text, capped=False), i) for i, c in enumerate(clauses)]
            (score, _), index = max(scored, key=lambda s: (s[0][0], -s[1]))
            if not (fits(*tool.score(clauses[index].text)) or (fits(whole_score, whole_named) and score > 0)):
                continue
            steps.append(_Step(tool, clauses[index]))
        # Tools on the same thing ("list_add", "list_show") in one clause: the verb the clause uses decides.
        kept: list[_Step] = []
        for s in steps:
            rivals = [o for o in steps if o is not s and o.clause == s.clause and set(o.tool.parts) & set(s.tool.parts)]
            if rivals and not s.tool.score(s.clause.text)[1] and any(o.tool.score(o.clause.text)[1] for o in rivals):
                continue
            kept.append(s)
        return sorted(kept, key=lambda s: s.clause.group)

    def _next_calls(self, conv: Conversation, tools: list[AgentTool]) -> tuple[list[PlannedCall], str | None]:
        again = retry(conv) or relation(conv, tools)
        if again is not None:
            return [again], None
        steps = self._steps(conv, tools)
        answer = compose(conv, {t.name for t in tools if t.acting}) if conv.results else ""
        missing: str | None = None
        groups = sorted({s.clause.group for s in steps})
        for group in groups:
            wave = [s for s in steps if s.clause.group == group]
            readers = [s for s in wave if not s.tool.acting]
            pending: list[PlannedCall] = []
            waiting = False
            for s in readers + [s for s in wave if s.tool.acting]:
                if s.tool.acting and any(_undone(r, conv, answer) for r in readers):
                    waiting = True
                    continue  # an act waits for what the reading tools find
                try:
                    todo = _undone(s, conv, answer)
                except Unfilled as exc:
                    missing = missing or str(exc).replace("_", " ")
                    waiting = True
                    continue
                pending += todo
            if pending:
                return pending, None
            if waiting and conv.results:
                break
            if waiting:
                return [], missing
        chained = follow(conv, tools)
        return ([chained] if chained else []), missing

    # -- answers -------------------------------------------------------------------------------------------------

    def _answer(self, conv: Conversation, tools: list[AgentTool], turn: Turn, mistake: str | None) -> str:
        if conv.results:
            text = compose(conv, {t.name for t in tools if t.acting})
            if mistake == "invented-fact":
                text += f" The total comes to {turn.rng.randint(11, 99)}.{turn.rng.randint(10, 99)} EUR."
            return text + " "
        return self._plain(conv, tools, turn) + " "

    def _final(
        self, final: AgentTool, conv: Conversation, tools: list[AgentTool], turn: Turn, mistake: str | None
    ) -> Reply:
        text = self._answer(conv, tools, turn, mistake).strip()
        props, required = schema_props(final.tool)
        key = (required or list(props) or ["answer"])[0]
        return Reply(tool_calls=[PlannedCall(final.name, json.dumps({key: text}, ensure_ascii=False))])

    def _plain(self, conv: Conversation, tools: list[AgentTool], turn: Turn) -> str:
        request = conv.request.strip()
        low = request.lower()
        if re.match(r"^(?:thanks|thank you|cheers|great|perfect|ok(?:ay)?|bye)\b", low):
            return "You're welcome. Let me know if there is anything else I can do."
        worked = arithmetic(request)
        if worked is not None:
            return f"The answer is {worked}"
        act = _ASKED_ACT.match(request)
        if act is not None and tools:
            verb = act.group(1).lower()
            verb = "send" if verb in ("text", "sms", "message", "email", "e-mail", "notify") else verb
            offered = ", ".join(t.name for t in tools)
            return (f"I cannot {verb} that for you: none of my tools can {verb} anything (I only have {offered}). "
                    f"You will need to do that yourself.")  # fmt: skip
        topic = _topic(request)
        sentences = [
            f"You asked about {topic}.",
            "None of the tools I have covers this, so I am answering from what you wrote." if tools else
            "I am answering from what you wrote, without any tool.",
            f"The short answer depends on what exactly you need to know about {topic}.",
            f"If you tell me more about {topic}, I can give a more precise answer.",
            "I have not looked anything up for this answer.",
        ]  # fmt: skip
        words = max(6, int(turn.rng.lognormvariate(0.0, self.sigma) * self.median_tokens))
        if turn.max_tokens is not None:
            words = min(words, max(6, turn.max_tokens))
        out: list[str] = []
        i = 0
        while sum(len(s.split()) for s in out) < words and i < 4 * len(sentences):
            out.append(sentences[i % len(sentences)])
            i += 1
        return " ".join(out)

    def _best_effort(self, tool: AgentTool, conv: Conversation) -> PlannedCall:
        """A forced call: the best values the conversation has; a type-correct placeholder only where none exists."""
        clause = max(ex.clauses(conv.instruction), key=lambda c: tool.score(c.text)[0]).text
        filler = Filler(tool.tool, conv, clause, acting=tool.acting, answer_text=_answer_text(conv, tool))
        try:
            return PlannedCall(tool.name, json.dumps(filler.arguments(), ensure_ascii=False))
        except Unfilled:
            pass
        props, required = schema_props(tool.tool)
        out: dict[str, Any] = {}
        for key in required:
            try:
                out[key] = Filler(tool.tool, conv, clause).value(key, props.get(key), required=True)
            except Unfilled:
                kind = props.get(key, {}).get("type") if isinstance(props.get(key), dict) else "string"
                defaults = {"integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}
                out[key] = defaults.get(kind, _topic(clause)) if isinstance(kind, str) else ""
        return PlannedCall(tool.name, json.dumps(out, ensure_ascii=False))


def _named_choice(choice: Any) -> str | None:
    if isinstance(choice, dict):
        fn = choice.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return str(fn["name"])
        if isinstance(choice.get("name"), str):
            return str(choice["name"])
    return None


def _answer_text(conv: Conversation, tool: AgentTool) -> str:
    return compose(conv, set()) if conv.results and tool.acting else ""


def _undone(step: _Step, conv: Conversation, answer: str) -> list[PlannedCall]:
    """The calls a step still needs (one per candidate value the clause names); Unfilled when a value is missing."""
    out: list[PlannedCall] = []
    seen: list[dict[str, Any]] = []
    if not step.tool.acting and any(n == step.tool.name for n, _ in conv.calls):
        return []  # read once: a lookup is not redone because its arguments would now be phrased differently
    for alt in range(_FAN_OUT):
        filler = Filler(step.tool.tool, conv, step.clause.text, alt, step.tool.acting, answer)
        args = filler.arguments()
        if args in seen:
            break
        seen.append(args)
        if (step.tool.name, canonical(args)) not in conv.made and not _same_act_done(step, conv, args):
            out.append(PlannedCall(step.tool.name, json.dumps(args, ensure_ascii=False)))
        if filler.fanned is None:
            break
    return out


def _same_act_done(step: _Step, conv: Conversation, args: dict[str, Any]) -> bool:
    """A content-writing act already done once is not redone because the text it would write has grown."""
    if not step.tool.acting:
        return False
    _, required = schema_props(step.tool.tool)
    keys = [k for k in required if not re.search(r"content|body|text|message|summary", k)]
    return any(n == step.tool.name and all(a.get(k) == args.get(k) for k in keys) for n, a in conv.calls)


def _cost(calls: list[PlannedCall]) -> int:
    """About the tokens the server counts for these calls: each argument piece one token, and each call's markup
    (the end of the call before it, its opening and name) as the tokeniser splits it, with a little to spare."""
    markup = sum(len(tokenize(f'}}\n</tool_call>\n<tool_call>\n{{"name": "{c.name}", "arguments": ')) for c in calls)
    args = sum(len(split_tokens(c.arguments or "{}")) for c in calls)
    return markup + args + 4


def _within(calls: list[PlannedCall], turn: Turn) -> list[PlannedCall]:
    """Calls that fit the turn's output cap: a cut-off call is broken JSON, so a careful model writes less — long
    text values shortened first, then the last calls left out."""
    budget = min(turn.max_tokens or turn.max_output, turn.max_output)
    calls = list(calls)
    while _cost(calls) > budget:
        longest = max(
            ((i, k, v) for i, c in enumerate(calls) for k, v in _args(c).items() if isinstance(v, str) and len(v) > 40),
            key=lambda f: len(f[2]),
            default=None,
        )
        if longest is None:
            break
        i, key, text = longest
        words = text.split()
        args = {**_args(calls[i]), key: " ".join(words[: max(4, len(words) * 2 // 3)]) + " …"}
        if len(args[key]) >= len(text):
            break
        calls[i] = PlannedCall(calls[i].name, json.dumps(args, ensure_ascii=False))
    while _cost(calls) > budget and len(calls) > 1:
        calls.pop()
    return calls


def _args(call: PlannedCall) -> dict[str, Any]:
    parsed = json.loads(call.arguments or "{}")
    return parsed if isinstance(parsed, dict) else {}


def _mistaken(planned: list[PlannedCall], tools: list[AgentTool], mistake: str | None, turn: Turn) -> list[PlannedCall]:
    if mistake == "wrong-tool":
        others = [t.name for t in tools if t.name not in {p.name for p in planned}]
        if others:
            return [PlannedCall(turn.rng.choice(others), planned[0].arguments), *planned[1:]]
        mistake = "bad-argument"
    if mistake == "bad-argument":
        args = json.loads(planned[0].arguments)
        if isinstance(args, dict) and args:
            key = sorted(args)[0]
            args[key] = None if isinstance(args[key], str) else "not-a-value"
            return [PlannedCall(planned[0].name, json.dumps(args)), *planned[1:]]
    return planned


def _topic(request: str, limit: int = 10) -> str:
    first = ex.sentences(request)[0] if request.strip() else ""
    first = re.sub(r"^(?:please\s+)?(?:can you\s+|could you\s+)?(?:tell me|explain|describe|what is|what's|what are|"
                   r"who is|how do i|how does|how to|write)\s+(?:about\s+)?", "", first, flags=re.I)  # fmt: skip
    words = first.strip(" ?.!").split()[:limit]
    return " ".join(words) or "your question"
