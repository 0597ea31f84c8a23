"""Three agent frameworks, unmodified, finish the twenty tasks of ``tests/agent_tasks.py`` against the simulator's
agent model (``AgentBehaviour``) on 127.0.0.1: openai-agents, LangGraph's ReAct agent and smolagents'
ToolCallingAgent. Each must complete at least 18 of 20 with the right final answer and meet no HTTP error.

No network beyond loopback: openai-agents' tracing is switched off, and nothing counts tokens with tiktoken.
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from agentload.sim.agentmodel import AgentBehaviour
from tests.agent_tasks import TASKS, AgentTask
from tests.simserver import running_sim

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MIN_COMPLETED = 18


def _report(name: str, answers: list[str], errors: list[str]) -> int:
    done = sum(t.passed(a) for t, a in zip(TASKS, answers, strict=True))
    missed = {t.prompt[:60]: a[:160] for t, a in zip(TASKS, answers, strict=True) if not t.passed(a)}
    print(f"\n{name}: {done}/{len(TASKS)} completed, {len(errors)} errors; missed: {missed}; errors: {errors[:3]}")
    return done


# -- openai-agents ------------------------------------------------------------------------------------------------


async def _openai_agents(url: str, model: str) -> tuple[list[str], list[str]]:
    from agents import Agent, FunctionTool, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import APIStatusError, AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60.0)
    answers: list[str] = []
    errors: list[str] = []

    def as_tool(task: AgentTask, schema: dict[str, Any]) -> FunctionTool:
        fn = schema["function"]

        async def invoke(_ctx: Any, raw: str, name: str = fn["name"]) -> str:
            return task.run_tool(name, json.loads(raw or "{}"))

        return FunctionTool(name=fn["name"], description=fn["description"], params_json_schema=fn["parameters"],
                            on_invoke_tool=invoke, strict_json_schema=False)  # fmt: skip

    try:
        for task in TASKS:
            choice = task.tool_choice
            named = choice["function"]["name"] if isinstance(choice, dict) else None
            agent = Agent(
                name="assistant",
                instructions="You are a helpful assistant. Use the tools when they help.",
                tools=[as_tool(task, s) for s in task.schemas()],
                model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                model_settings=ModelSettings(tool_choice=named or str(choice)),
            )
            try:
                result = await Runner.run(agent, task.prompt, max_turns=12)
                answers.append(str(result.final_output or ""))
            except APIStatusError as exc:
                errors.append(f"HTTP {exc.status_code}")
                answers.append("")
            except Exception as exc:  # a framework's own stop (max turns) is a task not completed, not an HTTP error
                answers.append(f"({type(exc).__name__}: {exc})")
    finally:
        await client.close()
    return answers, errors


async def test_openai_agents_completes_the_tasks() -> None:
    async with running_sim(behaviour=AgentBehaviour()) as (server, url):
        answers, errors = await _openai_agents(url, server.model_name)
    assert not errors
    assert _report("openai-agents", answers, errors) >= MIN_COMPLETED


# -- LangGraph ------------------------------------------------------------------------------------------------------


async def _langgraph(url: str, model: str) -> tuple[list[str], list[str]]:
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from openai import APIStatusError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the brief's API: create_react_agent, deprecated in LangGraph 1.x
        from langgraph.prebuilt import create_react_agent

    answers: list[str] = []
    errors: list[str] = []
    llm = ChatOpenAI(model=model, base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)

    def as_tool(task: AgentTask, schema: dict[str, Any]) -> StructuredTool:
        fn = schema["function"]
        name = fn["name"]

        def call(**kwargs: Any) -> str:
            return task.run_tool(name, kwargs)

        return StructuredTool.from_function(func=call, name=name, description=fn["description"],
                                            args_schema=fn["parameters"])  # fmt: skip

    for task in TASKS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agent = create_react_agent(llm, [as_tool(task, s) for s in task.schemas()])
        try:
            state = await agent.ainvoke({"messages": [("user", task.prompt)]}, {"recursion_limit": 30})
            answers.append(str(state["messages"][-1].content))
        except APIStatusError as exc:
            errors.append(f"HTTP {exc.status_code}")
            answers.append("")
        except Exception as exc:  # a recursion limit is a task not completed
            answers.append(f"({type(exc).__name__}: {exc})")
    return answers, errors


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_langgraph_completes_the_tasks() -> None:
    async with running_sim(behaviour=AgentBehaviour()) as (server, url):
        answers, errors = await _langgraph(url, server.model_name)
    assert not errors
    assert _report("langgraph", answers, errors) >= MIN_COMPLETED


# -- smolagents -----------------------------------------------------------------------------------------------------


def _smolagents(url: str, model: str) -> tuple[list[str], list[str]]:
    from openai import APIStatusError
    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

    answers: list[str] = []
    errors: list[str] = []
    llm = OpenAIServerModel(model_id=model, api_base=f"{url}/v1", api_key="unused",
                            client_kwargs={"max_retries": 0, "timeout": 60.0})  # fmt: skip

    def as_tool(task: AgentTask, schema: dict[str, Any]) -> Tool:
        fn = schema["function"]
        props = fn["parameters"]["properties"]
        inputs = {k: {"type": v.get("type", "string"), "description": k.replace("_", " ")} for k, v in props.items()}
        forward: Callable[..., str] = lambda self, **kwargs: task.run_tool(fn["name"], kwargs)  # noqa: E731
        cls = type(
            f"T_{fn['name']}",
            (Tool,),
            {"name": fn["name"], "description": fn["description"], "inputs": inputs, "output_type": "string",
             "forward": forward, "skip_forward_signature_validation": True},
        )  # fmt: skip
        tool: Tool = cls()
        return tool

    for task in TASKS:
        agent = ToolCallingAgent(tools=[as_tool(task, s) for s in task.schemas()], model=llm, max_steps=10,
                                 verbosity_level=0)  # fmt: skip
        try:
            answers.append(str(agent.run(task.prompt)))
        except APIStatusError as exc:
            errors.append(f"HTTP {exc.status_code}")
            answers.append("")
        except Exception as exc:
            cause = exc.__cause__
            if isinstance(cause, APIStatusError):
                errors.append(f"HTTP {cause.status_code}")
            answers.append(f"({type(exc).__name__}: {exc})")
    return answers, errors


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_smolagents_completes_the_tasks() -> None:
    async with running_sim(behaviour=AgentBehaviour()) as (server, url):
        answers, errors = await asyncio.to_thread(_smolagents, url, server.model_name)
    assert not errors
    assert _report("smolagents", answers, errors) >= MIN_COMPLETED
