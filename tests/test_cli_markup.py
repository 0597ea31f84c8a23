"""Text the user or a server chose is printed as text, never read as rich markup (a path with ``[/x]`` in it used
to end `agentload bench` in a MarkupError traceback after the run had been measured)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from agentload.cli.main import app

# A closing tag with no opening one: rich raises on it when it parses markup; "[bold]" would style silently.
ODD = "odd[/x][bold]dir"


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout + result.stderr


def test_bench_runs_and_report_under_a_root_with_markup_in_its_name(tmp_path: Path) -> None:
    root = tmp_path / ODD
    code, out = _invoke(["bench", "--sim", "laptop", "--context", "4096", "--agents", "1", "--warmup", "1s",
                         "--window", "5s", "--out", str(root)])  # fmt: skip
    assert code == 0, out
    assert ODD in out  # printed as it is, brackets and all
    code, out = _invoke(["runs", "--root", str(root)])
    assert code == 0, out
    assert ODD in out.replace("\n", "")
    (run,) = [p for p in root.iterdir() if p.is_dir()]
    code, out = _invoke(["report", str(run), "--print", "-o", str(tmp_path / "report.html")])
    assert code == 0, out


def test_a_trace_path_with_markup_is_named_as_it_is(tmp_path: Path) -> None:
    trace = tmp_path / "odd[bold]name.jsonl"  # read as markup, "[bold]" would vanish from the line
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1}\n' * 3)
    runs = str(tmp_path / "runs")
    code, out = _invoke(["bench", "--sim", "laptop", "--context", "4096", "--workload", f"trace:{trace}",
                         "--agents", "1", "--warmup", "1s", "--window", "5s", "--out", runs])  # fmt: skip
    assert code == 0, out
    assert f"trace:{trace}" in out.replace("\n", "")


def test_probe_shows_what_the_server_said_as_text() -> None:
    from rich.console import Console

    from agentload.endpoint.probe import ProbeResult
    from agentload.report.probeview import render_probe

    odd = "b1-[/x]-[bold]"  # a llama-server build_info, a model id, a note: the server's text
    result = ProbeResult(url="http://127.0.0.1:1/v1", engine="llamacpp", version=odd, model=f"m{odd}",
                         models=[f"m{odd}", "other"], notes=[f"note {odd}"])  # fmt: skip
    console = Console(record=True, width=200)
    console.print(render_probe(result))  # raised MarkupError before
    shown = console.export_text()
    assert "b1-[/x]-[bold]" in shown
    assert f"note {odd}" in shown
