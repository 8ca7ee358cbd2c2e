"""What the launch scripts ask a running Ray cluster (scripts/entrypoint/*.sh).

    python3 scripts/entrypoint/ray_nodes.py wait ADDRESS WORLD_SIZE TIMEOUT_S [HEAD_POD]
        until WORLD_SIZE nodes are alive; on timeout exit 1 naming the nodes that joined (pod
        name and address) and the ones missing (pod names follow HEAD_POD's "<prefix>-0"
        convention, as StatefulSets, PyTorchJobs and the seeds' node-0 / node-1 name them).
    python3 scripts/entrypoint/ray_nodes.py dashboard [ADDRESS]
        the Jobs API address (http://host:port) of the cluster at ADDRESS (default: the one
        `ray status` finds), for `ray job submit`.
    python3 scripts/entrypoint/ray_nodes.py job-exit URL SUBMISSION_ID
        once the job has ended: print how, and exit with its status (0 succeeded, the driver's
        exit code when it failed, 130 when it was stopped).

Each node says its pod name through the Ray node label `relax.pod` (spmd-multinode.sh sets it).
"""

from __future__ import annotations

import re
import sys
import time

POD_LABEL = "relax.pod"


def _connect(address: str | None) -> None:
    import ray

    ray.init(address=address or "auto", logging_level="ERROR", log_to_driver=False)


def _alive() -> list[tuple[str, str]]:
    """(pod name or "?", address) of every live node."""
    import ray

    return sorted((n.get("Labels", {}).get(POD_LABEL, "?"), n["NodeManagerAddress"]) for n in ray.nodes()
                  if n.get("Alive"))


def expected_pods(head_pod: str, world_size: int) -> list[str] | None:
    """The pod names of a WORLD_SIZE job whose head is "<prefix>-0" (None: another naming)."""
    match = re.fullmatch(r"(.*?)(\d+)", head_pod or "")
    if not match or int(match.group(2)) != 0:
        return None
    return [f"{match.group(1)}{i}" for i in range(world_size)]


def missing_message(joined: list[tuple[str, str]], world_size: int, timeout_s: float, head_pod: str) -> str:
    names = ", ".join(f"{pod} ({ip})" for pod, ip in joined)
    expected = expected_pods(head_pod, world_size)
    missing = [p for p in expected if p not in {pod for pod, _ in joined}] if expected else []
    which = ", ".join(missing) if missing else f"{world_size - len(joined)} more node(s)"
    return (f"spmd-multinode.sh: only {len(joined)} of WORLD_SIZE={world_size} nodes joined within {timeout_s:.0f}s "
            f"(joined: {names}); missing: {which}. Check that every node runs the same command with "
            "MASTER_ADDR pointing at the head and can reach its Ray port, or lower WORLD_SIZE "
            "(NODE_WAIT_TIMEOUT raises the wait)")


def wait(address: str, world_size: int, timeout_s: float, head_pod: str = "") -> int:
    _connect(address)
    deadline, shown = time.monotonic() + timeout_s, -1
    while True:
        joined = _alive()
        if len(joined) >= world_size:
            print(f"spmd-multinode.sh: {len(joined)} nodes: " + ", ".join(f"{p} ({ip})" for p, ip in joined))
            return 0
        if time.monotonic() > deadline:
            print(missing_message(joined, world_size, timeout_s, head_pod), file=sys.stderr)
            return 1
        if len(joined) != shown:
            print(f"spmd-multinode.sh: {len(joined)}/{world_size} nodes joined, waiting...", flush=True)
            shown = len(joined)
        time.sleep(2)


def reachable(address: str | None, timeout_s: float = 5.0) -> bool:
    """A "host:port" address answers (ray.init would retry an unreachable one for minutes)."""
    import socket

    if not address or address == "auto" or ":" not in address:
        return True
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def dashboard(address: str | None) -> int:
    import ray

    if not reachable(address):
        print(f"ray-job.sh: nothing answers at {address}", file=sys.stderr)
        return 1
    context = ray.init(address=address or "auto", logging_level="ERROR", log_to_driver=False)
    url = context.dashboard_url
    if not url:
        print("ray-job.sh: the cluster runs no dashboard, which serves the Jobs API `ray job submit` talks to; "
              "start the head with its dashboard (`ray start --head --dashboard-host 127.0.0.1`) or set "
              "RAY_ADDRESS=http://<head>:8265", file=sys.stderr)
        return 1
    print(url if url.startswith("http") else f"http://{url}")
    return 0


def job_exit(url: str, job_id: str, timeout_s: float = 60.0) -> int:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(url)
    deadline = time.monotonic() + timeout_s  # the logs ended: the job ends within moments
    while not client.get_job_status(job_id).is_terminal() and time.monotonic() < deadline:
        time.sleep(1)
    info = client.get_job_info(job_id)
    print(f"ray-job.sh: job {job_id} {info.status}" + (f": {info.message}" if info.message else ""), file=sys.stderr)
    if info.status == JobStatus.SUCCEEDED:
        return 0
    if info.status == JobStatus.STOPPED:
        return 130
    return getattr(info, "driver_exit_code", None) or 1


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "wait":
        return wait(argv[1], int(argv[2]), float(argv[3]), argv[4] if len(argv) > 4 else "")
    if len(argv) == 3 and argv[0] == "job-exit":
        return job_exit(argv[1], argv[2])
    if argv and argv[0] == "dashboard":
        return dashboard(argv[1] if len(argv) > 1 else None)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
