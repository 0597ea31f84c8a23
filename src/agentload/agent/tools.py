"""Tools an agent can call: a registry of named functions with JSON-schema parameters.

A tool returns text (what goes back to the model as the tool message). Failures are text too — an unknown tool,
arguments that are not JSON, an exception inside the tool — because a real agent harness reports them to the
model rather than crashing the agent. File tools are confined to one workspace directory per agent
(``agent.workspace``: walked by directory handle, links never followed, sizes capped).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentload.agent.workspace import MAX_FILE_BYTES, Workspace
from agentload.errors import ConfigError

ToolFn = Callable[[Mapping[str, Any]], "str | Awaitable[str]"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn
    latency_s: float = 0.0  # simulated execution time, slept on the agent's clock

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


@dataclass(frozen=True)
class ToolResult:
    text: str
    error: bool = False


@dataclass
class ToolRegistry:
    _tools: dict[str, Tool] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Iterable[Tool]) -> ToolRegistry:
        reg = cls()
        for t in tools:
            reg.register(t)
        return reg

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ConfigError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    async def call(self, name: str, arguments: str) -> ToolResult:
        tool = self._tools.get(name)
        if tool is None:
            return ToolResult(f"error: there is no tool named {name!r}", error=True)
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # RecursionError: arguments nested deeper than json's C decoder goes
            return ToolResult(f"error: the arguments for {name} are not valid JSON", error=True)
        if not isinstance(args, dict):
            return ToolResult(f"error: the arguments for {name} must be a JSON object", error=True)
        try:
            out = tool.fn(args)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:  # a tool's own failure is reported to the model, as a harness would
            # Some exceptions carry no message (MemoryError(), a bare raise of a class): name the kind instead.
            return ToolResult(f"error: {name} failed: {str(exc) or type(exc).__name__}", error=True)
        return ToolResult(str(out))


def workspace_tools(root: Path, latency_s: float = 0.0) -> list[Tool]:
    """read_file / write_file / list_files confined to ``root`` (created if missing) by ``agent.workspace``."""
    workspace = Workspace(root)

    def read_file(args: Mapping[str, Any]) -> str:
        return workspace.read_text(str(args.get("path", "")))

    def write_file(args: Mapping[str, Any]) -> str:
        text = str(args.get("content", ""))
        written = workspace.write_text(str(args.get("path", "")), text)
        return f"wrote {len(text)} characters to {written}"

    def list_files(args: Mapping[str, Any]) -> str:
        return "\n".join(workspace.list_files(str(args.get("path", ".")))) or "(empty)"

    path_param = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return [
        Tool(
            "read_file",
            f"Read a text file (at most {MAX_FILE_BYTES} bytes) from the workspace.",
            path_param,
            read_file,
            latency_s,
        ),
        Tool(
            "write_file",
            f"Write a text file (at most {MAX_FILE_BYTES} bytes) in the workspace.",
            {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
            write_file,
            latency_s,
        ),
        Tool("list_files", "List the files under a workspace directory.", path_param, list_files, latency_s),
    ]
