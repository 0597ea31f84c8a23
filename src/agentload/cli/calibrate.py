"""``agentload calibrate``: measure a server's pool and step times and write a profile the simulator serves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentload.capacity import calibrate as calibration
from agentload.capacity.calibrate import FITTED, CalibrationPlan, CalibrationResult
from agentload.cli.common import ApiKeyEnvOption, JsonOption, console, err_console, reports_errors
from agentload.endpoint.apikey import read_api_key
from agentload.endpoint.scrape import ServerProbe
from agentload.errors import ConfigError
from agentload.workload.words import WORDS


class _RichProgress:
    """Measurement progress on stderr, one bar per phase."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None
        self._total = 0

    def phase(self, description: str, total: int) -> None:
        if self._task is not None:  # a phase can skip work (batches that do not fit); show it as done
            self._progress.update(self._task, completed=self._total)
        self._task = self._progress.add_task(description, total=total)
        self._total = total

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)


class LineProgress:
    """Measurement progress as plain lines on stderr, where no bar is drawn (a pipe, a log, ``--json``): a line as
    each phase starts and one every ``every_s`` within it, so a minute of measuring is never silent. stdout, which
    may be the JSON result, gets none of it.

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


async def _run(url: str, api_key: str | None, model: str | None, plan: CalibrationPlan, name: str | None,
               quiet: bool) -> CalibrationResult:  # fmt: skip
    bars = err_console.is_terminal and not quiet
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,  # the summary replaces the bars; an error leaves one clean line
        disable=not bars,
    )
    sink = _RichProgress(progress) if bars else LineProgress(err_console)
    async with ServerProbe(url, api_key=api_key) as probe:
        with progress:
            return await calibration.calibrate(
                probe, url=str(probe.url), model=model, plan=plan, name=name, progress=sink
            )


def summary(result: CalibrationResult, out: Console = console) -> None:
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


@reports_errors
def calibrate(
    url: Annotated[str, typer.Option("--url", help="The server, e.g. http://127.0.0.1:8000 (a trailing /v1 is ok).")],
    model: Annotated[str | None, typer.Option(help="Served model to calibrate (default: the first listed).")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the profile TOML here (default: print it).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Profile name (default: calibrated-<model>).")] = None,
    as_json: JsonOption = False,
    api_key_env: ApiKeyEnvOption = None,
    repeats: Annotated[int, typer.Option(min=1, help="TTFT measurements per prompt length.")] = 3,
    max_batch: Annotated[int, typer.Option(min=1, help="Largest number of concurrent streams for ITL.")] = 16,
    itl_repeats: Annotated[int, typer.Option(min=1, help="Passes over every ITL point (batch × context).")] = 2,
) -> None:
    """Measure a server's KV pool, TTFT and inter-token latency; fit the step-time model; write a profile.

    `agentload sim --profile PROFILE.toml` then serves a simulated copy of that server.
    """
    batches = {b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= max_batch} | {max_batch}
    plan = CalibrationPlan(
        ttft_repeats=repeats, batch_sizes=tuple(sorted(batches)), itl_repeats=itl_repeats, words=WORDS
    )
    # Refuse an unwritable destination before minutes of measurement, not after.
    if output is not None and output.is_dir():
        raise ConfigError(f"-o {output} is a directory; give a file name such as {output / 'profile.toml'}")
    if output is not None and not output.parent.is_dir():
        raise ConfigError(f"-o {output}: the folder {output.parent} does not exist")
    result = asyncio.run(_run(url, read_api_key(api_key_env), model, plan, name, quiet=as_json))
    if output is not None:
        try:
            output.write_text(result.profile_toml, encoding="utf-8")
        except OSError as exc:
            typer.echo(result.profile_toml)  # minutes of measurement are not lost to a full disk
            raise ConfigError(f"cannot write {output}: {exc.strerror or exc} (the profile is printed above)") from exc
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    summary(result)
    if output is None:
        console.print()
        typer.echo(result.profile_toml)
    else:
        console.print(f"Wrote {output}; serve it with: agentload sim --profile {output}", markup=False)
