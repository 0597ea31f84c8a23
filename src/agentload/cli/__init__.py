"""The typer command line: one module per command; each parses, calls the library, prints."""
