"""The simulated vLLM-style server: engine (scheduler, paged KV, prefix cache, preemption, offload), HTTP front."""
