"""Capacity arithmetic shared by the planner and the simulator: model and GPU catalogues, KV layout, step time."""
