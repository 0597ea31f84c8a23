"""``agentload sim``: the simulated vLLM-style server over HTTP on 127.0.0.1."""

from __future__ import annotations

from agentload.cli.common import reports_errors


@reports_errors
def sim() -> None:
    """Serve a simulated vLLM-style OpenAI-compatible server (work in progress)."""
    raise SystemExit("not yet")
