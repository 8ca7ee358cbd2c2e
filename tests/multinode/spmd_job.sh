#!/bin/bash
# The script the SPMD head runs in tests/multinode/test_two_nodes.py: Ray Job mode on the cluster
# spmd-multinode.sh just started, through ray-job.sh as a user on the head would run it. First a job
# that only waits is stopped with Ctrl-C (SIGINT to ray-job.sh's process group, as a terminal sends
# it); then the training script is submitted with this script's arguments and its status passed on.
set -uo pipefail
unset RELAX_ENTRYPOINT_MODE  # a user's own shell on the head, not the SPMD launcher's
export RAY_ADDRESS="http://${HOST_IP}:${RAY_DASHBOARD_PORT}"
# The waiting job's ray-job.sh in a process group of its own (setsid: a background child is no group
# leader) and with SIGINT as a terminal's foreground job has it (bash starts background commands
# with SIGINT ignored, and an ignored signal cannot be trapped).
setsid python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp("bash", sys.argv[1:])' \
  bash scripts/entrypoint/ray-job.sh tests/multinode/wait_job.sh > "${CTRL_C_LOG}" 2>&1 &
waiter=$!
for _ in $(seq 300); do
  grep -q "wait_job: started" "${CTRL_C_LOG}" && break
  kill -0 "${waiter}" 2>/dev/null || break  # (it failed: the test reads its log)
  sleep 1
done
kill -INT -- "-${waiter}"
wait "${waiter}"
echo "spmd_job: the waiting job's ray-job.sh exited $? after Ctrl-C"
exec bash scripts/entrypoint/ray-job.sh scripts/training/text/run-tiny-cpu.sh "$@"
