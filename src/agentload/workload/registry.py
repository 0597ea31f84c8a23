"""Workloads by name: ``get_workload("agentic")``, ``"agentic-hold"``, ``"agentic-coding"``, ``"synthetic"``,
``"suite"``, ``"trace:PATH"``; options are the workload's keyword settings, and an unknown name or option is a
ConfigError that lists the known ones.

``ignore_eos=True`` (agentic, agentic-coding, synthetic, trace) asks vLLM / SGLang to generate exactly
``max_tokens`` — the sizes the workload intends — instead of stopping at the model's end of sequence; servers
without that extension may reject it, so it is off unless asked for. ``extra_body`` adds any other fields to every
request.

``reply_tokens`` (agentic, agentic-hold, agentic-coding, synthetic) is the mean reply a turn, in tokens, whatever
the context: each workload's own output option (``output_tokens``: agentic's and synthetic's mean, agentic-coding's
median, reached through its spread) is set from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentload.agent.shape import OPENING_OVERHEAD_TOKENS, Lognormal
from agentload.errors import ConfigError, UnknownNameError
from agentload.workload.agentic import SHAPE_OPTIONS, AgenticWorkload, Growth
from agentload.workload.base import Workload
from agentload.workload.coding import CODING_OPTIONS, REPLY_SIGMA, CodingWorkload
from agentload.workload.sizing import SIMULATOR_SIZING
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


REPLY_OPTION = "reply_tokens"
# The workloads whose reply ``reply_tokens`` sets; the others state their own (a trace's rows, the suite's tests,
# ``synthetic:IN/OUT``'s OUT).
REPLY_WORKLOADS = ("agentic", "agentic-hold", "agentic-coding", "synthetic")


def _reply(name: str, options: dict[str, Any], median_sigma: float | None = None) -> None:
    """``reply_tokens`` as the workload's ``output_tokens``: the mean itself, or, where ``output_tokens`` is a
    lognormal's median (agentic-coding), the median whose mean it is at the workload's spread."""
    reply = options.pop(REPLY_OPTION, None)
    if reply is None:
        return
    if isinstance(reply, bool) or not isinstance(reply, int) or reply < 1:
        raise ConfigError(f"{REPLY_OPTION} must be a whole number of tokens, at least 1, got {reply!r}")
    if "output_tokens" in options:
        raise ConfigError(f"{name}: give {REPLY_OPTION} or output_tokens, not both")
    options["output_tokens"] = reply
    if median_sigma is not None:
        sigma = options.get("output_sigma", median_sigma)
        # A spread that is not a number is left for the workload's own check to name.
        if isinstance(sigma, int | float) and not isinstance(sigma, bool) and sigma >= 0:
            options["output_tokens"] = Lognormal.with_mean(reply, sigma).median


def check_reply(spec: str, reply: int, contexts: Sequence[int]) -> None:
    """That ``reply_tokens=reply`` applies to the workload ``spec`` and that each context holds it: a held
    session a prefix plus twice the reply, a grow session a second turn, a coding session two replies between
    its opening and the room it keeps for compaction. A context too small for the workload itself is not the
    reply's fault and is left for the run to refuse."""
    name = spec.strip()
    if name.startswith(TRACE_PREFIX):
        raise ConfigError("a trace states its own replies (each request's recorded output); drop it")
    if name.startswith(SYNTHETIC_PREFIX):
        raise ConfigError(f"{name} states its own reply (OUT); drop it or use --workload synthetic")
    if name not in REPLY_WORKLOADS:
        get_workload(name)  # an unknown name is named as such
        raise ConfigError(f"it sizes the replies of {', '.join(REPLY_WORKLOADS)}, not of {name}")
    plain, sized = get_workload(name), get_workload(name, **{REPLY_OPTION: reply})
    for context in contexts:
        try:
            plain.agents(1, context=context, seed=0)
        except ConfigError:
            continue
        sized.agents(1, context=context, seed=0)
        if isinstance(sized, CodingWorkload):
            shape = sized.shape(context)
            opening = shape.system_tokens + shape.prefix_tokens + OPENING_OVERHEAD_TOKENS
            room = context - opening - shape.reserve(SIMULATOR_SIZING)
            if 2 * reply > room:
                raise ConfigError(
                    f"a context of {context} leaves {room} tokens for a session's turns after its {opening}-token "
                    f"opening and the room kept to compact; the reply can be at most {max(room // 2, 0)} tokens here"
                )


def _agentic(growth: Growth) -> Callable[[dict[str, Any]], Workload]:
    def make(options: dict[str, Any]) -> Workload:
        name = "agentic" if growth == "grow" else "agentic-hold"
        _check(name, options, (*SHAPE_OPTIONS, *_BODY_OPTIONS, REPLY_OPTION))
        extra = _body(options)
        _reply(name, options)
        return AgenticWorkload(growth, shape_options=options, extra_body=extra)

    return make


def _coding(options: dict[str, Any]) -> Workload:
    _check("agentic-coding", options, (*CODING_OPTIONS, *_BODY_OPTIONS, REPLY_OPTION))
    extra = _body(options)
    _reply("agentic-coding", options, REPLY_SIGMA)
    return CodingWorkload(shape_options=options, extra_body=extra)


def _synthetic(options: dict[str, Any]) -> Workload:
    _check("synthetic", options, (*SHAPE_OPTIONS, *_BODY_OPTIONS, REPLY_OPTION, "pace", "input_len", "output_len"))
    extra = _body(options)
    pace = bool(options.pop("pace", False))
    fixed = {k: options.pop(k) for k in ("input_len", "output_len") if k in options}
    if fixed and REPLY_OPTION in options:
        raise ConfigError(f"a fixed-size synthetic load states its own reply (output_len); drop {REPLY_OPTION}")
    _reply("synthetic", options)
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
