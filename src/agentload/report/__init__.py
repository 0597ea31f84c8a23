"""Reports of saved runs: a self-contained offline HTML file with plotly plots (``report.html``), and rich
console tables (``report.console``).

Reports render from run directories (``store``), never from live state, and compute no statistics of their own:
the numbers are the bench's. The package imports nothing itself, so ``agentload runs`` (console tables only)
does not pay for importing plotly.
"""
