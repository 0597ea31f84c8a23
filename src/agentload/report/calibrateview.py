"""``agentload calibrate`` for people: its progress as plain lines where no bar is drawn, and the calibration's
summary (the pool, the fitted step-time coefficients with their uncertainty, the fit error, the notes).

Reads only the ``capacity.calibrate.CalibrationResult`` it is given and prints to the console it is given: no figure
is computed here that the result does not hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from agentload.capacity.calibrate import FITTED, CalibrationResult


class LineProgress:
    """Measurement progress as plain lines on the console it is given (the command's stderr), where no bar is drawn
    (a pipe, a log, ``--json``): a line as each phase starts and one every ``every_s`` within it, so a minute of
    measuring is never silent. stdout, which may be the JSON result, gets none of it.

    Nothing is said before the server has answered once (the first measurement): a URL that is wrong stays one
    ``error:`` line.
    """

    def __init__(self, console: Console, *, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._console = console
        self._every_s = every_s
        self._clock = clock
        self._start = clock()
        self._said = self._start
        self._description = ""
        self._done = 0
        self._total = 0
        self._answered = False
        self._pending: str | None = None

    def _say(self, line: str) -> None:
        self._said = self._clock()
        self._console.print(f"calibrate: {line} ({self._said - self._start:.0f} s)", markup=False, soft_wrap=True)

    def phase(self, description: str, total: int) -> None:
        self._description, self._done, self._total = description, 0, total
        self._pending = f"{description}: {total} measurement{'s' * (total != 1)}"
        if self._answered:
            self._say(self._pending)
            self._pending = None

    def advance(self) -> None:
        self._done += 1
        self._answered = True
        if self._pending is not None:
            self._say(self._pending)
            self._pending = None
        elif self._clock() - self._said >= self._every_s:
            self._say(f"{self._description}: {self._done} of {self._total}")


def summary(result: CalibrationResult, out: Console) -> None:
    """The result for a reader: pool, coefficients with their uncertainty, fit error, notes."""
    pool = result.pool
    out.print(f"Calibrated {result.url}: {result.served_model} ({pool.engine})")
    out.print(
        f"KV pool: {pool.num_blocks:,} blocks × {pool.block_size} tokens = {pool.tokens:,} tokens "
        f"({pool.source}{'' if pool.exact else '; an equivalent, not exact'}); max_model_len {result.max_model_len:,}"
    )
    table = Table(title="Step-time coefficients", title_justify="left")
    table.add_column("coefficient")
    table.add_column("value", justify="right")
    table.add_column("± rel. s.e.", justify="right")
    table.add_column("from")
    c = result.coefficients
    errors = result.fit.rel_stderr
    how = {
        "prefill_s_per_token": "TTFT slope in prompt tokens",
        "attention_s_per_pair": "TTFT curvature in prompt tokens",
        "weights_s": "ITL intercept − step_s",
        "kv_s_per_token": "ITL slope in batch × context",
        "request_s": "ITL slope in batch",
    }
    for name in FITTED:
        err = errors.get(name)
        table.add_row(name, f"{getattr(c, name):.4g}", "—" if err is None else f"{err:.1%}", how[name])
    table.add_row("api_overhead_s", f"{c.api_overhead_s:.4g}", "", "TTFT intercept − round trip − step")
    table.add_row("step_s", f"{c.step_s:.4g}", "", "assumed (not identifiable)")
    out.print(table)
    fit = result.fit
    out.print(
        f"Fit error (relative RMS): TTFT {fit.ttft_rel_rms:.1%} over {len(result.fastest_ttft)} prompt lengths "
        f"(fastest of {len(result.ttft)} requests), "
        f"ITL {fit.itl_rel_rms:.1%} over {len(result.itl)} points (batch × context × pass); "
        f"round trip {result.round_trip_s * 1e3:.2f} ms"
    )
    shares = ", ".join(f"{share:.0%} {k + 1}" for k, share in enumerate(result.word_pieces) if share > 0)
    out.print(
        f"Tokenizer: {result.tokens_per_word:.3f} tokens a word of agentload's text (words made of 1, 2, … tokens: "
        f"{shares}; {result.word_pieces_source or 'not measured'})",
        markup=False,
    )
    if result.chat_template is not None:
        opening, exchange = result.chat_template
        out.print(
            f"Chat template: {opening} tokens around an opening's words (system, user, generation prompt), "
            f"{exchange} around each further exchange's (assistant, user); the simulator pads its own to match"
        )
    for note in result.notes:
        out.print(f"[dim]note: {note}[/]")
