"""Workloads by name: ``get_workload("agentic")``, ``"agentic-hold"``, ``"agentic-coding"``, ``"synthetic"``,
``"suite"``, ``"trace:PATH"``; options are the workload's keyword settings, and an unknown name or option is a
ConfigError that lists the known ones.

``ignore_eos=True`` (agentic, agentic-coding, synthetic, trace) asks vLLM / SGLang to generate exactly
``max_tokens`` — the sizes the workload intends — instead of stopping at the model's end of sequence; servers
without that extension may reject it, so it is off unless asked for. ``extra_body`` adds any other fields to every
request.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from agentload.errors import ConfigError, UnknownNameError
from agentload.workload.agentic import SHAPE_OPTIONS, AgenticWorkload, Growth
from agentload.workload.base import Workload
from agentload.workload.coding import CODING_OPTIONS, CodingWorkload
from agentload.workload.suite import SUITE_OPTIONS, SuiteWorkload
from agentload.workload.synthetic import SyntheticWorkload
from agentload.workload.trace import trace_workload

TRACE_PREFIX = "trace:"
# ``synthetic:1024/256``: every request 1,024 prompt and 256 output tokens, the random dataset of
# ``vllm bench serve --random-input-len 1024 --random-output-len 256`` (the source article's synthetic load).
SYNTHETIC_PREFIX = "synthetic:"
_SIZES = re.compile(r"^\s*(\d{1,7})\s*/\s*(\d{1,7})\s*$")


def _fixed_sizes(text: str) -> dict[str, int]:
    m = _SIZES.match(text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ConfigError(f"synthetic:{text}: expected synthetic:IN/OUT in tokens, e.g. synthetic:1024/256")
    return {"input_len": int(m.group(1)), "output_len": int(m.group(2))}


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


def _coding(options: dict[str, Any]) -> Workload:
    _check("agentic-coding", options, CODING_OPTIONS + _BODY_OPTIONS)
    extra = _body(options)
    return CodingWorkload(shape_options=options, extra_body=extra)


def _synthetic(options: dict[str, Any]) -> Workload:
    _check("synthetic", options, (*SHAPE_OPTIONS, *_BODY_OPTIONS, "pace", "input_len", "output_len"))
    extra = _body(options)
    pace = bool(options.pop("pace", False))
    fixed = {k: options.pop(k) for k in ("input_len", "output_len") if k in options}
    return SyntheticWorkload(shape_options=options, pace=pace, extra_body=extra, **fixed)


def _suite(options: dict[str, Any]) -> Workload:
    _check("suite", options, SUITE_OPTIONS)
    return SuiteWorkload(**options)


_FACTORIES: dict[str, Callable[[dict[str, Any]], Workload]] = {
    "agentic": _agentic("grow"),
    "agentic-hold": _agentic("hold"),
    "agentic-coding": _coding,
    "synthetic": _synthetic,
    "suite": _suite,
}


def known_workloads() -> list[str]:
    return [*_FACTORIES, f"{SYNTHETIC_PREFIX}IN/OUT", f"{TRACE_PREFIX}FILE"]


def get_workload(spec: str, **options: Any) -> Workload:
    """The workload ``spec`` names, configured with ``options``."""
    spec = spec.strip()
    opts = dict(options)
    if spec.startswith(TRACE_PREFIX):
        path = spec.removeprefix(TRACE_PREFIX).strip()
        if not path:
            raise ConfigError("trace: needs a file, e.g. trace:sessions.jsonl")
        _check("trace", opts, ("speed", "timing", "repeat", "time_scale", "start", *_BODY_OPTIONS))
        extra = _body(opts)
        return trace_workload(path, extra_body=extra, **opts)
    if spec.startswith(SYNTHETIC_PREFIX):
        return _synthetic({**opts, **_fixed_sizes(spec.removeprefix(SYNTHETIC_PREFIX))})
    factory = _FACTORIES.get(spec)
    if factory is None:
        raise UnknownNameError("workload", spec, known_workloads())
    return factory(opts)
