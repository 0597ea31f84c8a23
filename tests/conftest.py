"""Shared fixtures."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but not listening, so a connection is refused for certain."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
