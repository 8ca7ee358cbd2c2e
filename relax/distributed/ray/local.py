"""A private Ray instance on this machine whose every listener is on loopback.

Ray normally gives a node its network address, and its GCS, raylet, worker, dashboard-agent
and runtime-env-agent servers listen there or on every interface, even when `ray.init` is
given `_node_ip_address="127.0.0.1"` (Ray swaps a loopback address for the network one). With
cluster mode off (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, Ray's own switch for single-machine
platforms) the node address stays 127.0.0.1 and every Ray server binds loopback; the processes
Ray starts inherit the switch through the environment. TransferQueue and the run's own servers
follow Ray's node address (relax.distributed.store.bind_host), so a local run opens nothing to
the network. A run that joins a cluster (`--ray-address`) binds the cluster's node addresses
instead (docs/launch.md, "What listens where").

Also here: `keep_sigterm_handler` (`ray.init` without Ray's SIGTERM handler, which exits the
driver mid-run) and where a started Ray's processes can be found (`ray_temp_dir`, `session_dir`:
relax.core.reaper).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# A private Ray's GCS never comes back once gone (no GCS fault tolerance), so its processes need not
# wait Ray's default 60 s for it: after a SIGKILL of the driver, Ray's agents report the raylet's
# death to the dead GCS and would linger that long.
GCS_RECONNECT_ENV, GCS_RECONNECT_S = "RAY_gcs_rpc_server_reconnect_timeout_s", "5"
# Ray gives a starting node's raylet a fixed 30 s to register with the GCS (ray/_private/node.py, not
# configurable in 2.60), and the raylet registers only once its Python agents have started: on a
# loaded small machine that can take longer, and `ray.init` then fails with this message.
STARTUP_TIMEOUT_MESSAGE = "timed out during startup"
START_ATTEMPTS = 3
# Background loops of Ray and Serve, slowed on a private Ray where nobody reads what they produce
# more often (no dashboard, one replica per deployment, no autoscaling). Measured idle on the 2-core
# machine, Ray + Serve + TransferQueue up: 8.2 s of CPU a minute with Ray's defaults, 5.7 with these.
# Serve's controller reconciles every 0.1 s; its replicas and handles push request metrics (for
# autoscaling) every 0.1 s; the dashboard agent publishes node statistics every 5 s. A variable the
# environment already sets wins.
LOCAL_RAY_ENV = {
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000",
    "REPORTER_UPDATE_INTERVAL_MS": "30000",
}

logger = logging.getLogger(__name__)


def start_local_ray(num_cpus: int, **init_kwargs: Any) -> None:
    """`ray.init` a new single-machine instance bound to loopback (see the module doc).

    Without Ray's worker prestart: Ray starts one idle Python worker per CPU when the driver
    connects, for tasks, but a run's processes are actors and most carry their own environment
    (a role's replica, a training rank), which an idle worker of the job's environment cannot host:
    on a small machine those workers only took CPU from the roles starting beside them (measured:
    2 of 8 never used over the test session, ~10 s of CPU each). Workers start as actors need them.
    Ray's and Serve's background loops run slower (LOCAL_RAY_ENV).

    Every process Ray starts inherits this process's environment: variables all of them need are
    best set here before the call rather than passed as a job `runtime_env`, which makes Ray start
    each worker through a setup process (`setup_worker.py`, ~0.4 s of CPU a worker, measured).

    A node that misses Ray's registration deadline (STARTUP_TIMEOUT_MESSAGE) is stopped and started
    again, up to START_ATTEMPTS times; any other failure is raised as it is."""
    os.environ[LOCAL_ONLY_ENV] = "0"  # before Ray starts its processes: they read it at import
    os.environ.setdefault(GCS_RECONNECT_ENV, GCS_RECONNECT_S)
    for name, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(name, value)
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # this process may have imported Ray already
    system_config = {"prestart_worker_first_driver": False, **init_kwargs.pop("_system_config", {})}
    for attempt in range(1, START_ATTEMPTS + 1):
        before = _child_pids()
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     _system_config=system_config, **init_kwargs)
            return
        except Exception as e:  # Ray raises a bare Exception for it
            if STARTUP_TIMEOUT_MESSAGE not in str(e) or attempt == START_ATTEMPTS:
                raise
            logger.warning("Ray's node did not register in time (attempt %d of %d, a loaded machine); its "
                           "processes are stopped and it starts again", attempt, START_ATTEMPTS)
            _kill_children_since(before)


def _child_pids() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _kill_children_since(before: set[int]) -> None:
    """SIGKILL the processes a failed `ray.init` left (GCS, raylet, its agents, the reaper): every
    descendant of this process that was not there before it."""
    import psutil

    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=10)


@contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """`ray.init` inside the block leaves SIGTERM's handler as it is. Its own exits the driver at
    once (`sys.exit`), mid-run or mid-start, where the caller has its own way to stop
    (relax.core.service.SigtermStop)."""
    from ray._private import utils

    install = getattr(utils, "set_sigterm_handler", None)  # (Ray 2.60; a release without it installs none)
    if install is not None:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if install is not None:
            utils.set_sigterm_handler = install


def ray_temp_dir() -> str:
    """Where a Ray started by this process keeps its session directories (`/tmp/ray`, `$RAY_TMPDIR`);
    "" where this Ray release does not say (the reaper then learns the session once Ray is up)."""
    try:
        from ray._common.utils import get_default_ray_temp_dir
    except ImportError:
        return ""
    return get_default_ray_temp_dir()


def session_dir() -> str:
    """The session directory of the Ray this process started or joined; every process of that Ray
    writes its logs under it (relax.core.reaper finds them by it)."""
    import ray

    return ray._private.worker._global_node.get_session_dir_path()


def bind_serve_grpc() -> None:
    """Run first in every role's Serve replica (relax.core.service.replica_class).

    A Serve replica starts an inter-deployment gRPC server on every interface (`[::]:0`,
    hard-coded in Serve 2.60, no option), beside Ray's own servers that do follow the node
    address. This binds it to the run's bind address instead (loopback on one node, the node's
    cluster address across nodes); the socket test of tests/integration/test_security.py fails
    if a Serve release moves the call."""
    from ray.serve._private import replica

    from relax.distributed.store import bind_host

    original = replica.add_port_to_grpc_server
    if getattr(original, "_relax_bound", False):
        return
    host = bind_host()
    host = f"[{host}]" if ":" in host else host

    def add_port(server, address: str, *args, **kwargs):
        if address.startswith(("[::]:", "0.0.0.0:")):
            address = f"{host}:{address.rsplit(':', 1)[1]}"
        return original(server, address, *args, **kwargs)

    add_port._relax_bound = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port
