"""Model and GPU catalogues, read from the TOML data files shipped in ``agentload/data/catalog``."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any

from pydantic import ValidationError

from agentload.capacity.hardware import GpuSpec
from agentload.capacity.models import ModelSpec
from agentload.errors import ConfigError, UnknownNameError


def read_toml_text(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc


def _data_text(*parts: str) -> str:
    return resources.files("agentload.data").joinpath(*parts).read_text(encoding="utf-8")


def validation_message(exc: ValidationError) -> str:
    """Pydantic's errors as one line naming each bad field."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


@cache
def models() -> dict[str, ModelSpec]:
    raw = read_toml_text(_data_text("catalog", "models.toml"), "models.toml")
    return {name: model_from_mapping(name, fields, "models.toml") for name, fields in raw.items()}


@cache
def gpus() -> dict[str, GpuSpec]:
    raw = read_toml_text(_data_text("catalog", "gpus.toml"), "gpus.toml")
    out = {}
    for name, fields in raw.items():
        try:
            out[name] = GpuSpec(name=name, **fields)
        except ValidationError as exc:
            raise ConfigError(f"gpus.toml [{name}]: {validation_message(exc)}") from exc
    return out


def model_from_mapping(name: str, fields: dict[str, Any], source: str) -> ModelSpec:
    try:
        return ModelSpec(name=name, **fields)
    except (ValidationError, TypeError) as exc:
        detail = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ConfigError(f"{source} [{name}]: {detail}") from exc


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").split("/")[-1]


def get_model(name: str) -> ModelSpec:
    """A catalogue model by name (case-insensitive; a Hugging Face 'org/Name' works too)."""
    table = models()
    key = _normalise(name)
    if key in table:
        return table[key]
    raise UnknownNameError("model", name, table)


def get_gpu(name: str) -> GpuSpec:
    table = gpus()
    key = _normalise(name)
    if key in table:
        return table[key]
    raise UnknownNameError("GPU", name, table)
