"""What one request to a server was, as an immutable record: every number agentload prints comes from these.

Per-request failures are data here (``outcome`` + ``error``), never exceptions: a fleet of 256 agents against a
struggling server must keep every failed attempt, with its timings, for the analysis and the report.
Times are seconds on the client's clock (monotonic; virtual in simulated runs), not wall-clock dates.
"""

from __future__ import annotations

import itertools
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class Outcome(StrEnum):
    OK = "ok"
    HTTP_ERROR = "http_error"  # a non-2xx status
    CONNECT_ERROR = "connect_error"  # refused, unreachable, reset before the response began
    TIMEOUT = "timeout"  # one of the stall deadlines expired (see ErrorKind)
    STREAM_ERROR = "stream_error"  # reset mid-stream, or a malformed SSE line / JSON body
    SERVER_ERROR = "server_error"  # the stream carried an error object
    CANCELLED = "cancelled"  # the caller gave up (run stopped)


class ErrorKind(StrEnum):
    CONNECT = "connect"
    CONNECT_TIMEOUT = "connect_timeout"
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    TOTAL_TIMEOUT = "total_timeout"
    HTTP_STATUS = "http_status"
    RESET = "reset"
    MALFORMED = "malformed"
    SERVER = "server"
    CANCELLED = "cancelled"
    # More output than the request's max_tokens allowed (plus a margin): a server that ignores the cap, or a stream
    # that never ends. Cut there, so it cannot hold an agent (or a level) for the total deadline.
    OVERRUN = "overrun"
    # Cut by the load that sent it, not by the server: a bench level's window ended and its grace ran out.
    CUT = "cut"


class UsageSource(StrEnum):
    SERVER = "server"  # the usage object the server sent
    COUNTED = "counted"  # counted by the client (chunks for output, characters / 4 for the prompt)


class ToolCallRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str


class RequestIds(BaseModel):
    """Where a request belongs: run, load level, agent, turn, attempt."""

    model_config = ConfigDict(frozen=True)

    run: str = ""
    level: int = 0
    agent: str = ""
    turn: int = 0
    attempt: int = 0


class RequestRecord(BaseModel):
    """One request, from send to last byte."""

    model_config = ConfigDict(frozen=True)

    ids: RequestIds = Field(default_factory=RequestIds)
    model: str = ""
    stream: bool = True
    # Timings (client clock, seconds). None when the phase was never reached.
    t_sent: float
    t_headers: float | None = None
    t_first_byte: float | None = None
    t_first_token: float | None = None  # first content or tool-call token (a role-only chunk does not count)
    t_done: float
    # Arrival of every token-bearing chunk: when its bytes came off the socket, not when it was parsed.
    chunk_times: list[float] = Field(default_factory=list)
    # Tokens.
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None  # None when the server did not report it (vLLM needs a flag)
    requested_tokens: int | None = None  # the output cap asked for (max_completion_tokens or max_tokens)
    usage_source: UsageSource = UsageSource.SERVER
    # What came back.
    finish_reason: str | None = None
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    # How it ended.
    outcome: Outcome = Outcome.OK
    error: ErrorKind | None = None
    error_message: str = ""
    http_status: int | None = None
    retry_after_s: float | None = None
    # SSE comment lines (``: ping``) the stream carried: keep-alives, which prove a connection, not progress (no
    # deadline is reset by them), counted so that a stream of nothing but keep-alives says so.
    keepalives: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def ttft(self) -> float | None:
        return None if self.t_first_token is None else self.t_first_token - self.t_sent

    @property
    def latency(self) -> float:
        return self.t_done - self.t_sent

    def itl(self) -> list[float]:
        """Gaps between token-bearing chunks (exact: every chunk's arrival is kept)."""
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

    def itl_percentiles(self, qs: tuple[float, ...] = (50, 95, 99)) -> dict[str, float]:
        gaps = self.itl()
        if not gaps:
            return {}
        values = np.percentile(np.asarray(gaps), qs)
        return {f"p{q:g}": float(v) for q, v in zip(qs, values, strict=True)}

    def moved(self, by_s: float) -> RequestRecord:
        """This record with every time moved by ``by_s`` (an actor's clock put on the driver's); itself when 0.
        Durations (TTFT, ITL, latency) are unchanged: they were taken on one clock."""
        if by_s == 0.0:
            return self

        def at(t: float | None) -> float | None:
            return None if t is None else t + by_s

        return self.model_copy(
            update={
                "t_sent": self.t_sent + by_s,
                "t_headers": at(self.t_headers),
                "t_first_byte": at(self.t_first_byte),
                "t_first_token": at(self.t_first_token),
                "t_done": self.t_done + by_s,
                "chunk_times": [t + by_s for t in self.chunk_times],
            }
        )

    @property
    def transient(self) -> bool:
        """Worth resending the same turn: resets, 5xx 502/503/504, 429, connect failures, stalls."""
        if self.outcome in (Outcome.CONNECT_ERROR, Outcome.TIMEOUT):
            return True
        if self.outcome is Outcome.STREAM_ERROR:
            return self.error is ErrorKind.RESET or self.error is ErrorKind.MALFORMED
        if self.outcome is Outcome.HTTP_ERROR:
            return self.http_status in (429, 500, 502, 503, 504)
        return False
