"""Reports of saved runs: a self-contained offline HTML file with plotly plots, and rich console tables.

Reports render from run directories (``store``), never from live state, and compute no statistics of their own:
the numbers are the bench's.
"""

from agentload.report.console import history_table, levels_table, print_result, result_panel
from agentload.report.html import ReportStats, load_runs, render_report, write_report

__all__ = [
    "ReportStats",
    "history_table",
    "levels_table",
    "load_runs",
    "print_result",
    "render_report",
    "result_panel",
    "write_report",
]
