#!/bin/bash
# A job that only waits (tests/multinode/test_two_nodes.py stops it with Ctrl-C through ray-job.sh).
echo "wait_job: started"
sleep 600
