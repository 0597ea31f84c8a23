"""Workloads by name: ``get_workload("agentic")``, ``"agentic-hold"``, ``"synthetic"``, ``"suite"``,
``"trace:PATH"``; options are the workload's keyword settings, and an unknown name or option is a ConfigError
that lists the known ones.

``ignore_eos=True`` (agentic, synthetic, trace) asks vLLM / SGLang to generate exactly ``max_tokens`` — the sizes
the workload intends — instead of stopping at the model's end of sequence; servers without that extension may
reject it, so it is off unless asked for. ``extra_body`` adds any other fields to every request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentload.errors import ConfigError, UnknownNameError
from agentload.workload.agentic import SHAPE_OPTIONS, AgenticWorkload, Growth
from agentload.workload.base import Workload
from agentload.workload.suite import SUITE_OPTIONS, SuiteWorkload
from agentload.workload.synthetic import SyntheticWorkload
from agentload.workload.trace import trace_workload

TRACE_PREFIX = "trace:"
_BODY_OPTIONS = ("extra_body", "ignore_eos")


def _body(options: dict[str, Any]) -> dict[str, Any]:
    """Pop the request-body options into one ``extra_body``."""
    given = options.pop("extra_body", None) or {}
    if not isinstance(given, Mapping):
        raise ConfigError("extra_body must be a mapping of request fields")
    extra = dict(given)
    if options.pop("ignore_eos", False):
        extra["ignore_eos"] = True
    return extra


def _check(name: str, options: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f"unknown {name} option {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _agentic(growth: Growth) -> Callable[[dict[str, Any]], Workload]:
    def make(options: dict[str, Any]) -> Workload:
        name = "agentic" if growth == "grow" else "agentic-hold"
        _check(name, options, SHAPE_OPTIONS + _BODY_OPTIONS)
        extra = _body(options)
        return AgenticWorkload(growth, shape_options=options, extra_body=extra)

    return make


def _synthetic(options: dict[str, Any]) -> Workload:
    _check("synthetic", options, (*SHAPE_OPTIONS, *_BODY_OPTIONS, "pace"))
    extra = _body(options)
    pace = bool(options.pop("pace", False))
    return SyntheticWorkload(shape_options=options, pace=pace, extra_body=extra)


def _suite(options: dict[str, Any]) -> Workload:
    _check("suite", options, SUITE_OPTIONS)
    return SuiteWorkload(**options)


_FACTORIES: dict[str, Callable[[dict[str, Any]], Workload]] = {
    "agentic": _agentic("grow"),
    "agentic-hold": _agentic("hold"),
    "synthetic": _synthetic,
    "suite": _suite,
}


def known_workloads() -> list[str]:
    return [*_FACTORIES, f"{TRACE_PREFIX}FILE"]


def get_workload(spec: str, **options: Any) -> Workload:
    """The workload ``spec`` names, configured with ``options``."""
    spec = spec.strip()
    opts = dict(options)
    if spec.startswith(TRACE_PREFIX):
        path = spec.removeprefix(TRACE_PREFIX).strip()
        if not path:
            raise ConfigError("trace: needs a file, e.g. trace:sessions.jsonl")
        _check("trace", opts, ("speed", "timing", "repeat", *_BODY_OPTIONS))
        extra = _body(opts)
        return trace_workload(path, extra_body=extra, **opts)
    factory = _FACTORIES.get(spec)
    if factory is None:
        raise UnknownNameError("workload", spec, known_workloads())
    return factory(opts)
