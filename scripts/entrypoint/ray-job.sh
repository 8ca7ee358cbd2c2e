#!/bin/bash
# Run a training script against a Ray cluster that already runs (KubeRay, `ray start --head`).
# Usage: bash scripts/entrypoint/ray-job.sh scripts/training/text/run-tiny-cpu.sh [args...]
# It neither starts nor stops Ray; the run joins the cluster through RAY_ADDRESS and removes
# only its own Serve apps and TransferQueue actors when it ends.
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
TRAIN_SCRIPT="${1:?usage: ray-job.sh <training script> [args...]}"; shift
if ! ray status >/dev/null 2>&1; then
  echo "ray-job.sh: no running Ray cluster reachable (ray status failed); start one or use local.sh" >&2
  exit 1
fi
export RAY_ADDRESS="${RAY_ADDRESS:-auto}"
export MASTER_ADDR="${MASTER_ADDR:-$(python3 -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(ray.util.get_node_ip_address())')}"
source "${SCRIPT_DIR}/local.sh"
export RELAX_ENTRYPOINT_MODE=ray-job
bash "${TRAIN_SCRIPT}" "$@"
