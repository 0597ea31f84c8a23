"""Shared fixtures."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Property-based fuzzers run a fixed, derandomised budget so CI is reproducible and never timed:
# ``AGENTLOAD_FUZZ_EXAMPLES`` raises it (the closing notes' 10,000-example runs): see tests/fuzzing.py.
settings.register_profile(
    "agentload",
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("agentload")

# pytest-xdist's workers inherit COLUMNS=80 from their launcher, and rich fixes a console's width from COLUMNS when
# the console is made (agentload.cli.common makes its consoles at import). A test then saw another width than under
# a plain ``pytest``, where rich asks at each print; without it both runs print alike.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but not listening, so a connection is refused for certain."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """Each test starts with no registered secrets (``endpoint.redact.SECRETS`` is process-wide by design)."""
    from agentload.endpoint.redact import SECRETS

    SECRETS.clear()
    yield
    SECRETS.clear()
