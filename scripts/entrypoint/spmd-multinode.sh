#!/bin/bash
# SPMD multi-node launch: run the same command on every node.
#   MASTER_ADDR  hostname of the head node      POD_NAME  this node's hostname
#   HOST_IP      this node's IP                 WORLD_SIZE number of nodes (default 2)
#   NUM_GPUS     GPUs per node (default 8)
# The head starts Ray, waits for WORLD_SIZE nodes, runs the training script, then stops the
# Ray node it started. Workers join and block until the head's Ray goes away.
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
TRAIN_SCRIPT="${1:?usage: spmd-multinode.sh <training script> [args...]}"; shift
: "${MASTER_ADDR:?set MASTER_ADDR}" "${POD_NAME:?set POD_NAME}" "${HOST_IP:?set HOST_IP}"
WORLD_SIZE="${WORLD_SIZE:-2}"; NUM_GPUS="${NUM_GPUS:-8}"; RAY_PORT="${RAY_PORT:-6379}"
source "${SCRIPT_DIR}/local.sh"
if [ "${MASTER_ADDR}" = "${POD_NAME}" ]; then
  ray start --head --node-ip-address "${HOST_IP}" --port "${RAY_PORT}" --num-gpus "${NUM_GPUS}" --disable-usage-stats
  trap 'ray stop' EXIT  # this node's Ray processes, which this script started
  until [ "$(python3 -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(len([n for n in ray.nodes() if n["Alive"]]))')" -ge "${WORLD_SIZE}" ]; do
    echo "waiting for ${WORLD_SIZE} nodes..."; sleep 5
  done
  export RAY_ADDRESS="${HOST_IP}:${RAY_PORT}" RELAX_ENTRYPOINT_MODE=spmd
  bash "${TRAIN_SCRIPT}" "$@"
else
  ray start --address "${MASTER_ADDR}:${RAY_PORT}" --node-ip-address "${HOST_IP}" --num-gpus "${NUM_GPUS}" --block
fi
