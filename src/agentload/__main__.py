"""``python -m agentload`` runs the CLI."""

from agentload.cli.main import main

main()
