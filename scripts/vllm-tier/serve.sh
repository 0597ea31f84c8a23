#!/usr/bin/env bash
# Start, wait for and stop the tier's vLLM server on 127.0.0.1.
#
#   serve.sh start PORT BLOCKS LOG [extra vllm args...]   # prints the server's PID; returns at once
#   serve.sh wait PORT [TIMEOUT_S]                        # until /health answers 200 (default 300 s)
#   serve.sh stop PID                                     # SIGTERM its process group, SIGKILL after 20 s
#
# The server runs in its own session (setsid), so its PID is also its process group's id: stopping by that id
# also ends the engine-core process vLLM forks, and touches nothing else on the machine. `python -m
# vllm.entrypoints.openai.api_server` rather than the `vllm` console script, which fails for the CPU package.
# BLOCKS is --num-gpu-blocks-override: the KV pool in blocks (128 tokens each on the CPU backend).
# AGENTLOAD_VLLM_MODEL_DIR and AGENTLOAD_VLLM_SERVED_NAME pick the model (default $tier/model as agentload-tiny;
# the realistic one is $tier/model-realistic, served by the tests as agentload-realistic).
set -euo pipefail

tier="${AGENTLOAD_VLLM_TIER_DIR:-$HOME/.cache/agentload-vllm-tier}"
cmd="${1:?usage: serve.sh start|wait|stop ...}"
shift

case "$cmd" in
start)
    port="${1:?port}" blocks="${2:?blocks}" log="${3:?log file}"
    shift 3
    # Offline: the model is a local directory, and no usage reports leave the machine. The KV space setting is
    # only what vLLM sizes the pool from before the override replaces it; 1 GiB keeps the allocation small.
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
        setsid "$tier/venv/bin/python" -m vllm.entrypoints.openai.api_server \
        --host 127.0.0.1 --port "$port" \
        --model "${AGENTLOAD_VLLM_MODEL_DIR:-$tier/model}" \
        --served-model-name "${AGENTLOAD_VLLM_SERVED_NAME:-agentload-tiny}" \
        --max-model-len "${AGENTLOAD_VLLM_MAX_MODEL_LEN:-4096}" \
        --enable-prefix-caching --enable-prompt-tokens-details --enforce-eager \
        --num-gpu-blocks-override "$blocks" \
        "$@" >"$log" 2>&1 </dev/null &
    echo $!
    ;;
wait)
    port="${1:?port}" timeout="${2:-300}"
    deadline=$((SECONDS + timeout))
    until curl -fsS -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            echo "vLLM on port $port not healthy after $timeout s" >&2
            exit 1
        fi
        sleep 1
    done
    ;;
stop)
    pid="${1:?pid}"
    kill -TERM -- "-$pid" 2>/dev/null || exit 0
    for _ in $(seq 40); do
        kill -0 -- "-$pid" 2>/dev/null || exit 0
        sleep 0.5
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    ;;
*)
    echo "usage: serve.sh start|wait|stop ..." >&2
    exit 2
    ;;
esac
