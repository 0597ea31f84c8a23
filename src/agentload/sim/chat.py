"""OpenAI request bodies, validated, and the chat template that turns messages into prompt text.

The template is ChatML as Qwen models use it (tools listed in the system turn, calls as ``<tool_call>`` JSON,
results as ``<tool_response>``), so prompts look like a real server's and a conversation's earlier turns render
to the very same text — and so the same tokens and cached blocks — every time they are resent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticSerializationError

from agentload.errors import BadRequestError


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = ""
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text; content parts of type text are joined, other parts are ignored."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") in ("text", "input_text"))


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    # Unknown OpenAI parameters (temperature, top_p, ...) are accepted and ignored, as vLLM does.
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)

    @field_validator("n")
    @classmethod
    def _only_one(cls, v: int) -> int:
        if v != 1:
            raise ValueError("the simulator returns one choice (n must be 1)")
        return v

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def forced_tool(self) -> str | None:
        """The tool the caller forces by name, if any."""
        tc = self.tool_choice
        if isinstance(tc, dict):
            fn = tc.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                return str(fn["name"])
        return None


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]

    def prompt_text(self) -> str:
        p = self.prompt
        if isinstance(p, str):
            return p
        if all(isinstance(x, str) for x in p):
            if len(p) != 1:
                raise BadRequestError("the simulator takes one prompt per request", param="prompt")
            return str(p[0])
        raise BadRequestError("token-id prompts are not supported; send text", param="prompt")


def load_json(raw: bytes) -> Any:
    """The JSON value of a request body, or BadRequestError.

    orjson rather than ``json``: ``json`` raises RecursionError (a 500) on a body nested 100,000 deep and accepts
    lone surrogates, which then fail when the prompt is encoded; orjson refuses both, and NaN, as invalid JSON.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}") from exc


def parse_body(model: type[BaseModel], raw: bytes) -> Any:
    """Validate a JSON body into ``model``; any problem becomes one BadRequestError naming the field."""
    data = load_json(raw)
    if not isinstance(data, dict):
        raise BadRequestError("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequestError(f"{where}: {first['msg']}", param=where or None) from exc


def render_tool_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments or "{}"}}}\n</tool_call>'


def _tool_listing(tools: list[Tool]) -> str:
    try:
        return "\n".join(json.dumps(t.model_dump(exclude_none=True), sort_keys=True) for t in tools)
    except (RecursionError, PydanticSerializationError) as exc:
        # orjson parses up to 1,024 levels but json.dumps recurses in C and gives up near 1,000: a tool schema that
        # deep is no schema, and must be a 400 rather than the 500 a RecursionError would become.
        raise BadRequestError("tools: a parameters schema nested too deeply to render", param="tools") from exc


PAD = "<|pad|> "  # one token on any tokenizer of the simulator's (sim.tokens: a special token is one)


@dataclass(frozen=True)
class TemplatePads:
    """One-token pieces that make the simulator's ChatML cost what a calibrated server's chat template does.

    A real template's headers and end markers cost a dozen or more tokens per opening on a real vocabulary, where
    the simulator's cost three to five; that offset moves every prompt's length against the KV block edges, so which
    block of a held conversation is full and cached differs from the server's. Pads go where a real template's cost
    is: ``start`` at the prompt's start (a BOS, a default system text), ``header`` after every header (the generation
    prompt is the assistant's header, so a reply's prefix stays cached), ``end`` after a system or assistant
    message's end marker and ``end_user`` after a user or tool message's (a message's first word, with no space
    before it, often costs a real tokenizer more than in running text: that is a cost per message, not per prompt).
    """

    start: int = 0
    header: int = 0
    end: int = 0
    end_user: int = 0

    @classmethod
    def fit(cls, opening: int, exchange: int, *, plain: bool) -> TemplatePads:
        """Pads for a server whose template adds ``opening`` tokens to a system and a user message and the
        generation prompt, and ``exchange`` to one more assistant and user message (beyond their words).

        The simulator's own cost is one token a header, and one an end marker except on the one-token-a-word
        tokenizer, which folds it into the message's last word: an opening ``3 + 2·m``, an exchange ``2 + 2·m``. Padded,
        ``opening − exchange = start + 1 + header``: the header pads take that difference (as much as the exchange's
        two messages leave room for), ``start`` the rest, and the exchange's remainder goes to the end pads. A server
        whose template costs less than the simulator's own cannot be matched (nothing is taken away)."""
        marker = 0 if plain else 1
        base = 2 + 2 * marker  # an exchange's own cost; an opening's is one more (the generation prompt)
        spare = opening - exchange - 1
        header = max(0, min(spare, (exchange - base) // 2))
        rest = max(0, exchange - base - 2 * header)
        return cls(start=max(0, spare - header), header=header, end=rest // 2, end_user=rest - rest // 2)

    @property
    def none(self) -> bool:
        return not (self.start or self.header or self.end or self.end_user)


NO_PADS = TemplatePads()


def render_chat(req: ChatRequest, pads: TemplatePads = NO_PADS) -> str:
    """The prompt text the model would see, ending with the assistant generation prompt."""
    return "".join(render_chat_parts(req, pads))


def render_chat_parts(req: ChatRequest, pads: TemplatePads = NO_PADS) -> list[str]:
    """The prompt as one piece per message. Every piece starts with ``<|im_start|>`` (or the start's pads) and the
    ones before the last end with white space (a newline, or a pad's space), so each boundary is also a token
    boundary: tokenizing piece by piece gives exactly the tokens of the joined text (which lets the server cache a
    conversation's earlier messages)."""
    header, end, end_user = PAD * pads.header, PAD * pads.end, PAD * pads.end_user
    parts: list[str] = [PAD * pads.start] if pads.start else []
    messages = list(req.messages)
    system = ""
    if messages and messages[0].role in ("system", "developer"):
        system = messages.pop(0).text()
    if req.tools:
        listing = _tool_listing(req.tools)
        system = (system + "\n\n" if system else "") + (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"<tools>\n{listing}\n</tools>\n\nFor each function call, return a json object within "
            "<tool_call></tool_call> XML tags."
        )
    if system:
        parts.append(f"<|im_start|>system\n{header}{system}<|im_end|>\n{end}")
    for m in messages:
        if m.role == "assistant":
            body = m.text()
            for call in m.tool_calls or []:
                body += ("\n" if body else "") + render_tool_call(call.function.name, call.function.arguments)
            parts.append(f"<|im_start|>assistant\n{header}{body}<|im_end|>\n{end}")
        elif m.role in ("tool", "function"):
            text = m.text()
            parts.append(f"<|im_start|>user\n{header}<tool_response>\n{text}\n</tool_response><|im_end|>\n{end_user}")
        elif m.role == "user":
            parts.append(f"<|im_start|>user\n{header}{m.text()}<|im_end|>\n{end_user}")
        else:
            parts.append(f"<|im_start|>system\n{header}{m.text()}<|im_end|>\n{end}")
    parts.append(f"<|im_start|>assistant\n{header}")
    return parts
