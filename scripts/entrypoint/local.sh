#!/bin/bash
# Local single-node environment for the launch scripts (sourced, not executed).
# Sets MODEL_CONFIG_DIR and PYTHONPATH. It does not start Ray: `relax/entrypoints/train.py`
# starts a private Ray instance for the run and stops it at exit (set RAY_ADDRESS to join an
# existing cluster instead). Nothing here kills processes.
_RELAX_LOCAL_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
export RELAX_ROOT="$(cd -- "${_RELAX_LOCAL_DIR}/../.." &>/dev/null && pwd)"
export MODEL_CONFIG_DIR="${MODEL_CONFIG_DIR:-${RELAX_ROOT}/scripts/models}"
export PYTHONPATH="${RELAX_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
export RELAX_ENTRYPOINT_MODE="${RELAX_ENTRYPOINT_MODE:-local}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
export TOKENIZERS_PARALLELISM="${TOKENIZERS_PARALLELISM:-false}"
cd "${RELAX_ROOT}"
