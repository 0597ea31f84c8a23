"""The one error tree of agentload.

Catch ``AgentloadError`` to catch everything the package raises on purpose::

    AgentloadError
    ├── ConfigError            a profile, catalogue, config file or flag value is unusable
    │   └── UnknownNameError   a model / GPU / profile name that no catalogue knows (lists the known ones)
    ├── RequestError           a request the simulated server must refuse (mapped to an HTTP 4xx)
    │   ├── BadRequestError    malformed body or parameters (400)
    │   ├── ContextLengthError prompt + max_tokens exceed max_model_len (400)
    │   └── ModelNotFoundError the model name is not served (404)
    ├── EndpointError          talking to a server failed for the whole command (per-request failures are data
    │   │                      on the RequestRecord, never exceptions)
    │   ├── EndpointUnreachableError   nothing answers at the URL
    │   ├── EndpointTimeoutError       it answered too slowly for the command to go on
    │   ├── EndpointResponseError      it answered with an error status or an unusable body
    │   ├── ServerLostError            it stopped answering in the middle of a run (what was collected is saved)
    │   └── ServerCapabilityError      it works but lacks what the command needs (no pool figure, no metrics)
    ├── CheckpointError        a run directory, checkpoint file or run history is unusable
    ├── CalibrationError       the measurements cannot determine the step-time coefficients
    └── SimulationError        the simulator reached a state it cannot continue from (a bug or impossible config)

Foreign exceptions (tomllib, pydantic, OSError) are translated at the boundary with ``raise ... from exc`` so the
CLI can print one clear line and exit 2 instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class AgentloadError(Exception):
    """Base of every error agentload raises on purpose."""


class ConfigError(AgentloadError):
    """A profile, catalogue entry, config file or flag value cannot be used."""


class UnknownNameError(ConfigError):
    """A name that no catalogue knows; the message lists the known names."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known)}")


class RequestError(AgentloadError):
    """A request the simulated server refuses; ``status`` and ``code`` shape the OpenAI-style error body."""

    status = 400
    code = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BadRequestError(RequestError):
    """Malformed JSON, a wrong type, or a parameter out of range."""


class ContextLengthError(RequestError):
    """The prompt plus the requested output does not fit in max_model_len."""

    code = "context_length_exceeded"


class ModelNotFoundError(RequestError):
    """The request names a model this server does not serve."""

    status = 404
    code = "model_not_found"


class EndpointError(AgentloadError):
    """Talking to a server failed for the whole command."""


class EndpointUnreachableError(EndpointError):
    """Nothing answers at the URL (refused, DNS, TLS)."""


class EndpointTimeoutError(EndpointError):
    """The server answered too slowly for the command to go on."""


class EndpointResponseError(EndpointError):
    """The server answered with an error status or a body that cannot be used."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerLostError(EndpointError):
    """The server died or froze in the middle of a run; the run stopped and saved what it had collected."""


class ServerCapabilityError(EndpointError):
    """The server works but lacks what the command needs (a pool figure, a metrics endpoint)."""


class CheckpointError(AgentloadError):
    """A run directory or checkpoint file cannot be used to resume."""


class ExecutorError(AgentloadError):
    """The executor that runs the agents cannot go on (every Ray actor died)."""


class CalibrationError(AgentloadError):
    """The measurements cannot determine the coefficients (too few usable points, or none in a regime)."""


class SimulationError(AgentloadError):
    """The simulator cannot continue (an impossible configuration, or an internal invariant broke)."""
