#!/bin/bash
# CPU quickstart in fully-async mode: the same GRPO task as run-tiny-cpu.sh, with Rollout,
# Actor, ActorFwd, Reference and Advantages running concurrently (docs/fully-async.md).
#
#   bash scripts/training/text/run-tiny-cpu-async.sh
#
# Same environment overrides as run-tiny-cpu.sh, plus MAX_STALENESS (default 2): how many
# weight versions a trained sample may lag behind the actor. Outputs go to outputs/tiny-cpu-async.
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
export MODE=async
export EXP_DIR="${EXP_DIR:-${RELAX_ROOT:-$(pwd)}/outputs/tiny-cpu-async}"
exec bash "${SCRIPT_DIR}/run-tiny-cpu.sh" "$@"
