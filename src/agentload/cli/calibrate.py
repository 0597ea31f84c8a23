"""``agentload calibrate``: measure a server's pool and step times and write a profile the simulator serves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentload.capacity import calibrate as calibration
from agentload.capacity.calibrate import CalibrationPlan, CalibrationResult
from agentload.cli.common import ApiKeyEnvOption, JsonOption, console, err_console, reports_errors
from agentload.endpoint.apikey import read_api_key
from agentload.endpoint.scrape import ServerProbe
from agentload.errors import ConfigError
from agentload.report.calibrateview import LineProgress, summary
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
    summary(result, console)
    if output is None:
        console.print()
        typer.echo(result.profile_toml)
    else:
        console.print(f"Wrote {output}; serve it with: agentload sim --profile {output}", markup=False)
