"""Tools an agent can call: a registry of named functions with JSON-schema parameters.

A tool returns text (what goes back to the model as the tool message). Failures are text too — an unknown tool,
arguments that are not JSON, an exception inside the tool — because a real agent harness reports them to the
model rather than crashing the agent. File tools are confined to one workspace directory per agent.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        except ValueError:
            return ToolResult(f"error: the arguments for {name} are not valid JSON", error=True)
        if not isinstance(args, dict):
            return ToolResult(f"error: the arguments for {name} must be a JSON object", error=True)
        try:
            out = tool.fn(args)
            if inspect.isawaitable(out):
                out = await out
        except Exception as exc:  # a tool's own failure is reported to the model, as a harness would
            return ToolResult(f"error: {name} failed: {exc}", error=True)
        return ToolResult(str(out))


def _inside(root: Path, relative: str) -> Path:
    """Resolve ``relative`` under ``root``; refuse anything that escapes it (.., absolute paths, symlinks)."""
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise PermissionError(f"{relative!r} is outside the agent's workspace")
    return target


def workspace_tools(root: Path, latency_s: float = 0.0) -> list[Tool]:
    """read_file / write_file / list_files confined to ``root`` (created if missing)."""
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()

    def read_file(args: Mapping[str, Any]) -> str:
        return _inside(root, str(args.get("path", ""))).read_text(encoding="utf-8")

    def write_file(args: Mapping[str, Any]) -> str:
        path = _inside(root, str(args.get("path", "")))
        path.parent.mkdir(parents=True, exist_ok=True)
        text = str(args.get("content", ""))
        path.write_text(text, encoding="utf-8")
        return f"wrote {len(text)} characters to {path.relative_to(root)}"

    def list_files(args: Mapping[str, Any]) -> str:
        base = _inside(root, str(args.get("path", ".")))
        return "\n".join(sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())) or "(empty)"

    path_param = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return [
        Tool("read_file", "Read a text file from the workspace.", path_param, read_file, latency_s),
        Tool(
            "write_file",
            "Write a text file in the workspace.",
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
