"""``agentload probe URL``: which engine serves there, and the figures a fleet run is sized from."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from agentload.cli.common import ApiKeyEnvOption, JsonOption, console, reports_errors
from agentload.endpoint import probe as engine_probe
from agentload.endpoint.apikey import resolve_key_env
from agentload.endpoint.probe import ENGINE_LABELS, ProbeResult
from agentload.errors import ConfigError


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def render(result: ProbeResult) -> Table:
    """The probe as a two-column table (what was asked, what the server said)."""
    # Every value is the server's or the user's text: shown as text, never read as rich markup.
    table = Table(title=Text(f"{result.url}: {ENGINE_LABELS[result.engine]}"), title_justify="left", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    cached = _yes_no(result.reports_cached_tokens)
    if result.cached_tokens_advice:
        cached += f" — {result.cached_tokens_advice}"
    rows = [
        ("engine", result.engine),
        ("version", result.version or "—"),
        ("detected by", "; ".join(result.evidence)),
        ("model", result.model or "—"),
        ("max context", _number(result.max_context)),
        ("KV pool tokens", _number(result.pool_tokens)),
        ("block size", _number(result.block_size)),
        ("prefix caching", _yes_no(result.prefix_caching)),
        ("usage reports cached tokens", cached),
        ("parallel slots", _number(result.parallel_slots)),
        ("max running requests", _number(result.max_running)),
        (
            "exact output lengths",
            result.output_length_control or "no way known: replies are as long as the model makes them",
        ),
        ("metrics", result.metrics_url or "none"),
        ("metric names", ", ".join(result.metric_names) or "—"),
    ]
    if len(result.models) > 1:
        rows.insert(3, ("models served", ", ".join(result.models)))
    for name, value in rows:
        table.add_row(name, Text(value))
    for note in result.notes:
        table.add_row("note", Text(note))
    return table


@reports_errors
def probe(
    url: Annotated[
        str | None,
        typer.Argument(
            help="The server, e.g. http://127.0.0.1:8000 (a trailing /v1 is ok); or give --url.", show_default=False
        ),
    ] = None,
    url_option: Annotated[
        str | None, typer.Option("--url", help="The server, as every other command names it.", show_default=False)
    ] = None,
    as_json: JsonOption = False,
    model: Annotated[str | None, typer.Option(help="Model to test cached-token reporting with (default: first).")] = (
        None
    ),
    api_key_env: ApiKeyEnvOption = None,
) -> None:
    """Detect the engine (vLLM, SGLang, llama.cpp, Ollama, the simulator or a generic OpenAI API) and report its
    model, max context, KV pool, prefix caching, cached-token reporting, metrics and parallel slots.

    Sends two one-token chat requests to see whether usage reports cached tokens.
    """
    if url is not None and url_option is not None and url != url_option:
        raise ConfigError(f"two servers given: {url} and --url {url_option}; give one")
    target = url or url_option
    if target is None:
        raise ConfigError("which server? give its URL, e.g. agentload probe --url http://127.0.0.1:8000")
    result = asyncio.run(engine_probe.probe(target, model=model, api_key_env=resolve_key_env(api_key_env)))
    if as_json:
        # Plain stdout, not rich: JSON must reach a pipe unwrapped and uncoloured.
        typer.echo(result.model_dump_json(indent=2))
        return
    console.print(render(result))
