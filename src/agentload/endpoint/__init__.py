"""Talking to an OpenAI-compatible server (vLLM, SGLang, llama.cpp, the simulator): what it says about itself
(``endpoint.scrape``: /metrics, its KV pool, its models) and timed streamed completions.
"""
