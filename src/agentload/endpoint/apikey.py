"""The server's API key: read from the environment, never from a flag or a file, and registered as a secret the
moment it is read, so nothing this process writes or prints can show it (``endpoint.redact``)."""

from __future__ import annotations

import os

from agentload.endpoint.redact import SECRETS
from agentload.errors import ConfigError

# Read when no variable is named, and only when it is set: most local servers want no key.
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


def resolve_key_env(name: str | None) -> str:
    """The variable to read the API key from: ``name``, else ``OPENAI_API_KEY``.

    A variable named on purpose must be set — a typo would otherwise send no key and show up only as a 401 per
    request; the default may be unset (most local servers want no key).
    """
    if name is None:
        return DEFAULT_API_KEY_ENV
    if not os.environ.get(name):
        raise ConfigError(f"--api-key-env {name}: that environment variable is not set")
    return name


def read_api_key(name: str | None) -> str | None:
    """The API key itself (see ``resolve_key_env``), or None when there is none to send; registered as a secret."""
    key = os.environ.get(resolve_key_env(name)) or None
    SECRETS.add(key)
    return key
