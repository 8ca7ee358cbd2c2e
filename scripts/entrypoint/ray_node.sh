#!/bin/bash
# Helpers the entrypoints source: start one Ray node of their own and stop exactly that node.
#
# `ray stop` stops every Ray process of the machine (another user's cluster, another run), so an
# entrypoint never calls it. It starts its node with `ray start --block` in a session of its own
# (setsid): the node's processes (GCS, raylet, workers, agents) are that session's process group,
# and relax_stop_node signals that group only.
#
# Ray's token authentication: a head node turns it on by default and a node or client that joins
# must present the same token; RAY_AUTH_MODE=token makes them read it from RAY_AUTH_TOKEN_PATH
# (default ~/.ray/auth_token). Across machines that file must be the same on every node: a path
# on a filesystem every node mounts, mode 0600 (spmd-multinode.sh writes it on the head if missing).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
RELAX_NODE_PID=""
RELAX_NODE_ARGS=()

relax_free_port() {  # a free TCP port on address $1
  python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$1"
}

relax_start_node() {  # relax_start_node LOG [ray start flags...]: the node in its own session, in the background
  local log="$1"; shift
  RELAX_NODE_ARGS=("$@")
  mkdir -p "$(dirname -- "${log}")"
  setsid ray start --block --disable-usage-stats "$@" >"${log}" 2>&1 &
  RELAX_NODE_PID=$!
}

# Ray gives a starting node's raylet a fixed 30 s to register with the GCS, and the raylet registers
# only once its Python agents have started: on a loaded machine `ray start` can miss that and exit
# with "timed out during startup". relax_wait_started then stops what it left and starts it again,
# up to RELAX_NODE_START_ATTEMPTS times in all.
RELAX_NODE_START_ATTEMPTS="${RELAX_NODE_START_ATTEMPTS:-3}"

relax_wait_started() {  # relax_wait_started LOG SECONDS: until the node says it runs (or fails)
  local log="$1" deadline=$((SECONDS + $2)) attempt=1
  until grep -q "Ray runtime started" "${log}" 2>/dev/null; do
    if ! kill -0 "${RELAX_NODE_PID}" 2>/dev/null && [ "${attempt}" -lt "${RELAX_NODE_START_ATTEMPTS}" ] \
        && grep -q "timed out during startup" "${log}" 2>/dev/null; then
      echo "ray start: the node did not register in time (attempt ${attempt}); starting it again" >&2
      relax_stop_node
      cp -- "${log}" "${log}.attempt${attempt}"
      attempt=$((attempt + 1))
      relax_start_node "${log}" "${RELAX_NODE_ARGS[@]}"
      continue
    fi
    if ! kill -0 "${RELAX_NODE_PID}" 2>/dev/null || [ "${SECONDS}" -ge "${deadline}" ]; then
      echo "ray start did not come up within $2 s; its output (${log}):" >&2
      tail -n 30 "${log}" >&2
      return 1
    fi
    sleep 1
  done
}

relax_stop_node() {  # stop the node this shell started (its process group), SIGKILL after 10 s
  [ -n "${RELAX_NODE_PID}" ] || return 0
  kill -TERM -- "-${RELAX_NODE_PID}" 2>/dev/null || return 0
  for _ in $(seq 20); do
    kill -0 -- "-${RELAX_NODE_PID}" 2>/dev/null || { RELAX_NODE_PID=""; return 0; }
    sleep 0.5
  done
  kill -KILL -- "-${RELAX_NODE_PID}" 2>/dev/null || true
  RELAX_NODE_PID=""
}
