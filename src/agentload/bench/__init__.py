"""Sweeps, knee search, context × agents grid, soak; analysis of records into level summaries; result models."""
