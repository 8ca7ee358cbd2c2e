"""Suite-wide fixtures."""

from __future__ import annotations

import atexit
import compileall
import gc
import json
import logging
import os
from pathlib import Path

import pytest

from relax.utils import startup_gc
from relax.utils.proc import cpu_compute_env  # (no torch: imported before any test imports it)

# The tests' own torch (unit tests train in-process, spawned ranks inherit this) runs on two pytest-xdist
# workers sharing 2 cores, where OpenMP threads spinning at barriers hold the core a descheduled thread
# needs: the environment the runs' CPU ranks and engines get (relax.utils.proc.CPU_COMPUTE_ENV).
os.environ.update(cpu_compute_env())
# The processes tests start themselves (spawned ranks, engines, reward workers) stand for a run's role
# processes, which configs/env.yaml gives RELAX_STARTUP_GC=1 (relax/utils/startup_gc.py).
os.environ.setdefault("RELAX_STARTUP_GC", "1")
# This process's own full collections each scan everything the tests have imported (torch, transformers, Ray,
# megatron-core: millions of objects, ~0.2 s a scan) and came every few seconds of unit tests: ~10% of their
# CPU. Held back for the whole session; an xdist worker, which inherits the variable and so imported relax
# deferring, ends that deferral first, so that no in-process training rank or replica undoes this.
startup_gc.started()
gc.set_threshold(*gc.get_threshold()[:2], max(gc.get_threshold()[2], startup_gc.DEFERRED_OLDEST))
# And none at exit, as in the processes tests start (relax/utils/startup_gc.py; this one imported relax before
# setting the variable): finalization's full collection over them took ~3 s at the end of an xdist worker, while
# the other worker may be done. This runs after pytest's end-of-session collection (pytest_configure below).
atexit.register(gc.freeze)


def pytest_configure(config: pytest.Config) -> None:
    """pytest's unraisable-exception check collects garbage five times at the end of a session: the first
    collection runs the finalizers of the cycles tests left behind (one that raises is reported), the next
    four only catch cycles those finalizers left in turn, each scanning everything the tests imported
    (~0.7 s in a worker here). Here it collects once."""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key  # (pytest >= 8.4)
    except ImportError:
        return
    config.stash[gc_collect_iterations_key] = 1


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the project once: each integration run starts a dozen Python processes (Serve
    replicas, training ranks, engines, reward workers) that import it, and with
    PYTHONDONTWRITEBYTECODE set (as on the CI machine) every one of them would compile it again."""
    root = Path(__file__).resolve().parents[1]
    for package in ("relax", "tests", "examples", "bench"):
        compileall.compile_dir(str(root / package), quiet=1)


# The groups' order in the collection, which is the order xdist hands them out (pyproject's addopts:
# --no-loadscope-reorder; by default it would hand out the groups with most tests first).
GROUP_ORDER = ("integration", "own_ray", "multinode")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into the test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n 2 --dist loadgroup`: pyproject's addopts) every test runs in a group, and
    each group on one worker, in order:
    - `integration`: the tests of tests/integration on the session's Ray cluster (`ray_cluster`, and the
      shared runs built on it: reference_run, plugin_run; tests/integration/conftest.py);
    - `own_ray`: the tests of tests/integration whose runs start a Ray of their own (`relax-train`
      subprocesses launched as users launch them: the interrupted runs, the SIGTERM/SIGKILL and
      learning runs); they share no fixture with the first group, so they run beside it;
    - `multinode`: tests/multinode (two Ray nodes of their own);
    - `rank_pool`: the unit tests on the session's two rank processes (`rank_pool`), which one worker
      starts once instead of both;
    - every other test module is a group of its own (or keeps the group it names), so its module-scoped
      fixtures (engines, models, Ray instances) are set up once, not on both workers. Spread test by test,
      the unit tests took 603 CPU-s on the 2-core machine, against 410 run in one process.
    The first two groups go first, to different workers; the third follows `own_ray`; the unit and
    contract modules fill whichever worker is free. (Splitting the Ray-session group itself made the
    recovery tests miss their deadlines: two Ray runs at once on 2 cores.)"""
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    rank = {name: i for i, name in enumerate(GROUP_ORDER)}
    items.sort(key=lambda item: rank.get(_group_name(item.get_closest_marker("xdist_group")), len(rank)))


def _group_name(marker: pytest.Mark) -> str:
    """A group marker's name, given as `xdist_group("x")` or `xdist_group(name="x")`."""
    return marker.kwargs.get("name") or marker.args[0]


def _group(item: pytest.Item) -> str | None:
    """The xdist group `item` runs in (None: the group its module names)."""
    if item.nodeid.startswith("tests/integration/"):
        shared = "ray_cluster" in item.fixturenames  # (fixturenames holds the fixtures' own fixtures too)
        return "integration" if shared else "own_ray"
    if item.nodeid.startswith("tests/multinode/"):  # two Ray nodes of their own: the other worker
        return "multinode"
    if item.get_closest_marker("xdist_group") is not None:
        return None
    if "rank_pool" in item.fixturenames:
        return "rank_pool"
    return item.nodeid.split("::")[0]


@pytest.fixture(autouse=True)
def _relax_logging_propagates():
    """Components call `setup_logging()`, which stops the `relax` logger propagating (its own
    handler prints once); undo that after each test so later tests' `caplog` sees records."""
    yield
    root = logging.getLogger("relax")
    for handler in [h for h in root.handlers if getattr(h, "_relax", False)]:
        root.removeHandler(handler)
    root.propagate = True


@pytest.fixture(scope="session")
def rank_pool():
    """Two rank processes for the session's two-rank unit tests (tests/rank_pool.py: they import
    torch and megatron-core once, not once per test)."""
    from tests.rank_pool import RankPool

    pool = RankPool(2)
    yield pool
    pool.close()


@pytest.fixture
def alert_endpoint():
    """A local HTTP endpoint Apprise posts to (tests/alert_inbox.py); yields the URL and the list of
    JSON bodies it received."""
    from tests.alert_inbox import AlertInbox

    inbox = AlertInbox()
    yield inbox.url, inbox.received
    inbox.close()


@pytest.fixture()
def base(tmp_path):
    """The smallest valid run's flags (a model config, one data row, a run directory): tests add
    the flags they check. A test module may define its own `base`."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    data = tmp_path / "train.jsonl"
    data.write_text('{"input": "1+1", "label": "2"}\n')
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--num-rollout", "3", "--rollout-max-response-len", "8",
            "--exp-dir", str(tmp_path / "run")]
