"""Reading the files a user hands us (fleets, profiles, config.json, traces) within stated limits:
they are untrusted input. And the one number every command takes the same way, ``--seed``.

Every loader reads through here, so a file that is not UTF-8 text, is larger than any real input of its kind, is
nested deeper than the parsers' recursion allows, or spells a number as ``NaN`` / ``Infinity``, is one
``ConfigError`` naming the file instead of a ``UnicodeDecodeError``, a ``RecursionError`` or a value that later
spins a loop or sizes an allocation.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, NoReturn

from agentload.errors import ConfigError

# numpy takes any non-negative seed; the bound keeps it inside a 64-bit integer (the run history's column).
MAX_SEED = 2**63 - 1


def check_seed(seed: int) -> int:
    """``seed`` if it is a whole number from 0 to MAX_SEED (``--seed -1`` was a numpy traceback), else ConfigError."""
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed {seed}: use a whole number from 0 to {MAX_SEED}")
    return seed


# The largest fleet, profile or config.json we read; the real ones are a few KiB. Traces have their own limit.
MAX_CONFIG_BYTES = 4 * 2**20


def read_text(path: Path, what: str, *, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """``path``'s text, or a ConfigError that says why it cannot be used as ``what`` (e.g. "fleet file")."""
    try:
        with path.open("rb") as f:
            # One byte past the limit tells "too large" from "exactly at the limit" without reading a huge file.
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > max_bytes:
        raise ConfigError(f"{what} {path} is larger than {max_bytes // 2**20} MiB, the most agentload reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from exc


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML ``text`` as a dict; ConfigError for invalid TOML or nesting too deep to parse."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{source}: nested too deeply to read") from exc


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number agentload accepts")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e400" overflows a double to inf
        raise ValueError(f"{text} is too large for a number")
    return value


def parse_json(text: str, source: str) -> Any:
    """JSON ``text`` with only finite numbers; ConfigError for invalid JSON, NaN / Infinity or deep nesting."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from exc
    except ValueError as exc:  # NaN, Infinity or a float too large for a double
        raise ConfigError(f"{source}: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{source}: nested too deeply to read") from exc
