"""``agentload probe URL``: which engine serves there, and the figures a fleet run is sized from."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from agentload.cli.common import ApiKeyEnvOption, JsonOption, console, reports_errors
from agentload.endpoint import probe as engine_probe
from agentload.endpoint.apikey import resolve_key_env
from agentload.errors import ConfigError
from agentload.report.probeview import render_probe


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
    console.print(render_probe(result))
