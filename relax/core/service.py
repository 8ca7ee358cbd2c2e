"""The run's runtime (Ray, Serve, TransferQueue) and one Serve deployment per role.

`Runtime` joins an existing Ray cluster (`--ray-address`, `$RAY_ADDRESS`, i.e. under
`ray job submit`) or starts a private local one, resolves the run plan for that cluster and
checks it fits (node by node on a cluster of several nodes, where each role is pinned to its
node: relax.distributed.ray.nodes), starts Serve with no HTTP proxy (roles are reached through handles, nothing
listens on a public port) and TransferQueue (or attaches to a running one). Leaving it tears
down exactly what it started: Serve apps of this run always, TransferQueue and Ray only when it
started them. `deploy_role` turns a component class into a one-replica Serve deployment.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from relax.config.plan import REPLICA_CPUS, RolePlan, RunPlan, check_cluster, resolve_plan
from relax.config.schema import RelaxConfig
from relax.core import reaper
from relax.core.registry import component_path
from relax.distributed.ray.local import (bind_serve_grpc, keep_sigterm_handler, ray_temp_dir, session_dir,
                                        start_local_ray)
from relax.distributed.ray.names import named_actor_running
from relax.distributed.ray.serve_apps import AppState, app_states
from relax.utils.logging import TOKEN_FILE_ENV, new_run_token, remove_token_file, write_token_file
from relax.utils.metrics import METRICS_APP_ENV
from relax.utils.plugins import import_object
from relax.utils.poll import Backoff
from relax.utils import startup_gc
from relax.utils.proc import RUN_ENV
from relax.utils.timeline import Timeline, timed_methods

logger = logging.getLogger(__name__)


ENV_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "configs", "env.yaml")


def env_file_vars(path: str = ENV_FILE) -> dict[str, str]:
    """`env_vars:` of configs/env.yaml (missing file -> none)."""
    if not os.path.exists(path):
        return {}
    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    if not isinstance(loaded, dict) or not isinstance(loaded.get("env_vars", {}), dict):
        raise ValueError(f"{path}: expected a mapping with an 'env_vars' mapping of NAME: value")
    return {str(k): str(v) for k, v in (loaded.get("env_vars") or {}).items()}


def runtime_env_vars(token_file: str, run_id: str) -> dict[str, str]:
    """Env for every role process: configs/env.yaml defaults, where the run token is (the file,
    not the token: Ray logs runtime environments), the run id (its data-plane namespace), and
    the launch directory on PYTHONPATH so plugins given as dotted paths (`examples.x.reward.fn`)
    import in remote processes too. Variables already set in the launching environment win."""
    path = os.pathsep.join(p for p in [os.getcwd(), os.environ.get("PYTHONPATH", "")] if p)
    env = {k: os.environ.get(k, v) for k, v in env_file_vars().items()}
    env.update({TOKEN_FILE_ENV: token_file, RUN_ENV: run_id, "PYTHONPATH": path, "RAY_USAGE_STATS_ENABLED": "0"})
    for key in ("RELAX_LOG_LEVEL", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def replica_class(cls: type, role: str | None = None, timeline_dir: str | None = None) -> type:
    """`cls` as a Serve replica runs it: first the replica's inter-deployment gRPC server is bound to
    the run's address instead of every interface (`bind_serve_grpc`; Serve starts that server
    after the constructor), then `cls.__init__`; `relax_heartbeat()` names the replica (a new one
    after Serve restarted it: relax.core.health sets it up again). With `timeline_dir`
    (`--timeline-dump-dir`) every public method call records a span on the role's track
    (`relax.utils.timeline`)."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bind_serve_grpc()
        self._relax_timeline = Timeline(timeline_dir, role or cls.__name__)
        self._relax_replica = uuid.uuid4().hex  # a replica Serve restarts answers heartbeats with a new one
        cls.__init__(self, *args, **kwargs)
        startup_gc.started()  # the replica's imports are done (relax/utils/startup_gc.py)

    def relax_heartbeat(self: Any) -> dict[str, Any]:
        """The HealthManager's heartbeat (relax.core.health): which replica answers, in which process."""
        return {"replica": self._relax_replica, "pid": os.getpid()}

    body: dict[str, Any] = {"__init__": __init__, "relax_heartbeat": relax_heartbeat, "__module__": __name__,
                            "__qualname__": f"replica_class.<locals>.{cls.__name__}"}
    if timeline_dir:
        body.update(timed_methods(cls, lambda self: self._relax_timeline))
    # A name no module defines, so the class travels by value (by reference it would be `cls`).
    return type(f"{cls.__name__}Replica", (cls,), body)


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped the run. A KeyboardInterrupt, so it takes every path Ctrl-C takes;
    `relax-train` exits 143 (128 + SIGTERM) instead of Ctrl-C's 130."""


class SigtermStop:
    """SIGTERM stops the run the way Ctrl-C does, whatever signal dispositions the process inherited.

    Ctrl-C reaches the run as the cancellation of its task while the main thread runs the run's
    event loop (asyncio's SIGINT handler), else as KeyboardInterrupt; either way every `finally`
    tears down. SIGTERM takes the same two paths with its own handler, never through SIGINT: a
    process started in the background of a non-interactive shell (`cmd &` in a script, CI, job
    schedulers) inherits SIGINT ignored, and then neither does asyncio install its handler nor does
    `_thread.interrupt_main(SIGINT)` do anything. SIGINT's disposition is left as it was.
    """

    def __init__(self) -> None:
        self.terminated = False  # a SIGTERM came
        self.stopping = False  # teardown under way: a SIGTERM now only logs
        self.loop_ended = threading.Event()  # the run's loop is over (done, failed or cancelled)
        self._installed, self._previous = False, None  # SIGTERM's handler before the run (restored after it)
        self._held = False  # inside `held()`: a SIGTERM stops the run when the block ends
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None  # the run's task while the main thread runs its loop

    def install(self) -> None:
        """Install the handler; again once Ray is up (its core worker installs a C handler of its
        own, which aborts the driver). `restore` puts back the one from before the first call."""
        if threading.current_thread() is threading.main_thread():  # (signal handlers are the main thread's)
            previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            if not self._installed:
                self._previous, self._installed = previous, True

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False

    @contextmanager
    def held(self) -> Iterator[None]:
        """A SIGTERM inside the block stops the run when the block ends (Ray's start-up: cut short
        inside `ray.init`, the driver aborts when it exits)."""
        self._held = True
        try:
            yield
        finally:
            self._held = False
        if self.terminated:
            raise Terminated("SIGTERM")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        task = self._task
        if self.terminated or self.stopping or (task is not None and task.cancelling()):
            logger.warning("SIGTERM: the run is already stopping")
            return
        self.terminated = True
        logger.warning("SIGTERM: stopping the run (as on Ctrl-C)")
        if self._held:
            return
        if task is not None:  # the handler runs in the main thread, inside the loop: cancel at its next turn
            self._loop.call_soon_threadsafe(task.cancel)
        else:
            raise Terminated("SIGTERM")

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """`asyncio.run(coro)`, where SIGTERM cancels the run's task (its `finally` blocks shut the
        roles down) and then raises Terminated."""
        async def main() -> Any:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            try:
                return await coro
            finally:
                self._task = None
                self.loop_ended.set()

        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if self.terminated:
                raise Terminated("SIGTERM") from None
            raise
        if self.terminated:  # the run caught the cancellation: stopped all the same
            raise Terminated("SIGTERM")
        return result


def serve_running() -> bool:
    return named_actor_running("SERVE_CONTROLLER_ACTOR", "serve")


class Runtime:
    def __init__(self, cfg: RelaxConfig) -> None:
        self.cfg = cfg
        self.token = new_run_token()
        self.run_id = uuid.uuid4().hex[:8]
        self.token_file = os.path.join(cfg.misc.exp_dir, ".relax", f"run_token-{self.run_id}")
        self.env = runtime_env_vars(self.token_file, self.run_id)
        if cfg.logging.use_metrics_service:  # where roles' MetricsReporter sends their reports
            self.env[METRICS_APP_ENV] = self.app_name("metrics")
        self.started_ray = False
        self.started_serve = False
        self.started_tq = False
        self._tq: Future | None = None  # TransferQueue's start-up (a thread: see __enter__)
        self.sigterm = SigtermStop()  # SIGTERM stops the run as Ctrl-C does
        self._reaper: Any = None  # relax.core.reaper, when this run starts its own Ray
        self._saved_env: dict[str, str | None] = {}
        self.apps: list[str] = []
        self.failed_apps: set[str] = set()  # apps whose replica could not start (wait_running)
        self.plan: RunPlan | None = None  # resolved for this cluster on entering
        self.nodes: list[Any] = []  # the cluster's live nodes at the start (relax.distributed.ray.nodes)
        self.role_ips: dict[str, str] = {}  # role -> the address of its node (clusters of several nodes)
        self._gpu_group: Any = None  # the run's GPUs (a Ray placement group), on GPU clusters

    def __enter__(self) -> Runtime:
        try:
            return self._enter()
        except BaseException:  # e.g. the plan does not fit the cluster: undo what was started
            self.__exit__(*sys.exc_info())
            raise

    def _enter(self) -> Runtime:
        from ray import serve

        from relax.distributed import transfer_queue as tq

        self.sigterm.install()
        write_token_file(self.token_file, self.token)
        self._saved_env = {k: os.environ.get(k) for k in self.env}  # restored on exit
        os.environ.update(self.env)  # the driver is a role process too (token for direct calls)
        with self.sigterm.held():  # a SIGTERM while Ray starts stops the run once Ray is up
            self._start_ray()
            self.sigterm.install()
        self.plan = self._plan()
        if self.plan.placement is not None and self.plan.placement.bundles:
            from relax.distributed.ray.placement import create_gpu_group

            self._gpu_group = create_gpu_group(self.run_id, self.plan.placement)
        # TransferQueue starts its controller, then its storage units (~8 s of actor start-ups):
        # in a thread, while Serve starts and the roles deploy. Its controller is up before any
        # role may attach, and `wait_running` waits for the whole data system.
        pool = ThreadPoolExecutor(1, thread_name_prefix="tq-init")
        head = f"node:{self.nodes[0].ip}" if self.role_ips else None  # several nodes: the data on the driver's
        self._tq = pool.submit(tq.init_data_system, self.cfg.cluster.num_data_storage_units, head,
                               polling_mode=self.cfg.cluster.polling_mode)
        pool.shutdown(wait=False)  # the thread ends with its one task
        tq.wait_for_controller(self._tq)
        self.started_serve = not serve_running()
        serve.start(proxy_location="Disabled")
        return self

    def _start_ray(self) -> None:
        """Join the cluster the run names (`--ray-address`, `$RAY_ADDRESS`) or start a private Ray."""
        import ray

        address = self.cfg.cluster.ray_address or os.environ.get("RAY_ADDRESS")
        if ray.is_initialized():  # e.g. a test session's shared cluster: use it, leave it running
            logger.info("using the Ray instance already initialised in this process")
        elif address:
            with keep_sigterm_handler():  # Ray's own exits the driver mid-run, leaving the run's apps behind
                ray.init(address=address, runtime_env={"env_vars": self.env}, log_to_driver=True)
            logger.info("joined Ray cluster at %s", address)
        else:
            # A SIGKILLed driver leaves nothing behind: the reaper kills what is left of the run.
            self._reaper = reaper.start(self.run_id, RUN_ENV, ray_temp_dir())
            num_cpus = self.cfg.cluster.ray_num_cpus or max(8, os.cpu_count() or 1)
            self.started_ray = True  # (before it starts: a start cut short is shut down too)
            # The run's variables are in this process's environment (_enter), which Ray's processes
            # inherit: no job runtime_env (start_local_ray's doc says what it costs).
            with keep_sigterm_handler():
                start_local_ray(num_cpus, log_to_driver=True)  # listens on loopback only
            reaper.watch_session(self._reaper, session_dir())
            logger.info("started a local Ray instance with %d logical CPUs", num_cpus)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run the run's coroutine on its own event loop; SIGTERM stops it as Ctrl-C does (SigtermStop)."""
        return self.sigterm.run(coro)

    def _plan(self) -> RunPlan:
        """The run plan for this cluster, checked against its CPUs and GPUs before anything of the
        run starts (a plan the cluster cannot hold would wait for resources forever)."""
        import ray

        resources = ray.cluster_resources()
        plan = resolve_plan(self.cfg, float(resources.get("GPU", 0.0)))
        check_cluster(plan, resources)
        self._place_on_nodes(plan)
        for note in plan.notes:
            logger.warning("%s", note)
        if plan.placement is not None:
            from relax.config.placement import describe

            logger.info("GPUs: %s%s", describe(plan.placement),
                        "; training ranks offload to the host during rollout" if plan.offload_train else "")
        return plan

    def _place_on_nodes(self, plan: RunPlan) -> None:
        """On a cluster of several nodes: which node every role runs on, checked per node, logged and
        written to <exp-dir>/placement.json (relax.config.nodes, relax.distributed.ray.nodes)."""
        from relax.config.nodes import format_nodes, place_nodes
        from relax.distributed.ray import nodes as ray_nodes

        self.nodes = ray_nodes.alive_nodes()
        placed = None
        if ray_nodes.pinnable(self.nodes):
            placed = place_nodes(plan, ray_nodes.as_plan_nodes(self.nodes))
            logger.info("roles per node:\n%s", "\n".join(format_nodes(placed)[2:]))
        elif len(self.nodes) > 1:
            logger.warning("%d Ray nodes share an address: roles are placed by Ray, not pinned", len(self.nodes))
        if len(self.nodes) > 1:
            self.role_ips = ray_nodes.write_placement(self.cfg.misc.exp_dir, self.nodes, placed)

    def _role_ip(self, role: RolePlan) -> str | None:
        """The node address `role` is pinned to (None: one node): on GPUs the node of its first GPU
        bundle as Ray placed the group, else the plan's node."""
        if not self.role_ips:
            return None
        if self._gpu_group is not None and role.slots:
            from ray.util.placement_group import placement_group_table

            node_id = placement_group_table(self._gpu_group)["bundles_to_node_id"][role.slots[0][0]]
            return next((n.ip for n in self.nodes if n.node_id == node_id), None)
        return self.role_ips.get(role.name)

    def lost_roles(self) -> set[str]:
        """The roles placed on a node that has left the cluster since the run started."""
        from relax.distributed.ray import nodes as ray_nodes

        lost = {n.ip for n in ray_nodes.lost_nodes(self.nodes)} if len(self.nodes) > 1 else set()
        return {role for role, ip in self.role_ips.items() if ip in lost}

    def lost_node_error(self, error: BaseException) -> BaseException | None:
        """`NodeLost` naming the nodes of the run that left the cluster and their roles (None: none left)."""
        from relax.distributed.ray import nodes as ray_nodes

        lost = ray_nodes.lost_nodes(self.nodes) if len(self.nodes) > 1 else []
        return ray_nodes.node_lost(lost, self.role_ips, error) if lost else None

    def app_name(self, role: str) -> str:
        """The Serve app of `role` in this run."""
        return f"relax-{self.run_id}-{role}"

    def deploy_role(self, role: RolePlan, *init_args: Any, wait: bool = False) -> Any:
        """Deploy `role` as a one-replica Serve app and return its handle. Returns once the app is
        created, while its replica still starts (`wait=True` waits): deploy several, then
        `wait_running()` (their processes start side by side instead of one after another)."""
        from ray import serve

        from relax.distributed.ray.nodes import NODE_ENV, pin_options

        cls = import_object(component_path(role), flag=f"role {role.name}")
        app_name = self.app_name(role.name)
        ip = self._role_ip(role)  # several nodes: the replica (and its ranks, engines) on the role's node
        env = {**self.env, NODE_ENV: ip} if ip else self.env
        deployment = serve.deployment(
            # The roles shut down first (Controller.shutdown); the replica then has nothing in flight,
            # so deletion need not poll for ongoing requests on Serve's 2 s default period.
            replica_class(cls, role.name, self.cfg.logging.timeline_dump_dir), name=role.name, num_replicas=1,
            max_ongoing_requests=1024,
            graceful_shutdown_timeout_s=30, graceful_shutdown_wait_loop_s=0.1,
            # A role's constructor is deterministic: a failure fails the run at once, not 3 retries later.
            max_constructor_retry_count=1,
            health_check_timeout_s=600, logging_config={"enable_access_log": False},
            # No GPU for the replica itself: its ranks and engines hold their GPU shares in the
            # run's placement group (relax.distributed.ray.placement).
            ray_actor_options={"num_cpus": REPLICA_CPUS, "runtime_env": {"env_vars": env},
                               **(pin_options(ip) if ip else {})},
        )
        target = serve.RunTarget(deployment.bind(*init_args), name=app_name, route_prefix=None)
        handle = serve.run_many([target], wait_for_applications_running=wait)[0]
        self.apps.append(app_name)
        logger.info("deployed %s as Serve app %s", role.name, app_name)
        return handle

    def wait_running(self, timeout_s: float = 600.0) -> None:
        """Block until every app deployed so far is running; a replica that failed to start
        raises with Serve's message (the role's constructor error)."""
        self.started_tq = self._tq.result()  # the data system is whole before any role sets up
        deadline, backoff = time.monotonic() + timeout_s, Backoff(first_s=0.05, max_s=0.5)
        while True:
            apps = app_states()
            pending = []
            for name in self.apps:
                state = apps.get(name, AppState("NOT_STARTED"))
                if state.failed:
                    self.failed_apps.add(name)
                    details = "\n".join(state.messages)
                    raise RuntimeError(f"Serve app {name} failed to start: {details}")
                if not state.running:
                    pending.append(name)
            if not pending:
                return
            if self.sigterm.loop_ended.is_set():  # stopped (Ctrl-C, SIGTERM) while the roles start
                raise RuntimeError("the run stopped while its Serve apps were starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Serve apps not running after {timeout_s:.0f}s: {pending}")
            backoff.sleep()

    def _delete_apps(self, timeout_s: float = 60.0) -> None:
        """Delete every app of this run at once (the roles shut down before), then wait until
        they are gone: one after another costs ~3 s per app. Apps of roles whose node left the
        cluster are not waited for: Serve restarted their replicas pinned to that node, where they
        never start and cannot stop, and force-kills them only after graceful_shutdown_timeout_s
        (30 s a global restart waited for nothing)."""
        from ray import serve

        if not self.apps:
            return
        for app in reversed(self.apps):
            try:
                serve.delete(app, _blocking=False)
            except Exception as err:  # noqa: BLE001 - teardown continues whatever one app does
                logger.warning("deleting Serve app %s failed: %s", app, err)
        waited = self._apps_on_live_nodes()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                live = app_states()
                left = [a for a in waited if a in live]
            except Exception as err:  # noqa: BLE001 - the controller may already be gone
                logger.warning("reading Serve status during teardown failed: %s", err)
                return
            if not left:
                return
            time.sleep(0.1)
        logger.warning("Serve apps still deleting after %.0fs: %s", timeout_s, left)

    def _apps_on_live_nodes(self) -> list[str]:
        """This run's apps but those of roles on a node that left the cluster (`lost_roles`)."""
        try:
            lost = self.lost_roles()
        except Exception as err:  # noqa: BLE001 - the cluster may be going: wait for every app
            logger.warning("reading the cluster's nodes during teardown failed: %s", err)
            return list(self.apps)
        if lost:
            logger.info("not waiting for the Serve apps of %s: their node left the cluster (Serve stops their "
                        "replicas by itself)", ", ".join(sorted(lost)))
        left_behind = {self.app_name(role) for role in lost}
        return [a for a in self.apps if a not in left_behind]

    def __exit__(self, *exc: Any) -> None:
        import ray
        from ray import serve

        from relax.distributed import transfer_queue as tq

        self.sigterm.stopping = True  # a SIGTERM now must not cut teardown short
        self._delete_apps()
        if self._gpu_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._gpu_group)
        try:
            if self._tq is not None:  # (None: entering failed before TransferQueue started)
                self.started_tq = self._tq.result()
                if self.started_tq:
                    tq.close_data_system()
                else:  # a shared data system (another job's, a test session's): take only this run's rows
                    tq.clear_run()
        except Exception as err:  # noqa: BLE001 - teardown continues
            logger.warning("closing TransferQueue failed: %s", err)
        if self.started_serve and not self.started_ray and not app_states():
            serve.shutdown()  # this run brought Serve up on a shared cluster: take it down again
        if self.started_ray:
            ray.shutdown()
        remove_token_file(self.token_file)
        for key, value in self._saved_env.items():  # a later run in this process starts clean
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self._reaper is not None:
            reaper.release(self._reaper)
        self.sigterm.restore()
        sys.stdout.flush()
        if self.sigterm.terminated and isinstance(exc[1], KeyboardInterrupt) and not isinstance(exc[1], Terminated):
            raise Terminated("SIGTERM") from None  # Ray re-raises an interrupted call as a plain KeyboardInterrupt
