#!/bin/bash
# Submit a training script to a Ray cluster that already runs (KubeRay, `ray start --head`,
# spmd-multinode.sh's head) with `ray job submit`, follow its logs, exit with its status.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 bash scripts/entrypoint/ray-job.sh scripts/training/text/run-tiny-cpu.sh [args...]
#
# RAY_ADDRESS: the cluster's Jobs API (http://<head>:8265), or its GCS address (<head>:6379), or
# unset: the cluster `ray status` finds from this machine. The repository is the job's working
# directory (uploaded; outputs/ and .git left out), so plugins given as dotted paths import there.
# The environment knobs the training script reads (EXP_DIR, MODEL_DIR, DATA_DIR, NUM_ROLLOUT, ...:
# every ${NAME...} in it) that are set here go to the job; names that look like secrets (*KEY*,
# *TOKEN*, *SECRET*, *PASSWORD*) never do (Ray keeps a job's environment in its metadata, which anyone
# who can reach the cluster reads): give those to the cluster's nodes instead. EXP_DIR is made
# absolute (default: outputs/<script name without run-> in this checkout), because the job runs in
# Ray's copy of the repository, which is deleted with the job; on a cluster of several machines it
# must be on a filesystem every node mounts. Ctrl-C (or SIGTERM) stops the job. The job joins the
# cluster (RAY_ADDRESS inside a job); it never starts a Ray of its own.
set -euo pipefail
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
TRAIN_SCRIPT="${1:?usage: ray-job.sh <training script> [args...]}"; shift
TRAIN_PATH="$(realpath -- "${TRAIN_SCRIPT}")"
source "${SCRIPT_DIR}/local.sh"  # RELAX_ROOT (the working directory), and cd there
source "${SCRIPT_DIR}/ray_node.sh"  # RAY_AUTH_MODE for a cluster with token authentication
case "${TRAIN_PATH}" in
  "${RELAX_ROOT}"/*) TRAIN_REL="${TRAIN_PATH#"${RELAX_ROOT}"/}" ;;
  *) echo "ray-job.sh: ${TRAIN_SCRIPT} is outside ${RELAX_ROOT}, the job's working directory; put it there" >&2
     exit 2 ;;
esac

case "${RAY_ADDRESS:-}" in
  http://*|https://*) JOBS_API="${RAY_ADDRESS}" ;;
  *) if ! JOBS_API="$(python3 "${SCRIPT_DIR}/ray_nodes.py" dashboard "${RAY_ADDRESS:-}" 2>/tmp/relax-ray-job-$$.err)"; then
       echo "ray-job.sh: no running Ray cluster reachable at ${RAY_ADDRESS:-the address \`ray status\` finds}:" >&2
       tail -n 3 "/tmp/relax-ray-job-$$.err" >&2; rm -f "/tmp/relax-ray-job-$$.err"
       echo "start one (ray start --head --num-cpus 8 --dashboard-host 127.0.0.1) or set RAY_ADDRESS=http://<head>:8265" >&2
       exit 1
     fi
     rm -f "/tmp/relax-ray-job-$$.err" ;;
esac

name="$(basename -- "${TRAIN_PATH}" .sh)"
export EXP_DIR="$(realpath -m -- "${EXP_DIR:-${RELAX_ROOT}/outputs/${name#run-}}")"
RUNTIME_ENV="$(python3 - "${TRAIN_PATH}" <<'PY'
import json, os, re, sys
knobs = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", open(sys.argv[1]).read())) | {"EXP_DIR", "MODEL_DIR", "DATA_DIR"}
local = {"RELAX_ROOT", "MODEL_CONFIG_DIR", "PYTHONPATH", "RAY_ADDRESS", "RELAX_ENTRYPOINT_MODE", "SCRIPT_DIR"}
secret = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL")
env, held = {"RELAX_ENTRYPOINT_MODE": "ray-job"}, []
for name in sorted(knobs - local):
    if name in os.environ:
        (held.append(name) if secret.search(name) else env.__setitem__(name, os.environ[name]))
if held:
    print(f"ray-job.sh: not passed to the job (secrets stay out of its metadata): {', '.join(held)}", file=sys.stderr)
print(json.dumps({"env_vars": env, "excludes": ["/outputs", "/.git", "__pycache__", "*.egg-info"]}))
PY
)"
JOB_ID="relax-${name}-$(date +%Y%m%d-%H%M%S)-$$"
echo "ray-job.sh: submitting ${TRAIN_REL} to ${JOBS_API} as ${JOB_ID}; outputs in ${EXP_DIR}" >&2
submit() {
  # shellcheck disable=SC2016  # $0 and $@ belong to the job's shell
  ray job submit --address "${JOBS_API}" --submission-id "${JOB_ID}" --no-wait --working-dir "${RELAX_ROOT}" \
    --runtime-env-json "${RUNTIME_ENV}" --log-style record -- \
    bash -c 'source scripts/entrypoint/local.sh && exec bash "$0" "$@"' "${TRAIN_REL}" "$@"
}
for attempt in $(seq 12); do  # a head that just started has no job agent for a few seconds
  if out="$(submit "$@" 2>&1)"; then break; fi
  if [ "${attempt}" = 12 ] || ! grep -q "No available agent\|Failed to connect to Ray" <<<"${out}"; then
    echo "${out}" | grep -v "^ \|Traceback\|^$" | tail -n 5 >&2
    echo "ray-job.sh: ray job submit to ${JOBS_API} failed" >&2
    exit 1
  fi
  sleep 5
done

stop_job() {
  trap - INT TERM
  echo "ray-job.sh: stopping job ${JOB_ID}" >&2
  ray job stop --address "${JOBS_API}" "${JOB_ID}" >&2 || true
  python3 "${SCRIPT_DIR}/ray_nodes.py" job-exit "${JOBS_API}" "${JOB_ID}" || true  # says how it ended
  exit "$1"
}
trap 'stop_job 130' INT
trap 'stop_job 143' TERM
ray job logs --address "${JOBS_API}" --follow "${JOB_ID}" &
wait $! || true  # (a signal interrupts `wait`, and the trap stops the job)
python3 "${SCRIPT_DIR}/ray_nodes.py" job-exit "${JOBS_API}" "${JOB_ID}"
