"""agentload: how many AI agents can this LLM deployment really carry — measured, explained and planned."""

__version__ = "0.1.0"
