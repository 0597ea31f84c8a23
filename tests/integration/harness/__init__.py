"""What both real-engine tiers share: the server process, the tier summary, and the checks run against each engine.

``process`` starts a server on a free loopback port, waits for /health 200 and stops it by its PID (its own process
group); ``summary`` holds each tier's timings and figures for the end-of-run section; ``coldstart`` runs a fleet
against a server that is still starting; ``runs`` drives bench, probe, calibrate and the simulator as a user does.
The tiers (``tests/integration/vllm.py``, ``tests/integration/llamacpp.py``) say only what differs: how their
server is built and launched, and the figures their tests hold it to.
"""
