"""Two Ray nodes on this machine, run the way users run them (bash, the entrypoint scripts).

Each node is a real raylet with its own address on the loopback range (127.0.0.2 the head,
127.0.0.3 the worker: Linux routes all of 127/8 to lo, and Ray keeps such an address where it
would swap 127.0.0.1 for the network one) and its own CPUs, started by
scripts/entrypoint/spmd-multinode.sh. Ports and temp dirs are this test's
own; every process is stopped through its own process group, never `ray stop`.

One cluster and one run cover the issue's (a)-(d): (a) the same command on both "machines"
(spmd-multinode.sh, WORLD_SIZE=2) starts the cluster; the head's script (tests/multinode/spmd_job.sh)
is what a user on the head runs in Ray Job mode: (b) `RAY_ADDRESS=http://<head>:<dashboard> bash
scripts/entrypoint/ray-job.sh scripts/training/text/run-tiny-cpu.sh`, which runs the quickstart as a
Ray job and passes its status through (after a waiting job is stopped with Ctrl-C); the job's
environment in Ray's metadata holds the script's knobs and no secret; (c) once a step is done, every
role's Serve replica and training ranks run on the node the plan put them on (<exp-dir>/placement.json,
against the process tree: a process's node is the raylet it descends from), over both nodes; (d) then
the worker node is killed, with the driver held between two steps (SIGSTOP, so the run is mid-way
however fast its steps go): the run names the node it lost and, with --use-health-check, restarts
from its last checkpoint on the head alone and finishes.

They run on their own pytest-xdist worker (group `multinode`, tests/conftest.py), beside the
integration group.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from relax.utils.net import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
STEPS = 3  # one before the worker node dies, the others after the restart on the head
TINY = "--sft-steps 1 --n-train 64 --n-eval 8 --hidden-size 32 --num-layers 1 --vocab-size 300"
pytestmark = pytest.mark.integration
JOB_ENV = ("import json, sys; from ray.job_submission import JobSubmissionClient; "
           "info = JobSubmissionClient(sys.argv[1]).get_job_info(sys.argv[2]); "
           "print(json.dumps((info.runtime_env or {}).get('env_vars', {})))")


@pytest.fixture()
def ray_dir():
    """A short temp dir for the nodes' sessions (Ray's socket paths must stay under 108 bytes)."""
    path = tempfile.mkdtemp(prefix="relax-mn-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def free_port(host: str) -> int:
    """A port below the OS's ephemeral range (relax.utils.net.free_ports): `ray start` binds these
    seconds later, and a port the OS picked could meanwhile go to another process's connection (GCS
    "Address already in use" failed a suite run)."""
    return free_ports(1, host)[0]


def env_for(tmp, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RELAX_"))}
    return env | {"RAY_USAGE_STATS_ENABLED": "0", "MODEL_DIR": str(tmp / "model"), "DATA_DIR": str(tmp / "model"),
                  "PREPARE_ARGS": TINY, "EVAL_INTERVAL": "0"} | extra


def start(cmd: list[str], env: dict[str, str], log) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """The process's group (its session: start_new_session), SIGTERM then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_marked(marker: str) -> None:
    """Every process group whose processes name `marker` (this test's Ray temp dir) in their command line."""
    groups = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                groups.add(os.getpgid(int(pid)))
        except OSError:
            continue
    for group in groups - {os.getpgid(0)}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(path, text: str, timeout_s: float, proc: subprocess.Popen | None = None, poll_s: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(poll_s)
    return False


def driver_of(run_dir) -> int:
    """The pid of the run's driver: the job's `relax/entrypoints/train.py` process for `run_dir`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("relax/entrypoints/train.py") for a in args) and str(run_dir) in args:
            return int(pid)
    raise AssertionError(f"no driver process of the run in {run_dir}")


@contextlib.contextmanager
def held(pid: int):
    """`pid` stopped (SIGSTOP) inside the block and continued after it: a driver held between two
    steps cannot start the next, so what the block does happens mid-run however fast the steps go."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# ---- where each role's processes run ------------------------------------------------------------

def _proc(pid: int) -> tuple[int, str, dict[str, str]]:
    """(parent pid, command line, environment) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
               .split("\0") if "=" in kv)
    return ppid, cmd, env


def node_of(pid: int) -> str | None:
    """The address of the raylet `pid` descends from."""
    while pid > 1:
        ppid, cmd, _ = _proc(pid)
        if "/raylet " in cmd or cmd.startswith("raylet"):
            return next((a.split("=", 1)[1] for a in cmd.split() if a.startswith("--node_ip_address=")), None)
        pid = ppid
    return None


def role_nodes(run_id: str) -> dict[str, set[str]]:
    """Role -> the nodes its replica and training ranks run on, from the process tree."""
    found: dict[str, set[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            _, cmd, env = _proc(int(pid))
            if env.get("RELAX_RUN_ID") != run_id:
                continue
            role = env.get("RELAX_WORKER_GROUP")
            if role is None and cmd.startswith("ray::ServeReplica:"):
                role = cmd.split()[0].rsplit(":", 1)[1].split(".")[0]  # (busy: ...:rollout.<method>())
            if role:
                found.setdefault(role, set()).add(node_of(int(pid)))
        except (OSError, ValueError, IndexError):
            continue
    return found


# ---- the tests ----------------------------------------------------------------------------------

def test_spmd_cluster_runs_the_quickstart_as_a_ray_job_across_two_nodes(tmp_path, ray_dir):
    """One cluster, one run, for (a)-(d): the SPMD launcher on both "machines", its head running
    tests/multinode/spmd_job.sh, which submits the quickstart through ray-job.sh (after stopping a
    waiting job with Ctrl-C); the job's placement, metadata, node loss and exit status."""
    (port, dash), marker = free_ports(2, HEAD_IP), ray_dir
    exp = tmp_path / "exp"
    common = {"MASTER_ADDR": HEAD_IP, "WORLD_SIZE": "2", "NUM_GPUS": "0", "RAY_PORT": str(port),
              "RAY_DASHBOARD_PORT": str(dash), "NODE_WAIT_TIMEOUT": "180", "EXP_DIR": str(exp),
              "NUM_ROLLOUT": str(STEPS), "SAVE_INTERVAL": "1", "CTRL_C_LOG": str(tmp_path / "ctrl_c.log"),
              "WANDB_API_KEY": "not-for-the-job"}
    script = ["bash", "scripts/entrypoint/spmd-multinode.sh", "tests/multinode/spmd_job.sh",
              "--use-health-check", "--max-global-restart", "1", "--rollout-health-check-interval", "2",
              "--progress-bar", "false"]
    agents = {ip: f"--dashboard-agent-listen-port {free_port(ip)}" for ip in (HEAD_IP, WORKER_IP)}  # one host
    worker = start(script, env_for(tmp_path, **common, POD_NAME="node-1", HOST_IP=WORKER_IP, NUM_CPUS="4",
                                   RAY_TMPDIR=f"{marker}/w", RAY_START_ARGS=agents[WORKER_IP]), tmp_path / "worker.log")
    head = start(script, env_for(tmp_path, **common, POD_NAME=HEAD_IP, HOST_IP=HEAD_IP, NUM_CPUS="5",
                                 RAY_TMPDIR=f"{marker}/h", RAY_START_ARGS=agents[HEAD_IP]), tmp_path / "head.log")
    head_log = tmp_path / "head.log"
    try:
        # The driver writes each step's metrics row itself (a local file, unlike the job's streamed log):
        # held at once after the first, the run is mid-way (steps take ~0.6 s on an idle machine) while
        # its placement is read and the worker node dies.
        assert wait_for(exp / "run" / "metrics.jsonl", '"step"', 600, head, poll_s=0.05), \
            head_log.read_text()[-6000:]
        with held(driver_of(exp / "run")):
            run_id = next(p.name.split("-", 1)[1] for p in (exp / "run" / ".relax").glob("run_token-*"))
            check_placement(exp, run_id)
            kill_marked(f"{marker}/w")  # the worker node dies: its raylet and every process on it
            steps_before = len((exp / "run" / "metrics.jsonl").read_text().splitlines())
        assert steps_before < STEPS, "the run ended before the worker node was killed"
        out = head_log.read_text()
        assert "the waiting job's ray-job.sh exited 130 after Ctrl-C" in out, out[-6000:]  # Ctrl-C stops a job
        assert "STOPPED" in (tmp_path / "ctrl_c.log").read_text(), (tmp_path / "ctrl_c.log").read_text()[-3000:]
        check_job_metadata(out, dash, exp, env_for(tmp_path, RAY_AUTH_MODE="token"))
        assert head.wait(timeout=600) == 0, head_log.read_text()[-6000:]  # the job's status, passed through
        log = head_log.read_text()
        assert "SUCCEEDED" in log, log[-4000:]
        assert f"node {WORKER_IP}" in log and "left the Ray cluster during the run" in log, log[-6000:]
        events = [json.loads(line) for line in (exp / "run" / "health_events.jsonl").read_text().splitlines()]
        assert any(e.get("kind") == "global_restart" and WORKER_IP in e.get("message", "") for e in events), events
        steps = [json.loads(line)["step"] for line in (exp / "run" / "metrics.jsonl").read_text().splitlines()]
        assert sorted(set(steps)) == list(range(STEPS)), steps  # the steps before the loss, and the rest after it
        assert worker.wait(timeout=120) == 1  # its node died while the head still ran
    finally:
        stop(head)
        stop(worker)
        kill_marked(marker)


def check_job_metadata(out: str, dash: int, exp, env: dict[str, str]) -> None:
    """The job's environment in Ray's metadata holds the script's knobs and no secret."""
    job_id = re.search(r"as (relax-run-tiny-cpu-[\w-]+);", out).group(1)
    meta = subprocess.run(["python3", "-c", JOB_ENV, f"http://{HEAD_IP}:{dash}", job_id], capture_output=True,
                          text=True, timeout=120, env=env).stdout
    job_env = json.loads(meta.strip().splitlines()[-1])
    assert job_env["EXP_DIR"] == str(exp) and job_env["NUM_ROLLOUT"] == str(STEPS)
    assert "WANDB_API_KEY" not in job_env and not any("not-for-the-job" in v for v in job_env.values())


def check_placement(exp, run_id: str) -> None:
    """Every role's Serve replica and training ranks run on the node the plan put them on
    (<exp-dir>/placement.json, the absolute EXP_DIR, not Ray's copy of the repository), over both."""
    placement = json.loads((exp / "run" / "placement.json").read_text())
    seen, planned = role_nodes(run_id), placement["roles"]
    assert {n["ip"] for n in placement["nodes"]} == {HEAD_IP, WORKER_IP}
    assert set(planned.values()) == {HEAD_IP, WORKER_IP}, planned  # roles on both nodes
    for role in ("actor", "rollout", "reference", "dcs"):
        assert seen.get(role) == {planned[role]}, (role, seen, planned)
