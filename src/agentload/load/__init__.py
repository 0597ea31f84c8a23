"""The one runner: every command that puts agents on a server runs them here.

``runner.run_load`` executes agent drivers with one lifecycle — start, stop signal, grace, cancel, a lost server,
a driver bug surfaced after cleanup. ``strategy`` decides how many run at once: ``AllAtOnce`` (a level's fixed
count, optionally staggered) or ``Gated`` (a gate whose width a limiter moves, with dependencies and priorities).
bench, suite and fleet are profiles over it; this package imports none of them.
"""
