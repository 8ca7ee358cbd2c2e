#!/bin/bash
# One machine. Two uses:
#
#   bash scripts/entrypoint/local.sh scripts/training/text/run-tiny-cpu.sh [args...]
#       starts a Ray node of its own on loopback (127.0.0.1, cluster mode off: nothing listens on
#       the network; no dashboard), runs the training script against it (RAY_ADDRESS), and stops
#       that node when the script ends, whatever way it ends. Its exit status is the script's.
#   source scripts/entrypoint/local.sh
#       (what the training scripts do when no entrypoint ran them) only sets the environment:
#       MODEL_CONFIG_DIR, PYTHONPATH, RELAX_ROOT; the run then starts a private Ray of its own.
#
# Environment: RAY_NUM_CPUS (logical CPUs of the node, default max(8, cores)), RAY_TMPDIR (where
# its session lives, default /tmp/relax-local-<pid>). Nothing here kills a process it did not start.
_RELAX_LOCAL_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
export RELAX_ROOT="$(cd -- "${_RELAX_LOCAL_DIR}/../.." &>/dev/null && pwd)"
export MODEL_CONFIG_DIR="${MODEL_CONFIG_DIR:-${RELAX_ROOT}/scripts/models}"
case ":${PYTHONPATH:-}:" in *":${RELAX_ROOT}:"*) ;; *) export PYTHONPATH="${RELAX_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" ;; esac
export RELAX_ENTRYPOINT_MODE="${RELAX_ENTRYPOINT_MODE:-local}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
cd "${RELAX_ROOT}"
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  return 0  # sourced: the environment only
fi

set -euo pipefail
TRAIN_SCRIPT="${1:?usage: bash scripts/entrypoint/local.sh <training script> [args...]}"; shift
source "${_RELAX_LOCAL_DIR}/ray_node.sh"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0  # Ray's single-machine mode: every Ray server on 127.0.0.1
[ -n "${RAY_TMPDIR:-}" ] || { export RAY_TMPDIR="/tmp/relax-local-$$"; _RELAX_OWN_TMP=1; }
CPUS="${RAY_NUM_CPUS:-$(python3 -c 'import os; print(max(8, os.cpu_count() or 1))')}"
PORT="$(relax_free_port 127.0.0.1)"
relax_start_node "${RAY_TMPDIR}/node.log" --head --node-ip-address 127.0.0.1 --port "${PORT}" \
  --num-cpus "${CPUS}" --include-dashboard false --temp-dir "${RAY_TMPDIR}"
trap 'relax_stop_node; [ -z "${_RELAX_OWN_TMP:-}" ] || rm -rf "${RAY_TMPDIR}"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
relax_wait_started "${RAY_TMPDIR}/node.log" 120
export RAY_ADDRESS="127.0.0.1:${PORT}" RELAX_ENTRYPOINT_MODE=local-ray
echo "local.sh: Ray node on 127.0.0.1:${PORT} (${CPUS} CPUs); running ${TRAIN_SCRIPT}" >&2
status=0
bash "${TRAIN_SCRIPT}" "$@" || status=$?
exit "${status}"
