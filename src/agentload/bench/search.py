"""Which loads to run: a fixed sweep, or a knee search that brackets and bisects (far fewer agent-turns).

A level is *past the knee* by the one knee rule (``capacity.knee``: turns/s or tok/s falls, the prefix-hit rate
collapses, or TTFT jumps, against the smaller levels), or when it breaks the SLO. The knee is the largest agent
count that is not past it, with the level just past it as the evidence for the explanation.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentload.bench.analysis import explain_knee
from agentload.bench.results import Knee, KneeBound, KneeExplanation, LevelSummary
from agentload.capacity.knee import LevelSignals, Verdict, judge_all
from agentload.errors import ConfigError

Measure = Callable[[int], Awaitable[LevelSummary]]

# A knee is bracketed when the level past it has at most this many times its agents (or one more agent): a sweep
# of 24, 32 places the knee to a third; 16, 64 leaves 47 counts unmeasured between them.
BRACKET_RATIO = 1.5
# How many times a knee search bisects again when the final verdicts move its bracket (each time measures only
# levels inside the new bracket, so it ends; three is more than any search here has needed).
REBRACKETS = 3


def bounds(lo: int, hi: int | None, measured: list[int], turns: dict[int, int]) -> KneeBound:
    """What the measured levels say of a knee at ``lo`` with ``hi`` the first level past it (see ``KneeBound``).

    ``lo`` is only known to be before the knee when a smaller level was measured to judge it against, or when it
    is one agent (the baseline every rule compares with).
    """
    if turns.get(lo, 0) == 0:
        return "unmeasured"
    judged = lo == 1 or lo > min(measured)
    if hi is None:
        return "at_least" if judged else "unjudged"
    if not judged:
        return "below"
    return "bracketed" if hi - lo <= 1 or hi <= lo * BRACKET_RATIO else "between"


@dataclass(frozen=True)
class SearchStep:
    """One level the search measured and what it made of it then (a later level can move the verdicts)."""

    phase: str  # "doubling" / "bisecting" (the knee search) or "sweep"
    agents: int
    context: int
    past: bool  # past the knee, judged against the smaller levels measured so far
    reason: str  # why it is past ("" when it is not)
    lo: int | None  # the largest count at or before the knee so far
    hi: int | None  # the smallest count past it so far


StepHook = Callable[[SearchStep], None]

# One decimal number ("2", "0.5", ".5"): "ttft_p95=.s" is refused by the pattern, not by float() with a traceback.
_SLO = re.compile(r"^(ttft|itl|queue)_p(50|95|99)\s*(<=|=|<)\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s)?$")
MAX_SLO_S = 86_400.0  # a latency limit of a day is as good as none


@dataclass(frozen=True)
class Slo:
    metric: str  # ttft | itl | queue
    percentile: str  # p50 | p95 | p99
    limit_s: float

    def met(self, s: LevelSummary) -> bool:
        table = {"ttft": s.ttft_s, "itl": s.itl_s, "queue": s.queue_wait_s}[self.metric]
        value = getattr(table, self.percentile)
        return value is not None and value <= self.limit_s

    def __str__(self) -> str:
        return f"{self.metric}_{self.percentile} <= {self.limit_s:g}s"


def parse_slo(text: str) -> Slo:
    m = _SLO.match(text.strip().lower())
    if not m:
        raise ConfigError(f"--slo {text!r}: expected METRIC_pNN=VALUE[s|ms], e.g. ttft_p95=2s or itl_p99=80ms")
    metric, pct, _, value, unit = m.groups()
    limit = float(value) / (1000.0 if unit == "ms" else 1.0)
    if limit <= 0:
        raise ConfigError(f"--slo {text!r}: the limit must be positive")
    if limit > MAX_SLO_S:
        raise ConfigError(f"--slo {text!r}: the limit must be at most a day ({MAX_SLO_S:,.0f} s)")
    return Slo(metric, f"p{pct}", limit)


def signals(s: LevelSummary) -> LevelSignals:
    """What the knee rule reads of a measured level."""
    hit = s.prefix_hit_rate_effective  # an offload tier's loads are reuse too: not what a collapse means
    return LevelSignals(
        agents=s.agents,
        output_tps=s.output_tps,
        turns_per_s=s.turns_per_s,
        output_trusted=not (s.output_short or s.output_clamped),
        ttft_p50_s=s.ttft_s.p50,
        hit_rate=hit,
    )


@dataclass
class Search:
    measure: Measure
    tolerance: float = 0.10
    slo: Slo | None = None
    slots: int | None = None  # a slot-based server's parallel slots (llama.cpp -np), for the knee's explanation
    pinned: bool = False  # agents' turns named their slot (id_slot), for the knee's explanation
    levels: dict[int, LevelSummary] = field(default_factory=dict)
    context: int = 0  # the context this search measures at (for its steps)
    on_step: StepHook | None = None  # hears each level measured (the live dashboard's knee-search list)
    phase: str = "sweep"  # set by find_knee as it brackets, then bisects

    def _slo_ok(self, s: LevelSummary) -> bool:
        return self.slo is None or self.slo.met(s)

    def verdicts(self) -> dict[int, Verdict]:
        """Every measured level judged against the smaller ones (a level failing the SLO is not a reference)."""
        ok = [signals(s) for s in self.levels.values() if self._slo_ok(s)]
        out = judge_all(ok, self.tolerance)
        for n, s in self.levels.items():
            if not self._slo_ok(s):
                out[n] = Verdict(past=True, signals=("slo",), reasons=(f"misses {self.slo}",))
        return out

    async def probe(self, agents: int) -> bool:
        """Measure ``agents`` (once) and say whether it is at or before the knee."""
        new = agents not in self.levels
        if new:
            self.levels[agents] = await self.measure(agents)
        verdicts = self.verdicts()
        verdict = verdicts[agents]
        if new and self.on_step is not None:
            before = [n for n, v in verdicts.items() if not v.past]
            after = [n for n, v in verdicts.items() if v.past]
            self.on_step(SearchStep(self.phase, agents, self.context, verdict.past, verdict.reason if verdict.past
                                    else "", max(before, default=None), min(after, default=None)))  # fmt: skip
        return not verdict.past

    def bracket(self) -> tuple[int, int] | None:
        """(the largest level before the knee, the first past it), judged on every level measured; None when no
        level is past it or none before it."""
        verdicts = self.verdicts()
        past = [n for n, v in verdicts.items() if v.past]
        if not past:
            return None
        hi = min(past)
        before = [n for n in verdicts if n < hi]
        return (max(before), hi) if before else None

    def knee(self, lo: int | None, hi: int | None, context: int) -> Knee:
        criterion = "the knee rule (turns/s, tok/s, prefix-hit collapse, TTFT jump)" + (
            f" and {self.slo}" if self.slo else ""
        )
        turns = sum(s.requests_ok + s.requests_failed for s in self.levels.values())
        if lo is None:
            first = self.levels[min(self.levels)]
            why = KneeExplanation(cause="slo", summary=f"even {first.agents} agent(s) miss {self.slo}")
            return Knee(agents=0, context=context, criterion=criterion, explanation=why, agent_turns=turns,
                        decided_by="slo", bound="below", past_at=first.agents)  # fmt: skip
        good = self.levels[lo]
        bad = self.levels.get(hi) if hi is not None else None
        why = explain_knee(good, bad, slots=self.slots, pinned=self.pinned)
        verdict = self.verdicts().get(hi) if hi is not None else None
        if bad is not None and not self._slo_ok(bad) and why.cause == "compute_saturation":
            why = KneeExplanation(cause="slo", summary=f"past {lo} agents the level misses {self.slo}",
                                  evidence=why.evidence)  # fmt: skip
        decided = ""
        if verdict is not None and verdict.past:
            decided = verdict.decided_by
            why = why.model_copy(update={"summary": f"{why.summary.rstrip('.')}; decided by {verdict.reason}"})
        completed = {n: s.requests_ok for n, s in self.levels.items()}
        bound = bounds(lo, hi, sorted(self.levels), completed)
        if bound == "unmeasured":
            why = KneeExplanation(cause="none", summary=f"the level of {lo} agents completed no turn in its "
                                  "window, so no knee can be judged from it (a longer --window, or a workload "
                                  "that lasts past the warm-up)")  # fmt: skip
        return Knee(agents=lo, context=context, criterion=criterion, explanation=why, agent_turns=turns,
                    decided_by=decided, bound=bound, past_at=hi)  # fmt: skip


def with_ratio(knee: Knee, predicted: float | None) -> Knee:
    """The knee with measured ÷ predicted capacity as far as its measured levels bound it (``Knee.bound``)."""
    if not predicted or knee.bound in ("unmeasured", "unjudged"):
        note = {
            "unmeasured": "the knee level completed no turn",
            "unjudged": f"{knee.agents} agents, the smallest level measured, had no smaller level to be judged against",
        }.get(knee.bound, "no prediction")
        return knee.model_copy(update={"ratio_note": note})
    low = knee.agents / predicted
    high = (knee.past_at - 1) / predicted if knee.past_at is not None else None
    if knee.bound == "bracketed":
        return knee.model_copy(update={"measured_over_predicted": low})
    if knee.bound == "between":
        note = f"nothing was measured between {knee.agents} and {knee.past_at} agents"
        return knee.model_copy(update={"ratio_low": low, "ratio_high": high, "ratio_note": note})
    if knee.bound == "below":
        note = f"{knee.agents} agents, the smallest level measured, had no smaller level to be judged against"
        return knee.model_copy(update={"ratio_high": high, "ratio_note": note})
    note = f"no level up to {knee.agents} agents was past the knee"
    return knee.model_copy(update={"ratio_low": low, "ratio_note": note})


async def sweep(search: Search, agents: list[int], context: int) -> Knee:
    """Measure every count; the knee is the last count before the first one past it."""
    lo: int | None = None
    hi: int | None = None
    for n in sorted(agents):
        if await search.probe(n):
            if hi is None:
                lo = n
        elif hi is None and lo is not None:
            hi = n
    # Re-judge with the final best (a later level may have raised it).
    return search.knee(lo, hi, context)


async def find_knee(search: Search, context: int, *, max_agents: int = 1024) -> Knee:
    """Double from 1 agent until a level is past the knee, then bisect to the largest count before it.

    Doubling (not starting at the pool ÷ context estimate) is deliberate: a level past a KV cliff can still
    out-produce a single agent, so only a rising ladder of levels tells "past the knee" reliably; and the small
    levels it adds cost few agent-turns.
    """
    if max_agents < 1:
        raise ConfigError("the largest agent count to try must be at least 1")
    lo: int | None = None
    hi: int | None = None
    n = 1
    search.phase = "doubling"
    while True:
        if await search.probe(n):
            lo = n
            if n >= max_agents:
                return search.knee(lo, None, context)
            n = min(max_agents, n * 2)
        else:
            hi = n
            break
    if lo is None:
        return search.knee(None, hi, context)
    search.phase = "bisecting"
    for _ in range(REBRACKETS):
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await search.probe(mid):
                lo = mid
            else:
                hi = mid
        # A level measured while bisecting can move the verdicts of larger ones (it is a new reference below them):
        # judged on everything measured, the first level past the knee may be another one, to bisect towards.
        bracket = search.bracket()
        if bracket is None:  # no level is past the knee once all are judged: none was found
            return search.knee(max(search.levels), None, context)
        if bracket == (lo, hi):
            break
        lo, hi = bracket
    return search.knee(lo, hi, context)
