"""``agentload plan``: how many agents one model on some GPUs carries, and the vLLM flags that realise it.

The command parses the flags into a ``capacity.planner.PlanSpec``, plans (``capacity.planner.plan``), adds the
simulated curve (``sim.curve``) with a progress bar on stderr, and prints the plan as JSON or as the tables of
``report.planview``.

With ``--slots N`` the server is llama.cpp's ``llama-server -np N``: the plan says N agents fit, the KV each slot
allocates, what happens past N (queueing for a slot) and the llama-server command.
"""

from __future__ import annotations

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from agentload.capacity.planner import PLAN_FLAGS, CurvePoint, parse_spec
from agentload.capacity.planner import plan as make_plan
from agentload.cli.common import console, err_console, reports_errors
from agentload.report.planview import render_plan
from agentload.sim.curve import add_throughput_curve


@reports_errors
def plan(
    model: str = typer.Option(..., "--model", "-m", help="Catalogue model name, or a path to a config.json."),
    gpu: str = typer.Option(..., "--gpu", "-g", help="Catalogue GPU name (h100, gb300, ...)."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs, as tensor parallelism."),
    max_model_len: int | None = typer.Option(None, "--max-model-len", help="Default: the model's context length."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto (= bf16), bf16, fp16 or fp8."),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization"),
    context_per_agent: int | None = typer.Option(
        None, "--context-per-agent", "-c", help="Tokens each agent's conversation holds. Default: max-model-len."
    ),
    offload_gib: float = typer.Option(0.0, "--offload-gib", help="CPU KV tier (vLLM --kv-offloading-size), GiB."),
    weight_dtype: str | None = typer.Option(
        None, "--weight-dtype", help="bf16, fp8 or fp4 (also fp16, int8, int4). Default: the checkpoint's."
    ),
    pool_tokens: int | None = typer.Option(
        None, "--pool-tokens", help="The pool a real server logged ('GPU KV cache size: N tokens'), if known."
    ),
    num_gpu_blocks: int | None = typer.Option(
        None, "--num-gpu-blocks", help="The pool in blocks, exact (vLLM's cache_config_info{num_gpu_blocks})."
    ),
    kv_memory_gib: float | None = typer.Option(
        None, "--kv-memory-gib", help="vLLM's logged 'Available KV cache memory' per GPU, GiB (to 0.01)."
    ),
    activation_gib: float = typer.Option(2.0, "--activation-gib", help="Activation + runtime allowance per GPU."),
    output_tokens: int = typer.Option(400, "--output-tokens", help="Simulated reply per turn, tokens."),
    think_s: float = typer.Option(2.0, "--think-s", help="Simulated tool time between turns, seconds."),
    slots: int | None = typer.Option(
        None, "--slots", help="Plan llama.cpp's llama-server -np N instead of vLLM: N slots, each its own cache."
    ),
    slot_context: int | None = typer.Option(
        None, "--slot-context", help="Tokens per slot with --slots (llama-server's -c ÷ -np). Default: max-model-len."
    ),
    no_curve: bool = typer.Option(False, "--no-curve", help="Skip the simulated throughput curve."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON instead of tables."),
) -> None:
    """Plan a deployment: weights, KV per token, the pool, vLLM's concurrency, agents at a context, the curve."""
    spec = parse_spec(
        {
            "model": model,
            "gpu": gpu,
            "num_gpus": gpus,
            "max_model_len": max_model_len,
            "kv_cache_dtype": kv_cache_dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "context_per_agent": context_per_agent,
            "offload_gib": offload_gib,
            "weight_dtype": weight_dtype,
            "activation_gib": activation_gib,
            "pool_tokens": pool_tokens,
            "num_gpu_blocks": num_gpu_blocks,
            "kv_memory_gib": kv_memory_gib,
            "agent": {"output_tokens": output_tokens, "think_s": think_s},
            "slots": slots,
            "slot_context": slot_context,
        },
        PLAN_FLAGS,
    )
    result = make_plan(spec)
    if no_curve:  # nothing is simulated, so the sources name no simulated figure
        result = result.model_copy(
            update={"derivations": tuple(d for d in result.derivations if d.kind != "simulated")}
        )
    else:
        with _CurveBar() as bar:
            result = add_throughput_curve(result, progress=bar)
    if as_json:
        console.print_json(result.model_dump_json())
    else:
        render_plan(result, console)


class _CurveBar:
    """A rich progress bar on stderr (so ``--json`` output stays clean), one bar per simulated run."""

    def __init__(self) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:>6.0f}/{task.total:.0f} virtual s"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._task = self._progress.add_task("simulating", total=1.0, visible=False)
        self._run = 0

    def __enter__(self) -> _CurveBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def run_started(self, agents: int, duration_s: float, runs_planned: int) -> None:
        self._run += 1
        self._progress.reset(
            self._task,
            total=duration_s,
            visible=True,
            description=f"curve: {agents} agents (run {self._run}/{max(runs_planned, self._run)})",
        )

    def advanced(self, virtual_s: float) -> None:
        self._progress.update(self._task, completed=virtual_s)

    def run_finished(self, point: CurvePoint) -> None:
        self._progress.update(self._task, completed=point.duration_s)
