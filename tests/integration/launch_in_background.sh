#!/bin/bash
# Starts a command the way a launcher's shell script does (a CI step, cron, a job script, `cmd &`
# in a script): in the background of this non-interactive shell, through
# scripts/entrypoint/local.sh as the training scripts do. Bash starts a background command of a
# non-interactive shell with SIGINT and SIGQUIT ignored, and the command inherits that.
#   bash tests/integration/launch_in_background.sh python3 relax/entrypoints/train.py FLAGS...
bash -c 'source scripts/entrypoint/local.sh && "$@"' training-script "$@" &
wait $!
