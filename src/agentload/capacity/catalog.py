"""Model and GPU catalogues, read from the TOML data files shipped in ``agentload/data/catalog``."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from pydantic import ValidationError

from agentload.capacity.hardware import GpuSpec
from agentload.capacity.models import ModelSpec
from agentload.errors import ConfigError, UnknownNameError
from agentload.inputs import parse_toml


def read_toml_text(text: str, source: str) -> dict[str, Any]:
    return parse_toml(text, source)


def _data_text(*parts: str) -> str:
    return resources.files("agentload.data").joinpath(*parts).read_text(encoding="utf-8")


def validation_message(exc: ValidationError) -> str:
    """Pydantic's errors as one line naming each bad field."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _split_aliases(raw: dict[str, Any], source: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Entries without their ``aliases`` lists, and every normalised alias mapped to its entry's name.

    Aliases let a Hugging Face id ("meta-llama/Llama-3.1-8B-Instruct") or a marketing name ("RTX PRO 6000
    Blackwell") find the entry; they are not model fields, so they are taken out before validation.
    """
    entries: dict[str, dict[str, Any]] = {}
    aliases: dict[str, str] = {}
    for name, fields in raw.items():
        fields = dict(fields)
        names = fields.pop("aliases", [])
        if not isinstance(names, list) or not all(isinstance(a, str) for a in names):
            raise ConfigError(f"{source} [{name}]: aliases must be a list of strings")
        for alias in names:
            key = _normalise(alias)
            if key in raw or aliases.get(key, name) != name:
                raise ConfigError(f"{source} [{name}]: alias {alias!r} already names another entry")
            aliases[key] = name
        entries[name] = fields
    return entries, aliases


@cache
def _model_table() -> tuple[dict[str, ModelSpec], dict[str, str]]:
    raw = read_toml_text(_data_text("catalog", "models.toml"), "models.toml")
    entries, aliases = _split_aliases(raw, "models.toml")
    return {name: model_from_mapping(name, fields, "models.toml") for name, fields in entries.items()}, aliases


@cache
def _gpu_table() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    raw = read_toml_text(_data_text("catalog", "gpus.toml"), "gpus.toml")
    entries, aliases = _split_aliases(raw, "gpus.toml")
    out = {}
    for name, fields in entries.items():
        try:
            out[name] = GpuSpec(name=name, **fields)
        except ValidationError as exc:
            raise ConfigError(f"gpus.toml [{name}]: {validation_message(exc)}") from exc
    return out, aliases


def models() -> dict[str, ModelSpec]:
    return _model_table()[0]


def gpus() -> dict[str, GpuSpec]:
    return _gpu_table()[0]


def model_from_mapping(name: str, fields: dict[str, Any], source: str) -> ModelSpec:
    try:
        return ModelSpec(name=name, **fields)
    except (ValidationError, TypeError) as exc:
        detail = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ConfigError(f"{source} [{name}]: {detail}") from exc


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").split("/")[-1]


def get_model(name: str) -> ModelSpec:
    """A catalogue model by name or alias (case-insensitive; a Hugging Face 'org/Name' works too)."""
    table, aliases = _model_table()
    key = _normalise(name)
    key = aliases.get(key, key)
    if key in table:
        return table[key]
    raise UnknownNameError("model", name, table)


def get_gpu(name: str) -> GpuSpec:
    """A catalogue GPU by name or alias (case-insensitive)."""
    table, aliases = _gpu_table()
    key = _normalise(name)
    key = aliases.get(key, key)
    if key in table:
        return table[key]
    raise UnknownNameError("GPU", name, table)
