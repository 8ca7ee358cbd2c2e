#!/bin/bash
# SPMD multi-node launch: run the same command on every node.
#   bash scripts/entrypoint/spmd-multinode.sh scripts/training/text/run-qwen3-4B-8xgpu.sh [args...]
#
#   MASTER_ADDR  hostname (or address) of the head node      POD_NAME  this node's hostname
#   HOST_IP      this node's address on the cluster network  WORLD_SIZE number of nodes (default 2)
#   NUM_GPUS     GPUs per node (default 8)                   NUM_CPUS  Ray CPUs per node (default: all)
#   RAY_PORT     the head's Ray (GCS) port (default 6379)    NODE_WAIT_TIMEOUT seconds the head waits
#                                                            for the nodes (default 600)
#   RAY_DASHBOARD_PORT   the head's dashboard / Jobs API port (default 8265; ray-job.sh can submit there)
#   RAY_AUTH_TOKEN_PATH  Ray's token file, on a filesystem every node mounts (default ~/.ray/auth_token)
#   RAY_START_ARGS       more `ray start` flags for this node, e.g. "--dashboard-agent-listen-port 52366"
#                        where two nodes share a host
#
# The head (MASTER_ADDR == POD_NAME) starts Ray, waits for WORLD_SIZE nodes (on timeout it exits
# 1 naming the nodes that joined and those missing), runs the training script, then stops the Ray
# node it started; its exit status is the script's. A worker joins the head's Ray and blocks until
# the head's Ray goes away (the job ended), then stops its node and exits 0; it exits 1 if its own
# node dies while the head still runs. Every Ray server listens on HOST_IP (the cluster's private
# network), not on every interface. Nothing here kills a process it did not start.
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
TRAIN_SCRIPT="${1:?usage: spmd-multinode.sh <training script> [args...]}"; shift
: "${MASTER_ADDR:?set MASTER_ADDR (the head node)}" "${POD_NAME:?set POD_NAME (this node)}"
: "${HOST_IP:?set HOST_IP (the address of this node)}"
WORLD_SIZE="${WORLD_SIZE:-2}"; NUM_GPUS="${NUM_GPUS:-8}"; RAY_PORT="${RAY_PORT:-6379}"
NODE_WAIT_TIMEOUT="${NODE_WAIT_TIMEOUT:-600}"
source "${SCRIPT_DIR}/local.sh"
source "${SCRIPT_DIR}/ray_node.sh"
RAY_TMPDIR="${RAY_TMPDIR:-/tmp/relax-spmd-${POD_NAME}}"
NODE_FLAGS=(--node-ip-address "${HOST_IP}" --num-gpus "${NUM_GPUS}" --temp-dir "${RAY_TMPDIR}"
            --labels "{\"relax.pod\": \"${POD_NAME}\"}")
[ -z "${NUM_CPUS:-}" ] || NODE_FLAGS+=(--num-cpus "${NUM_CPUS}")
# shellcheck disable=SC2206  # RAY_START_ARGS is a list of flags
[ -z "${RAY_START_ARGS:-}" ] || NODE_FLAGS+=(${RAY_START_ARGS})
trap 'relax_stop_node' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

head_reachable() {  # the head's GCS port answers
  python3 -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()' \
    "${MASTER_ADDR}" "${RAY_PORT}" 2>/dev/null
}

if [ "${MASTER_ADDR}" = "${POD_NAME}" ]; then
  if [ -n "${RAY_AUTH_TOKEN_PATH:-}" ] && [ ! -s "${RAY_AUTH_TOKEN_PATH}" ]; then
    (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' >"${RAY_AUTH_TOKEN_PATH}")
  fi
  relax_start_node "${RAY_TMPDIR}/node.log" --head --port "${RAY_PORT}" --dashboard-host "${HOST_IP}" \
    --dashboard-port "${RAY_DASHBOARD_PORT:-8265}" "${NODE_FLAGS[@]}"
  relax_wait_started "${RAY_TMPDIR}/node.log" 180
  python3 "${SCRIPT_DIR}/ray_nodes.py" wait "${HOST_IP}:${RAY_PORT}" "${WORLD_SIZE}" "${NODE_WAIT_TIMEOUT}" \
    "${POD_NAME}"
  export RAY_ADDRESS="${HOST_IP}:${RAY_PORT}" RELAX_ENTRYPOINT_MODE=spmd
  status=0
  bash "${TRAIN_SCRIPT}" "$@" || status=$?
  exit "${status}"
fi

# A worker: wait for the head's Ray (and the token file), join, block while the head runs.
deadline=$((SECONDS + NODE_WAIT_TIMEOUT))
until head_reachable && { [ -z "${RAY_AUTH_TOKEN_PATH:-}" ] || [ -s "${RAY_AUTH_TOKEN_PATH}" ]; }; do
  if [ "${SECONDS}" -ge "${deadline}" ]; then
    echo "spmd-multinode.sh: the head ${MASTER_ADDR}:${RAY_PORT} did not answer within ${NODE_WAIT_TIMEOUT}s" >&2
    exit 1
  fi
  sleep 2
done
relax_start_node "${RAY_TMPDIR}/node.log" --address "${MASTER_ADDR}:${RAY_PORT}" "${NODE_FLAGS[@]}"
relax_wait_started "${RAY_TMPDIR}/node.log" 180
echo "spmd-multinode.sh: ${POD_NAME} (${HOST_IP}) joined ${MASTER_ADDR}:${RAY_PORT}; waiting for the job to end"
while kill -0 "${RELAX_NODE_PID}" 2>/dev/null && head_reachable; do
  sleep 5
done
if head_reachable; then
  echo "spmd-multinode.sh: this node's Ray stopped while the head still runs; its log: ${RAY_TMPDIR}/node.log" >&2
  exit 1
fi
echo "spmd-multinode.sh: the head's Ray is gone (the job ended); stopping this node"
exit 0
