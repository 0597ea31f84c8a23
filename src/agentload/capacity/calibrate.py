"""Calibration: measure a server, fit the step-time coefficients, and write a profile the simulator can serve.

Issue #5, part 3. The server's own KV pool is read exactly (``endpoint.scrape``); latencies are measured:

* TTFT against prompt length — one request at a time, streamed, ``max_tokens`` 1, each prompt unique from its
  first token (a random nonce, then random words) so nothing is served from the prefix cache; a geometric ladder
  of lengths up to a good share of max_model_len, a few repeats, interleaved so drift touches every length alike.
* Inter-token latency against batch size and context — N streams at once (N = 1, 2, 4, …, within the pool) at
  two context lengths with long outputs (``ignore_eos``); the ITL of a run is the median gap between text chunks
  in the window where all N streams are decoding (after the last one's first token, before the first one ends),
  and the streams are closed as soon as that window holds enough gaps.

The fit uses the structure of ``StepTimeModel`` itself rather than a copy of its formulas: each coefficient's
feature is the model's own step time with that coefficient set to 1 and every other to 0, so a change to the
model changes the fit with it. A step costs max(compute, memory) + fixed; within one regime that is linear, so
every point is assigned a regime (TTFT points start compute-bound, ITL points memory-bound), the coefficients
are fitted by non-negative least squares on relative errors (``scipy.optimize.nnls``), the points reassigned to
whichever regime the fit says dominates, and the fit repeated until the assignment is stable.

What these measurements identify:

* ``prefill_s_per_token`` and ``attention_s_per_pair`` — the linear and quadratic terms of TTFT in new tokens;
* ``kv_s_per_token`` — the ITL slope in batch × context; ``request_s`` — the ITL slope in batch alone (a few µs
  per request: weakly determined, reported with its standard error);
* ``weights_s + step_s + layer_s × layers`` — only their sum, the decode intercept. ``step_s`` is set to the
  profile default (1e-4 s, docs/background.md §6), ``layer_s`` to 0, and ``weights_s`` takes the rest;
* ``api_overhead_s + step_s + request_s`` plus the network round trip — the TTFT intercept. The round trip of a
  trivial request (``GET /v1/models``) is measured and subtracted, so the profile holds the server's own overhead.

The server's tokenizer is read too, where it offers ``/tokenize`` (vLLM, SGLang, llama.cpp): how many tokens it
makes of each word agentload's workloads write (``CalibrationPlan.words``), so the simulator serving the profile
counts that text as the server does (``sim.tokens.Tokenizer``); without ``/tokenize``, only the tokens per word
the calibration prompts' usage showed.

Structure that is not timing — MoE expert counts, sliding windows, layer counts — comes from the catalogue model
when the served model is in the catalogue; otherwise the profile embeds a generic dense model whose only role is
to carry the pinned coefficients.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tomli_w
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import nnls

from agentload.capacity import catalog
from agentload.capacity.kv import parse_kv_dtype
from agentload.capacity.models import ModelSpec
from agentload.capacity.profile import MAX_TEMPLATE_TOKENS, MAX_WORD_PIECES, StepSpec, mean_word_tokens, parse_profile
from agentload.capacity.steptime import StepCoefficients, StepTimeModel
from agentload.endpoint.scrape import ServedModel, ServerPool, StopRule, StreamTiming
from agentload.errors import CalibrationError, ConfigError, EndpointResponseError, ServerCapabilityError

# The coefficients the fit estimates, and which part of a step each belongs to.
FITTED = ("prefill_s_per_token", "attention_s_per_pair", "weights_s", "kv_s_per_token", "request_s")
_GROUP = {
    "prefill_s_per_token": "compute",
    "attention_s_per_pair": "compute",
    "weights_s": "memory",
    "kv_s_per_token": "memory",
    "request_s": "fixed",
}
_TIMING = (*FITTED, "step_s", "layer_s", "api_overhead_s")

# Common English words: one token each with a leading space on the usual tokenizers, one in the simulator's.
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue side "
    "kind head house service friend father power hour game line end member law car city community name"
)
_WORDS = _WORD_TEXT.split()
_TOKENIZE_AT_ONCE = 8  # /tokenize requests in flight while measuring the tokenizer's split of words


class CalibrationTarget(Protocol):
    """What calibration needs of a server (``endpoint.scrape.ServerProbe`` over HTTP; a fake in tests)."""

    async def models(self) -> list[ServedModel]: ...

    async def pool(self) -> ServerPool: ...

    async def round_trip(self) -> float: ...

    async def stream_completion(self, body: Mapping[str, Any], stop: StopRule | None = None) -> StreamTiming: ...

    async def count_tokens(self, model: str, text: str) -> int | None: ...

    async def count_chat_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int | None: ...


class ProgressSink(Protocol):
    """Where measurement progress goes (the CLI draws it with rich)."""

    def phase(self, description: str, total: int) -> None: ...

    def advance(self) -> None: ...


class _Silent:
    def phase(self, description: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass


class CalibrationPlan(BaseModel):
    """Which loads to run. The defaults suit a GPU server; tests use smaller plans."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_lengths: tuple[int, ...] | None = Field(default=None, description="prompt tokens; None = a ladder")
    ttft_points: int = Field(default=7, ge=3)
    ttft_min_tokens: int = Field(default=128, gt=0)
    ttft_max_share: float = Field(default=0.5, gt=0, le=0.95, description="longest prompt / max_model_len")
    ttft_max_tokens: int = Field(default=32768, gt=0)
    ttft_repeats: int = Field(default=3, ge=1)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    itl_contexts: tuple[int, ...] | None = Field(default=None, description="context tokens; None = two")
    steady_tokens: int = Field(default=48, ge=4, description="output tokens wanted in the steady window")
    min_gaps: int = Field(default=8, ge=2, description="fewest steady gaps per stream for a usable ITL point")
    # A steady window lasts about a second at batch 1; one per point let a second of a faster (or slower) machine
    # set the whole decode fit (it once left the calibrated simulator 10 % fast at every level of a quiet run).
    itl_repeats: int = Field(default=2, ge=1, description="passes over every (context, batch) point, interleaved")
    pool_share: float = Field(default=0.8, gt=0, le=1, description="most of the pool the ITL streams may hold")
    step_s: float = Field(default=StepSpec().step_s, ge=0, description="assumed: not identifiable")
    seed: int = 0
    # The CLI passes agentload's vocabulary (workload.words), the text its workloads write.
    words: tuple[str, ...] = Field(default=(), description="words whose tokens /tokenize counts; none: not counted")


class TtftPoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target_tokens: int = Field(gt=0, description="the prompt length asked for (repeats share it)")
    prompt_tokens: int = Field(gt=0)
    cached_tokens: int = Field(default=0, ge=0)
    ttft_s: float = Field(gt=0)

    @property
    def new_tokens(self) -> int:
        return max(1, self.prompt_tokens - self.cached_tokens)


class ItlPoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    batch: int = Field(gt=0)
    context: float = Field(gt=0, description="mean tokens each request held during the measured gaps")
    itl_s: float = Field(gt=0, description="median gap between text chunks while all streams decoded")
    gaps: int = Field(gt=0)


class FitReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_rel_rms: float = Field(description="relative RMS error of the profile's TTFT vs the fastest repeats")
    itl_rel_rms: float = Field(description="relative RMS error of the profile's ITL vs measured")
    rel_stderr: dict[str, float | None] = Field(description="standard error / value per fitted coefficient")
    ttft_intercept_s: float = Field(description="api overhead + step_s + request_s + round trip, as fitted")
    memory_bound_ttft: int = Field(description="TTFT points the fit found memory-bound (short prompts)")
    compute_bound_itl: int = Field(description="ITL points the fit found compute-bound (large batches)")
    iterations: int


class CalibrationResult(BaseModel):
    """Everything one calibration measured and concluded; round-trips through JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    served_model: str
    catalogue_model: str | None
    pool: ServerPool
    max_model_len: int
    round_trip_s: float
    ttft: tuple[TtftPoint, ...]
    itl: tuple[ItlPoint, ...]
    coefficients: StepCoefficients
    fit: FitReport
    notes: tuple[str, ...]
    profile_name: str
    profile_toml: str
    word_pieces: tuple[float, ...] = Field(default=(1.0,), description="shares of words made 1, 2, 3… tokens")
    word_pieces_source: str = ""
    chat_template: tuple[int, int] | None = Field(
        default=None, description="the chat template's tokens beyond the words: an opening's, an exchange's"
    )

    @property
    def tokens_per_word(self) -> float:
        return mean_word_tokens(self.word_pieces)

    @property
    def fastest_ttft(self) -> tuple[TtftPoint, ...]:
        """The TTFT points the fit used: the fastest repeat at each prompt length."""
        return fastest_per_length(self.ttft)


def fastest_per_length(points: Sequence[TtftPoint]) -> tuple[TtftPoint, ...]:
    """The fastest of the repeats at each requested length.

    Delays from anything but the server's work (scheduling, the network, a busy client) only ever add time, so the
    fastest repeat is the best estimate of what the model of the server's work should predict.
    """
    best: dict[int, TtftPoint] = {}
    for p in points:
        if p.target_tokens not in best or p.ttft_s < best[p.target_tokens].ttft_s:
            best[p.target_tokens] = p
    return tuple(best[k] for k in sorted(best))


# -- measurement ----------------------------------------------------------------------------------------------
@dataclass
class _Measurements:
    """Accumulated while measuring; compiled into a ``CalibrationResult`` at the end."""

    ttft: list[TtftPoint] = field(default_factory=list)
    itl: list[ItlPoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)  # (words sent, prompt tokens the server counted)
    word_tokens: dict[str, int] = field(default_factory=dict)  # each of agentload's words, as the server counts it
    template: tuple[int, int] | None = None  # the chat template's tokens beyond the words: an opening's, an exchange's

    def line(self) -> tuple[float, float]:
        """(tokens at zero words, tokens per word), from the counts the server reported; one per word before any."""
        if len({w for w, _ in self.sizes}) >= 2:
            slope, intercept = np.polyfit([w for w, _ in self.sizes], [t for _, t in self.sizes], 1)
            if slope > 0:
                return float(intercept), float(slope)
        if self.sizes:
            words, tokens = self.sizes[-1]
            return 0.0, tokens / words
        return 0.0, 1.0

    def tokens_for(self, words: int) -> float:
        """The server's token count for a prompt of ``words`` words."""
        intercept, slope = self.line()
        return intercept + slope * words

    def words_for(self, tokens: float) -> int:
        intercept, slope = self.line()
        return max(1, round((tokens - intercept) / slope))


def _prompt(rng: random.Random, words: int) -> str:
    # The nonce comes first so even the first KV block differs from every earlier prompt: no prefix-cache hit.
    return uuid.uuid4().hex + " " + " ".join(rng.choices(_WORDS, k=max(1, words - 1)))


def _body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    # ignore_eos and min_tokens (vLLM and SGLang extensions) keep a real model talking for the whole window.
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def steady_itl(streams: Sequence[StreamTiming], *, prompt_tokens: int, min_gaps: int) -> ItlPoint | None:
    """The ITL of concurrent streams: median gap while all of them were decoding, or None if they never were.

    The gap ending at text chunk j of a stream is the step that read the prompt plus j generated tokens.
    ``prompt_tokens`` stands in for streams that carry no usage (ended early).
    """
    if not streams or any(len(s.token_times) < 2 for s in streams):
        return None
    start = max(s.token_times[0] for s in streams)
    end = min(s.token_times[-1] for s in streams)
    gaps: list[float] = []
    contexts: list[int] = []
    for s in streams:
        times = s.token_times
        base = s.prompt_tokens if s.prompt_tokens is not None else prompt_tokens
        for j in range(1, len(times)):
            if times[j - 1] >= start and times[j] <= end:
                gaps.append(times[j] - times[j - 1])
                contexts.append(base + j)
    if len(gaps) < min_gaps * len(streams):
        return None
    itl = float(np.median(gaps))
    if itl <= 0:
        # Most chunks came in together (a client behind on a loaded machine, a proxy that buffers): single gaps hold
        # no step time, but the bursts still arrive a step per token apart on average. Read it from burst to burst.
        burst_itl = _burst_to_burst(streams, start, end)
        if burst_itl is None:
            return None  # unusable rather than an ITL of zero
        itl = burst_itl
    return ItlPoint(batch=len(streams), context=float(np.mean(contexts)), itl_s=itl, gaps=len(gaps))


def _burst_to_burst(streams: Sequence[StreamTiming], start: float, end: float) -> float | None:
    """The step time of streams whose chunks arrived in bursts: per stream, the time from its first arrival in the
    window to its last, over the tokens between the first chunk of each (a burst's chunks were generated a step
    apart before they were read at once); the median over streams, or None where no stream spans two bursts."""
    steps: list[float] = []
    for s in streams:
        inside = [(j, t) for j, t in enumerate(s.token_times) if start <= t <= end]
        if not inside:
            continue
        j0, t0 = inside[0]
        t1 = inside[-1][1]
        j1 = next(j for j, t in inside if t == t1)
        if t1 > t0 and j1 > j0:
            steps.append((t1 - t0) / (j1 - j0))
    return float(np.median(steps)) if steps else None


class _SteadyWindow:
    """Ends a batch of streams once each has ``steady`` chunks after the last stream's first one.

    Streams sent together start one after another (each prefill waits for the ones before), so each must be
    allowed enough tokens to outlast that ramp; the allowance can then be a generous guess, since the window
    ends the streams as soon as it has what it needs.
    """

    def __init__(self, streams: int, steady: int) -> None:
        self._streams = streams
        self._steady = steady
        self._started = 0
        self._all_started = False

    def rule(self) -> StopRule:
        after = 0

        def stop(count: int, _now: float) -> bool:
            nonlocal after
            if count == 1:
                self._started += 1
                self._all_started = self._started == self._streams
            elif self._all_started:
                after += 1
            return after >= self._steady

        return stop


def _ttft_lengths(plan: CalibrationPlan, max_model_len: int, pool_tokens: int) -> list[int]:
    top = min(plan.ttft_max_tokens, int(plan.ttft_max_share * max_model_len), pool_tokens // 2)
    if plan.ttft_lengths is not None:
        return sorted({n for n in plan.ttft_lengths if 0 < n <= top})
    low = min(plan.ttft_min_tokens, top)
    return sorted({round(float(x)) for x in np.geomspace(low, top, plan.ttft_points)})


async def _together(coroutines: Sequence[Coroutine[Any, Any, StreamTiming]]) -> list[StreamTiming]:
    """Run streams together; on a failure cancel the rest and raise that failure itself (not a group)."""
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


@dataclass
class _Session:
    """One calibration's measuring: the target, what it serves, and what has been measured so far."""

    target: CalibrationTarget
    model: str
    plan: CalibrationPlan
    progress: ProgressSink
    m: _Measurements
    rng: random.Random

    async def warm_up(self) -> None:
        """One request that pays any one-off cost (compilation) and shows the tokens per word."""
        words = 200
        timing = await self.target.stream_completion(_body(self.model, _prompt(self.rng, words), 1))
        if timing.prompt_tokens is None:
            self.m.notes.append("the server sent no usage: prompt lengths are estimated from word counts")
        else:
            self.m.sizes.append((words, timing.prompt_tokens))

    async def words(self) -> None:
        """How many tokens the server's tokenizer makes of each word agentload's workloads write (``/tokenize``).

        Each word is counted after an anchor word and the anchor's own count taken off, so the word is counted as
        it stands in running text (with its leading space on BPE vocabularies).
        """
        words = self.plan.words
        if not words:
            return
        self.progress.phase("the tokenizer's split of agentload's words", len(words) + 1)
        try:
            await self._count_words(words)
        except EndpointResponseError as exc:  # the split is worth having, not worth the whole calibration
            self.m.word_tokens = {}
            self.m.notes.append(f"the server's /tokenize failed ({exc}); the profile's tokenizer is from usage only")

    async def _count_words(self, words: Sequence[str]) -> None:
        anchor = await self.target.count_tokens(self.model, words[0])
        self.progress.advance()
        if anchor is None:
            self.m.notes.append(
                "the server has no /tokenize: the profile's tokenizer splits words by the measured tokens per word "
                "only, not by how the server's vocabulary splits each word"
            )
            return
        counts: dict[str, int] = {}
        for start in range(0, len(words), _TOKENIZE_AT_ONCE):
            batch = words[start : start + _TOKENIZE_AT_ONCE]
            found = await asyncio.gather(*(self.target.count_tokens(self.model, f"{words[0]} {w}") for w in batch))
            for word, n in zip(batch, found, strict=True):
                if n is not None and anchor < n <= anchor + MAX_WORD_PIECES:
                    counts[word] = n - anchor
                self.progress.advance()
        if len(counts) < len(words) // 2:
            self.m.notes.append(f"/tokenize counted only {len(counts)} of {len(words)} words; their split is not used")
            return
        self.m.word_tokens = counts

    async def template(self) -> None:
        """What the server's chat template adds beyond the words: to an opening (a system and a user message and the
        generation prompt) and to one more exchange (an assistant and a user message), from its chat ``/tokenize``.

        The messages are agentload's words, whose counts the word split just measured, so what is left of a count is
        the template's: headers, end markers, a BOS, and how the first word of a message (no space before it) is
        counted. The simulator pads its own template to it (``sim.chat.TemplatePads``), so a prompt's length lands
        against the KV block edges where the server's does.
        """
        counts = self.m.word_tokens
        if not counts:
            return  # no word split: the words' share of a count is unknown
        vocabulary = sorted(counts)

        def text(n: int) -> tuple[str, int]:
            words = [self.rng.choice(vocabulary) for _ in range(n)]
            return " ".join(words), sum(counts[w] for w in words)

        (system, ns), (user, nu), (reply, nr), (tool, nt) = text(60), text(120), text(40), text(80)
        opening = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        exchange = [*opening, {"role": "assistant", "content": reply}, {"role": "user", "content": tool}]
        try:
            first = await self.target.count_chat_tokens(self.model, opening)
            both = await self.target.count_chat_tokens(self.model, exchange) if first is not None else None
        except EndpointResponseError as exc:
            self.m.notes.append(f"the server's chat /tokenize failed ({exc}); the simulator keeps its own template")
            return
        if first is None or both is None:
            self.m.notes.append("the server's /tokenize takes no messages: the simulator keeps its own chat template")
            return
        found = (first - ns - nu, both - first - nr - nt)
        if not all(0 <= n <= MAX_TEMPLATE_TOKENS for n in found):
            self.m.notes.append(f"the chat template's counts {found} are not a template's; not used")
            return
        self.m.template = found

    def tokenizer_table(self) -> dict[str, Any]:
        """The profile's ``[tokenizer]``: each of agentload's words as the server counts it, the shares of words made
        1, 2, 3… tokens (for any other word), and where they came from."""
        counts = list(self.m.word_tokens.values())
        if counts:
            mean = float(np.mean(counts))
            table: dict[str, Any] = {
                "word_pieces": [round(float(x), 4) for x in np.bincount(counts, minlength=2)[1:] / len(counts)],
                "word_tokens": dict(self.m.word_tokens),
                "source": f"/tokenize on {len(counts)} of agentload's words: {mean:.3f} tokens a word",
            }
            if self.m.template is not None:
                table["template_opening"], table["template_exchange"] = self.m.template
                table["source"] += "; the chat template's tokens counted there too"
            return table
        # No /tokenize: the mean from the prompts' usage, as a mix of its two neighbouring whole counts.
        _, per_word = self.m.line()
        per_word = min(max(per_word, 1.0), float(MAX_WORD_PIECES))
        low = math.floor(per_word)
        shares = [0.0] * min(low + 1, MAX_WORD_PIECES)
        shares[low - 1] = 1.0 - (per_word - low)
        if low < MAX_WORD_PIECES:
            shares[low] = per_word - low
        return {
            "word_pieces": [round(x, 4) for x in shares],
            "source": f"usage.prompt_tokens of calibration prompts: {per_word:.3f} tokens a word",
        }

    async def ttft(self, lengths: Sequence[int]) -> None:
        """Each length ``ttft_repeats`` times, lengths interleaved so drift touches them all alike."""
        m = self.m
        self.progress.phase("TTFT against prompt length", len(lengths) * self.plan.ttft_repeats)
        for _ in range(self.plan.ttft_repeats):
            for length in lengths:
                words = m.words_for(length)
                timing = await self.target.stream_completion(_body(self.model, _prompt(self.rng, words), 1))
                if timing.prompt_tokens is not None:
                    m.sizes.append((words, timing.prompt_tokens))
                if timing.ttft is None or timing.ttft <= 0:
                    m.notes.append(f"a {length}-token prompt streamed no text; its TTFT was not used")
                else:
                    prompt = timing.prompt_tokens or round(m.tokens_for(words))
                    cached = min(timing.cached_tokens or 0, prompt - 1)
                    m.ttft.append(TtftPoint(target_tokens=length, prompt_tokens=prompt, cached_tokens=cached,
                                            ttft_s=timing.ttft))  # fmt: skip
                self.progress.advance()

    async def itl(self, contexts: Sequence[int], pool: ServerPool, max_model_len: int) -> set[int]:
        """ITL for every batch size at every context; returns the contexts that gave a usable point."""
        plan, m = self.plan, self.m
        fastest = fastest_per_length(m.ttft)
        xs, ys = [p.prompt_tokens for p in fastest], [p.ttft_s for p in fastest]
        batches = sorted(set(plan.batch_sizes))
        measured: set[int] = set()
        guesses: dict[int, float] = {}  # per context, the last step time measured there
        self.progress.phase("ITL against batch size and context", plan.itl_repeats * len(contexts) * len(batches))
        # Passes over all points rather than repeats of each one: drift of the machine touches every point alike.
        for first, context in ((r == 0, c) for r in range(plan.itl_repeats) for c in contexts):
            step_guess = guesses.get(context, ys[0])  # a decode step is no slower than the shortest prefill
            for n in batches:
                # While the later streams prefill, the earlier ones decode: allow for n whole prefills (generous;
                # the steady window ends the streams once it has its gaps) plus the window itself.
                ramp = 0 if n == 1 else math.ceil(n * float(np.interp(context, xs, ys)) / step_guess)
                room = int(plan.pool_share * pool.num_blocks / n) * pool.block_size - context
                out = min(plan.steady_tokens + 1 + ramp, max_model_len - context - 1, room)
                if out < plan.steady_tokens + 1 or n > (pool.max_num_seqs or n):
                    if first:
                        m.notes.append(
                            f"batch {n} at context {context} does not fit the pool or max_model_len; skipped"
                        )
                    self.progress.advance()
                    continue
                window = _SteadyWindow(n, plan.steady_tokens)
                words = m.words_for(context)
                streams = await _together(
                    [
                        self.target.stream_completion(_body(self.model, _prompt(self.rng, words), out), window.rule())
                        for _ in range(n)
                    ]
                )
                point = steady_itl(streams, prompt_tokens=round(m.tokens_for(words)), min_gaps=plan.min_gaps)
                if point is None:
                    m.notes.append(
                        f"batch {n} at context {context}: no usable step time (the streams never all decoded "
                        "together, or their chunks arrived in bursts); skipped"
                    )
                else:
                    m.itl.append(point)
                    measured.add(context)
                    step_guess = guesses[context] = point.itl_s
                self.progress.advance()
        return measured


async def calibrate(
    target: CalibrationTarget,
    *,
    url: str,
    model: str | None = None,
    plan: CalibrationPlan | None = None,
    name: str | None = None,
    progress: ProgressSink | None = None,
) -> CalibrationResult:
    """Measure ``target``, fit the step-time coefficients and compile the result with its profile."""
    plan = plan or CalibrationPlan()
    progress = progress or _Silent()
    m = _Measurements()

    progress.phase("reading the server", 1)
    server = await _read_server(target, url, model, m)
    draft = server.profile_doc(name or _default_name(server.served.id))
    resolved = parse_profile(tomli_w.dumps(draft), "the calibrated profile")
    session = _Session(target, server.served.id, plan, progress, m, random.Random(plan.seed))
    fastest = await _measure(session, plan, server)

    coefficients, report = fit_step_coefficients(
        fastest,
        m.itl,
        structure=resolved.coefficients,
        model=resolved.model,
        step_s=plan.step_s,
        round_trip_s=server.round_trip_s,
    )
    if report.memory_bound_ttft == len(fastest):
        m.notes.append(
            "every prompt was memory-bound (TTFT flat in length): prefill_s_per_token and attention_s_per_pair "
            "are not determined; longer prompts would determine them"
        )
    m.notes.append(
        f"step_s is not identifiable apart from weights_s and api_overhead_s; set to {plan.step_s:g} s, layer_s to 0"
    )
    m.notes.append(f"api_overhead_s is the TTFT intercept less a {server.round_trip_s * 1e3:.2f} ms round trip")
    doc = server.profile_doc(draft["name"], coefficients, report)
    doc["tokenizer"] = session.tokenizer_table()
    text = tomli_w.dumps(doc)
    parse_profile(text, "the calibrated profile")  # it must load as written
    return CalibrationResult(
        url=url,
        served_model=server.served.id,
        catalogue_model=server.catalogue_name,
        pool=server.pool,
        max_model_len=server.max_model_len,
        round_trip_s=server.round_trip_s,
        ttft=tuple(m.ttft),
        itl=tuple(m.itl),
        coefficients=coefficients,
        fit=report,
        notes=tuple(m.notes),
        profile_name=doc["name"],
        profile_toml=text,
        word_pieces=tuple(doc["tokenizer"]["word_pieces"]),
        word_pieces_source=doc["tokenizer"]["source"],
        chat_template=m.template,
    )


@dataclass(frozen=True)
class _Server:
    """What the server says about itself before anything is measured: the model, its pool, the round trip."""

    url: str
    served: ServedModel
    pool: ServerPool
    max_model_len: int
    round_trip_s: float
    catalogue_name: str | None
    kv_dtype: str

    def profile_doc(
        self, name: str, coefficients: StepCoefficients | None = None, report: FitReport | None = None
    ) -> dict[str, Any]:
        return _profile_doc(
            name,
            self.url,
            self.served,
            self.catalogue_name,
            self.pool,
            self.max_model_len,
            self.kv_dtype,
            coefficients,
            report,
        )


async def _read_server(target: CalibrationTarget, url: str, model: str | None, m: _Measurements) -> _Server:
    """The served model (``model``, or the first listed), its pool and context, and the median of 5 round trips."""
    served = _pick_model(await target.models(), model)
    pool = await target.pool()
    max_model_len = served.max_model_len or pool.max_model_len
    if max_model_len is None:
        raise ServerCapabilityError(f"{url} does not report max_model_len (neither /v1/models nor its server info)")
    rtt = float(np.median([await target.round_trip() for _ in range(5)]))
    catalogue_name = _catalogue_name(served)
    kv_dtype = pool.cache_dtype or "auto"
    try:
        parse_kv_dtype(kv_dtype)
    except ConfigError:
        m.notes.append(f"the server's cache dtype {kv_dtype!r} is unknown here; the profile says auto")
        kv_dtype = "auto"
    return _Server(url, served, pool, max_model_len, rtt, catalogue_name, kv_dtype)


async def _measure(session: _Session, plan: CalibrationPlan, server: _Server) -> tuple[TtftPoint, ...]:
    """Every measurement in order (warm-up, words, template, TTFT, ITL); the fastest TTFT at each prompt length.

    Refused when too few lengths or ITL points came back to fit the coefficients.
    """
    m = session.m
    await session.warm_up()
    session.progress.advance()
    await session.words()
    await session.template()

    await session.ttft(_ttft_lengths(plan, server.max_model_len, server.pool.tokens))
    fastest = fastest_per_length(m.ttft)
    if len(fastest) < 3:
        raise CalibrationError(f"only {len(m.ttft)} usable TTFT measurements at fewer than 3 prompt lengths")
    contexts = plan.itl_contexts or (256, min(server.max_model_len // 4, 8192))
    measured_contexts = await session.itl(contexts, server.pool, server.max_model_len)
    if len(m.itl) < 3:
        raise CalibrationError(f"only {len(m.itl)} usable ITL measurements; the pool may be too small")
    if len(measured_contexts) < 2 or len({p.batch for p in m.itl}) < 2:
        # One context leaves batch and batch × context collinear; one batch size leaves batch and the intercept.
        m.notes.append("ITL was measured at one context or one batch size: request_s and kv_s_per_token are unsure")
    return fastest


def _pick_model(models: list[ServedModel], wanted: str | None) -> ServedModel:
    if wanted is None:
        return models[0]
    for card in models:
        if wanted in (card.id, card.root):
            return card
    raise ConfigError(f"--model {wanted!r} is not served; the server lists {', '.join(c.id for c in models)}")


def _catalogue_name(served: ServedModel) -> str | None:
    for candidate in (served.id, served.root):
        if candidate:
            try:
                return catalog.get_model(candidate).name
            except ConfigError:
                continue
    return None


def _default_name(served_id: str) -> str:
    slug = re.sub(r"[^a-z0-9.]+", "-", served_id.split("/")[-1].lower()).strip("-")
    return f"calibrated-{slug or 'model'}"


# -- the fit --------------------------------------------------------------------------------------------------
def _basis(structure: StepCoefficients, model: ModelSpec) -> dict[str, StepTimeModel]:
    """One step model per coefficient with that coefficient 1 and every other timing coefficient 0."""
    zero = dict.fromkeys(_TIMING, 0.0)
    return {p: StepTimeModel(structure.model_copy(update={**zero, p: 1.0}), model) for p in (*FITTED, "step_s")}


def predicted_ttft(c: StepCoefficients, model: ModelSpec, point: TtftPoint, round_trip_s: float) -> float:
    """What a profile with coefficients ``c`` says this TTFT is, seen from a client ``round_trip_s`` away."""
    return round_trip_s + c.api_overhead_s + StepTimeModel(c, model).prefill_time(point.new_tokens, point.cached_tokens)


def _decode_time(sm: StepTimeModel, batch: int, context: float) -> float:
    """A decode step at a mean context that need not be whole: linear between the neighbouring whole contexts.

    Rounding instead would shift the kv term by up to half a token per request, which at large batches is as
    big as the whole per-request cost the fit is after.
    """
    low = math.floor(context)
    below = sm.decode_step_time(batch, low)
    return below + (context - low) * (sm.decode_step_time(batch, low + 1) - below)


def predicted_itl(c: StepCoefficients, model: ModelSpec, point: ItlPoint) -> float:
    return _decode_time(StepTimeModel(c, model), point.batch, point.context)


def fit_step_coefficients(
    ttft: Sequence[TtftPoint],
    itl: Sequence[ItlPoint],
    *,
    structure: StepCoefficients,
    model: ModelSpec,
    step_s: float,
    round_trip_s: float,
) -> tuple[StepCoefficients, FitReport]:
    """Non-negative least squares on relative errors, with each point in the regime the fit says dominates."""
    basis = _basis(structure, model)
    rows = [[basis[p].prefill_time(t.new_tokens, t.cached_tokens) for p in (*FITTED, "step_s")] for t in ttft]
    rows += [[_decode_time(basis[p], i.batch, i.context) for p in (*FITTED, "step_s")] for i in itl]
    features = np.array(rows)
    y = np.array([t.ttft_s for t in ttft] + [i.itl_s for i in itl])
    intercept = np.array([1.0] * len(ttft) + [0.0] * len(itl))
    known = features[:, -1] * step_s
    features = features[:, :-1]
    groups = np.array([_GROUP[p] for p in FITTED])
    compute_cols, memory_cols = groups == "compute", groups == "memory"
    # Prefill is compute-bound and decode memory-bound for all but the shortest prompts and largest batches.
    regime = np.array(["compute"] * len(ttft) + ["memory"] * len(itl))
    weights = 1.0 / y
    iterations = 0
    while True:
        iterations += 1
        active = (groups[None, :] == regime[:, None]) | (groups[None, :] == "fixed")
        design = np.column_stack([features * active, intercept]) * weights[:, None]
        scale = np.linalg.norm(design, axis=0)
        scale[scale == 0] = 1.0
        solution, _ = nnls(design / scale, (y - known) * weights)
        theta = solution / scale
        compute = features[:, compute_cols] @ theta[:-1][compute_cols]
        memory = features[:, memory_cols] @ theta[:-1][memory_cols]
        new_regime = np.where(compute > memory, "compute", "memory")
        # Each pass can only move points across the compute/memory boundary; 20 passes is far more than a
        # stable assignment needs, and a point that keeps flipping sits on the boundary where both agree.
        if (new_regime == regime).all() or iterations == 20:
            break
        regime = new_regime

    values = dict(zip(FITTED, (float(v) for v in theta[:-1]), strict=True))
    fitted = StepCoefficients.model_validate(
        {
            **structure.model_dump(),
            **values,
            "step_s": step_s,
            "layer_s": 0.0,
            "api_overhead_s": max(0.0, float(theta[-1]) - round_trip_s),
        }
    )
    rel_ttft = [predicted_ttft(fitted, model, t, round_trip_s) / t.ttft_s - 1 for t in ttft]
    rel_itl = [predicted_itl(fitted, model, i) / i.itl_s - 1 for i in itl]
    report = FitReport(
        ttft_rel_rms=_rms(rel_ttft),
        itl_rel_rms=_rms(rel_itl),
        rel_stderr=_rel_stderr(design, (y - known) * weights, theta),
        ttft_intercept_s=float(theta[-1]),
        memory_bound_ttft=int((regime[: len(ttft)] == "memory").sum()),
        compute_bound_itl=int((regime[len(ttft) :] == "compute").sum()),
        iterations=iterations,
    )
    return fitted, report


def _rms(values: Sequence[float]) -> float:
    return float(np.sqrt(np.mean(np.square(values)))) if values else 0.0


def _rel_stderr(design: np.ndarray, target: np.ndarray, theta: np.ndarray) -> dict[str, float | None]:
    """Ordinary least-squares standard errors at the solution, relative to each value (None if undetermined).

    Coefficients held at zero by the bound, or whose column no point informs, have none.
    """
    names = [*FITTED, "ttft_intercept"]
    dof = design.shape[0] - int((theta > 0).sum())
    if dof <= 0:
        return dict.fromkeys(names)
    residual = design @ theta - target
    sigma2 = float(residual @ residual) / dof
    cov = sigma2 * np.linalg.pinv(design.T @ design)
    out: dict[str, float | None] = {}
    for k, n in enumerate(names):
        informed = bool(np.any(design[:, k]))
        out[n] = float(math.sqrt(max(cov[k, k], 0.0)) / theta[k]) if theta[k] > 0 and informed else None
    return out


# -- the profile ----------------------------------------------------------------------------------------------
def _profile_doc(
    name: str,
    url: str,
    served: ServedModel,
    catalogue_name: str | None,
    pool: ServerPool,
    max_model_len: int,
    kv_dtype: str,
    coefficients: StepCoefficients | None = None,
    report: FitReport | None = None,
) -> dict[str, Any]:
    """The profile TOML as a dict: the server's pool exactly, the fitted coefficients pinned."""
    model: str | dict[str, Any]
    if catalogue_name is not None:
        model = catalogue_name
    else:
        # The architecture is unknown; with every timing coefficient pinned and the pool stated in blocks, only a
        # dense single-group layout matters, which this minimal model gives.
        model = {
            "name": served.id,
            "num_layers": 1,
            "hidden_size": 1,
            "num_attention_heads": 1,
            "num_kv_heads": 1,
            "head_dim": 1,
            "total_params": 1.0,
            "active_params": 1.0,
        }
    fit = f" Fit error (relative RMS): TTFT {report.ttft_rel_rms:.1%}, ITL {report.itl_rel_rms:.1%}." if report else ""
    doc: dict[str, Any] = {
        "name": name,
        "description": (
            f"Calibrated by agentload from {url}, model {served.id} ({pool.engine}); KV pool from {pool.source}."
            f"{fit} Step-time coefficients are pinned from measurements; max_num_batched_tokens"
            f"{'' if pool.max_num_seqs else ' and max_num_seqs'} are defaults (the server does not report them)."
        ),
        "model": model,
        "served_model_name": served.id,
        # Every timing coefficient is pinned and the pool is in blocks, so no GPU figure is used.
        "gpu": {
            "memory_gb": 1.0,
            "bandwidth_gbps": 1.0,
            "tflops_bf16": 1.0,
            "notes": "placeholder: a calibrated profile pins its step coefficients and states its pool in blocks",
        },
        "kv_cache_dtype": kv_dtype,
        "block_size": pool.block_size,
        "max_model_len": max_model_len,
        "kv_pool": {"num_blocks": pool.num_blocks},
    }
    if pool.max_num_seqs:
        doc["max_num_seqs"] = pool.max_num_seqs
    if pool.engine == "llamacpp" and pool.max_num_seqs:
        # llama.cpp's slots (its pool is total_slots × per-slot n_ctx): the simulator's slot mode (sim/slots.py),
        # each slot caching only its own last prompt, not vLLM's shared prefix cache.
        doc["slots"] = pool.max_num_seqs
    if pool.prefix_caching is not None:
        doc["enable_prefix_caching"] = pool.prefix_caching
    if coefficients is not None:
        doc["step"] = {"pinned": {k: getattr(coefficients, k) for k in _TIMING}}
    return doc
