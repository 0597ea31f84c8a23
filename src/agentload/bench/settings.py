"""A bench run's settings: the flags it was started with, checked once, stored as its invocation (``bench.json``)
and read back to resume it.

The fields are the run's flags as the user gives them (``"120s"``, ``"1,16,64"``), which is also what ``bench.json``
has always held, so a run stored by an earlier agentload resumes; what the run does with them (seconds, counts, its
mode) is derived here, from the one model. ``--out``, ``--json``, ``--resume``, the dashboard and the executor are
not the run's but the invocation's, and stay out of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentload.bench.orchestrate import Mode
from agentload.bench.search import Slo, parse_slo
from agentload.endpoint.redact import redact_url
from agentload.errors import CheckpointError, ConfigError
from agentload.inputs import check_seed
from agentload.workload.registry import REPLY_OPTION, TRACE_PREFIX, check_reply

# What a bare ``agentload bench`` runs: the source article's deployment, simulated.
DEFAULT_SIM = "qwen3-235b-gb300"
# One decimal number ("90", "1.5", ".5"), so "1.2.3s" is refused here rather than by float() with a traceback.
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(s|m|h)?\s*$")
# Upper bounds on the flags: far past any real run, low enough that a typo cannot start a billion
# agents or a window that never ends.
MAX_DURATION_S = 30 * 86_400.0
MAX_AGENTS = 100_000
MAX_CONTEXT = 2**24
# Flags a resume may give again: how to reach the server, which a run directory does not keep whole.
RESUME_MAY_REPEAT = ("url", "api_key_env", "wait_ready")
# The trace-pace fields: their flag, and the ``trace:FILE`` option each gives (``workload.registry``).
TRACE_FLAGS = {
    "time_scale": "--time-scale",
    "trace_speed": "--trace-speed",
    "trace_timing": "--trace-timing",
    "trace_repeat": "--trace-repeat",
    "start": "--start",
}
TRACE_OPTIONS = {
    "time_scale": "time_scale",
    "trace_speed": "speed",
    "trace_timing": "timing",
    "trace_repeat": "repeat",
    "start": "start",
}


def parse_counts(text: str, flag: str, maximum: int) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r}: expected whole numbers separated by commas, e.g. 1,16,64") from exc
    if not counts or counts[0] < 1:
        raise ConfigError(f"{flag} {text!r}: every count must be at least 1")
    if counts[-1] > maximum:
        raise ConfigError(f"{flag} {text!r}: at most {maximum:,}")
    return counts


def parse_duration(text: str, flag: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"{flag} {text!r}: expected a duration such as 90s, 30m or 2h")
    value = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise ConfigError(f"{flag} {text!r}: must be positive")
    if value > MAX_DURATION_S:
        raise ConfigError(f"{flag} {text!r}: at most 30 days ({MAX_DURATION_S:,.0f} s)")
    return value


class BenchSettings(BaseModel):
    """A bench run's flags, checked together: a wrong value or combination is one ``ConfigError`` at construction.

    Each field's description is its flag's help (``agentload bench --help``). Strict, so ``bench.json`` read back
    has the types it was written with (a damaged file is one clear error); the two float flags also take a whole
    number, which is how JSON writes ``0.0``.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    url: str | None = Field(default=None, description="OpenAI-compatible server (real time).")
    model: str | None = Field(
        default=None, description="Model id to request (with --url; default: the one model the server serves)."
    )
    api_key_env: str | None = None  # its help is the one every command shares (cli.common.ApiKeyEnvOption)
    sim: str | None = Field(default=None, description="Simulator profile, run in process in virtual time (no sockets).")
    offload_gib: float | None = Field(
        default=None,
        strict=False,
        description="With --sim: a CPU KV offload tier of this many GiB (vLLM --kv-offloading-size; 0: none).",
    )
    workload: str = Field(
        default="agentic-hold",
        description="agentic, agentic-hold, agentic-coding, synthetic, synthetic:IN/OUT, suite, or trace:FILE.",
    )
    context: str = Field(
        default="40960", description="Context per agent, tokens; a list makes a context × agents grid."
    )
    sweep: str | None = Field(default=None, description="Agent counts to measure, e.g. 1,16,64,128.")
    find_knee: bool = Field(default=False, description="Search the knee (bracket + bisect).")
    slo: str | None = Field(default=None, description="A level past this breaks the knee, e.g. ttft_p95=2s.")
    soak: str | None = Field(default=None, description="Hold --agents for this long (e.g. 30m) and report drift.")
    agents: int | None = Field(default=None, description="Agents for a single level or a soak.")
    warmup: str = Field(default="120s", description="Warm-up per level, discarded.")
    window: str = Field(
        default="300s",
        description="Measured window per level, a cap: at its end the requests in flight get a grace of a quarter "
        "of it (10-120 s), then are cut and recorded.",
    )
    tolerance: float = Field(default=0.10, strict=False, description="Drop below the best that marks the knee.")
    max_agents: int = Field(default=1024, description="The knee search's largest count.")
    compare_synthetic: bool = Field(
        default=False, description="Also run the matched synthetic arm for the real ÷ synthetic ratio."
    )
    seed: int = Field(default=0, description="Seed for workload sizes.")
    same_text: bool = Field(
        default=False,
        description="Draw the workload's text from --seed alone (default: salted with the run, so a rerun against "
        "the same server does not find its prefixes cached): two runs with the same seed send the same words, to "
        "compare two servers, or a server and its calibrated simulator, on identical prompts.",
    )
    natural_output: bool = Field(
        default=False,
        description="Let the model end its replies (default: ask the engine for exactly the workload's lengths).",
    )
    min_turns: int | None = Field(
        default=None,
        description="Completed turns a level's window wants in all (default 60; and 8 per agent); --window caps it.",
    )
    no_pin_slots: bool = Field(
        default=False,
        description="On a slot server (llama.cpp -np N), let the server choose each turn's slot (default: agent i's "
        "turns name slot i mod N with id_slot, so past N slots a turn queues for its own slot).",
    )
    wait_ready: str = Field(
        default="120s",
        description="With --url: how long to wait for a server still starting (refusing, or /health 503).",
    )
    reply_tokens: int | None = Field(
        default=None,
        description="Mean reply a turn, tokens, of agentic, agentic-hold, agentic-coding and synthetic, at any "
        "--context (default: each workload's own).",
    )
    # A trace replay's pace: each is the trace option of the same meaning (``TRACE_FLAGS`` names it), unset unless
    # given, so a run stored before they existed resumes unchanged.
    time_scale: float | None = Field(
        default=None,
        strict=False,
        description="With --workload trace:FILE of conversations: their recorded waits times this (0.1: ten times "
        "faster; 0: none).",
    )
    trace_speed: float | None = Field(
        default=None,
        strict=False,
        description="With --workload trace:FILE of rows or sessions (JSONL, CSV): its time divided by this (2: "
        "twice the rate).",
    )
    trace_timing: str | None = Field(
        default=None,
        description="With --workload trace:FILE of sessions: 'recorded' (each starts at its recorded time, the "
        "default) or 'closed' (back to back).",
    )
    trace_repeat: bool | None = Field(
        default=None,
        description="With --workload trace:FILE of rows or sessions: loop it until the level ends (default: only "
        "when it is shorter than a level); --no-trace-repeat refuses a trace shorter than a level.",
    )
    start: str | None = Field(
        default=None,
        description="With --workload trace:FILE of conversations or sessions: 'begin' (the default) or 'mid': each "
        "session starts at a seeded turn k, sent whole as one warm-up turn, then goes on at the recorded pace.",
    )

    @model_validator(mode="after")
    def _check(self) -> BenchSettings:
        if self.url and self.sim:
            raise ConfigError("use --url (a real server) or --sim (the simulator), not both")
        check_seed(self.seed)
        if self.offload_gib is not None and self.url:
            raise ConfigError("--offload-gib sizes the simulator's CPU tier; a real server's is its own (--sim only)")
        if self.model and not self.url:
            raise ConfigError("--model goes with --url; the simulator serves its profile's model")
        if self.api_key_env and not self.url:
            raise ConfigError("--api-key-env goes with --url; the simulator wants no key")
        modes = [m for m, on in (("sweep", self.sweep), ("find-knee", self.find_knee), ("soak", self.soak)) if on]
        if len(modes) > 1:
            raise ConfigError(f"choose one of --sweep, --find-knee, --soak (got {', '.join(modes)})")
        _ = self.contexts
        for flag, n in (("--agents", self.agents), ("--max-agents", self.max_agents)):
            if n is not None and n > MAX_AGENTS:
                raise ConfigError(f"{flag} {n:,}: at most {MAX_AGENTS:,}")
        _ = self.warmup_s, self.window_s, self.wait_ready_s, self.counts, self.slo_spec
        if self.reply_tokens is not None:
            try:
                if self.reply_tokens < 1:
                    raise ConfigError("must be at least 1 token")
                check_reply(self.workload, self.reply_tokens, self.contexts)
            except ConfigError as exc:
                raise ConfigError(f"--reply-tokens {self.reply_tokens}: {exc}") from exc
        given = [flag for name, flag in TRACE_FLAGS.items() if getattr(self, name) is not None]
        if given and not self.workload.strip().startswith(TRACE_PREFIX):
            raise ConfigError(f"{', '.join(given)} set a trace replay's pace: use with --workload trace:FILE")
        return self

    @property
    def workload_options(self) -> dict[str, Any]:
        """The workload options the flags give (none unless given): a trace's pace (the workload checks that each
        applies to the trace's format) and the mean reply."""
        options = {TRACE_OPTIONS[name]: v for name in TRACE_FLAGS if (v := getattr(self, name)) is not None}
        if self.reply_tokens is not None:
            options[REPLY_OPTION] = self.reply_tokens
        return options

    @property
    def simulator(self) -> str | None:
        """The simulator profile the run benches: ``--sim``, else the default scenario when no ``--url`` is given."""
        return self.sim or (None if self.url else DEFAULT_SIM)

    @property
    def mode(self) -> Mode:
        if self.sweep:
            return "grid" if len(self.contexts) > 1 else "sweep"
        # Bare `agentload bench` searches the knee on the default simulated server; `--agents N` alone still
        # means what it says there.
        bare = not self.url and not self.sim and self.agents is None and not self.soak
        if self.find_knee or bare:
            return "find-knee"
        return "soak" if self.soak else "single"

    @property
    def contexts(self) -> list[int]:
        return parse_counts(self.context, "--context", MAX_CONTEXT)

    @property
    def counts(self) -> list[int]:
        """The agent counts a sweep, a soak or a single level measures (none for a knee search)."""
        if self.sweep:
            return parse_counts(self.sweep, "--sweep", MAX_AGENTS)
        if self.mode == "find-knee":
            return []
        if self.agents is None:
            if self.soak:
                raise ConfigError("--soak needs --agents (the level to hold)")
            raise ConfigError("say what to run: --sweep, --find-knee, --soak DURATION --agents N, or --agents N")
        return [self.agents]

    @property
    def warmup_s(self) -> float:
        return parse_duration(self.warmup, "--warmup")

    @property
    def window_s(self) -> float:
        """A level's window; a soak's one level is held for the whole soak."""
        window = parse_duration(self.window, "--window")  # checked in a soak too
        return parse_duration(self.soak, "--soak") if self.soak and self.mode == "soak" else window

    @property
    def wait_ready_s(self) -> float:
        return parse_duration(self.wait_ready, "--wait-ready")

    @property
    def slo_spec(self) -> Slo | None:
        return parse_slo(self.slo) if self.slo else None

    @property
    def target(self) -> str:
        """Where the run sends its load, as printed and stored (a URL's credentials left out)."""
        return f"sim:{self.simulator} (virtual time)" if self.simulator else redact_url(self.url or "")

    def stored(self) -> dict[str, Any]:
        """The invocation as ``bench.json`` keeps it: every flag, a URL's credentials replaced (and marked so)."""
        flags = self.model_dump()
        if self.url is not None and redact_url(self.url) != self.url:
            flags.update(url=redact_url(self.url), url_redacted=True)  # credentials stay out of the run directory
        return flags

    @classmethod
    def resumed(cls, stored: Mapping[str, Any], given: Mapping[str, Any], where: Path) -> BenchSettings:
        """The settings a run stored in ``where`` (its ``bench.json``) was started with, to continue it.

        ``given``: the flags of the resuming command. Only how to reach the server may be given again (a URL
        whose credentials were not stored must be); any other flag the run was not started with is refused.
        """
        flags = dict(stored)
        redacted = flags.pop("url_redacted", False)
        unknown = sorted(set(flags) - set(cls.model_fields))
        if unknown:
            raise CheckpointError(f"{where} has flags this agentload does not know ({', '.join(unknown)})")
        if not isinstance(redacted, bool):
            raise CheckpointError(f"{where}: url_redacted: Input should be a valid boolean; the file is damaged")
        try:
            cls.model_validate(flags)  # the types it was written with; a wrong one is a damaged file
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"])
            raise CheckpointError(f"{where}: {at}: {first['msg']}; the file is damaged") from exc
        defaults = {name: field.default for name, field in cls.model_fields.items()}
        extra = [k for k in cls.model_fields if k not in RESUME_MAY_REPEAT and given.get(k, defaults[k]) != defaults[k]]
        if extra:
            named = ", ".join("--" + k.replace("_", "-") for k in extra)
            raise ConfigError(f"--resume continues the run with the flags it was started with; drop {named}")
        # A run started before slot pinning existed let the server choose slots: resumed, it goes on the same way.
        flags.setdefault("no_pin_slots", True)
        url = given.get("url")
        if redacted:
            # The URL held credentials, which the run directory does not keep: the same server, given again.
            if url is None or redact_url(url) != flags.get("url"):
                raise ConfigError(f"the run was started against {flags.get('url')}; give that --url again to resume it")
            flags["url"] = url
        elif url is not None and url != flags.get("url"):
            raise ConfigError(
                f"the run was started against {redact_url(str(flags.get('url')))}; a resume continues against it "
                "(drop --url, or start a new run)"
            )
        for k in ("api_key_env", "wait_ready"):
            if given.get(k, defaults[k]) != defaults[k]:
                flags[k] = given[k]
        return cls.model_validate(flags)
