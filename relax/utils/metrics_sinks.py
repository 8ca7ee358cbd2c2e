"""Metrics sinks: where a step's metrics row goes (JSONL log, TensorBoard, W&B, ClearML).

A row is `(step, {key: float})`. `MetricsFanout` hands every row to each enabled sink, and each
sink runs behind its own bounded queue and thread (`BackgroundSink`), so a slow sink (an upload
over a bad link, a W&B or ClearML server that does not answer) never holds up training: when its
queue is full, new rows for that sink are dropped and counted. A sink that raises (at start or on
a row) logs one error naming it and is turned off; the other sinks and the run go on.

The same classes run in the driver (no `--use-metrics-service`) and in the metrics role's Serve
replica (`relax.components.metrics`). `SINKS` is the one registry: name -> class taking a
`SinkConfig`. W&B and ClearML log offline when their own mode variables say so or no
credentials are found, so a run without network keeps every metric (`wandb sync`, ClearML's
`Task.import_offline_session` upload it later).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import netrc
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

logger = logging.getLogger(__name__)

QUEUE_ROWS = 1000  # rows a sink may fall behind before new ones are dropped for it
CLOSE_TIMEOUT_S = 50.0  # the metrics role's shutdown has 60 s (relax.core.controller)


class Sink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class SinkConfig:
    """What the sinks need to know about the run (built from the flags by `relax.components.metrics`)."""

    exp_dir: str
    tb_dir: str = ""  # TensorBoard log directory (default <exp_dir>/tb)
    project: str | None = None  # W&B project / ClearML project (None: $WANDB_PROJECT, else "relax")
    run_name: str | None = None  # W&B run / ClearML task name (None: the run directory's name)
    run_config: dict[str, Any] = field(default_factory=dict)  # the run's flags, shown by W&B / ClearML
    queue_rows: int = QUEUE_ROWS

    @property
    def name(self) -> str:
        return self.run_name or os.path.basename(os.path.normpath(self.exp_dir))


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics dict (a path such as `export/hf_path` is not a metric)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


TEXT_PREFIX = "text/"  # string entries under this prefix are text for the sinks that show it


def texts(metrics: dict[str, Any]) -> dict[str, str]:
    """The text entries of a metrics dict (`text/<key>`: e.g. --log-multi-turn's trajectories)."""
    return {k: v for k, v in metrics.items() if k.startswith(TEXT_PREFIX) and isinstance(v, str)}


def loggable(metrics: dict[str, Any]) -> dict[str, Any]:
    """What a row may carry to the sinks: its scalars and its text entries."""
    return {**scalars(metrics), **texts(metrics)}


# ---- the sinks ------------------------------------------------------------------------------

METRICS_LOG = "metrics.jsonl"  # the JSONL sink's file in the run directory


class JsonlSink:
    """`<exp_dir>/metrics.jsonl`: one JSON object per row (`{"step": s, key: value, ...}`)."""

    def __init__(self, cfg: SinkConfig) -> None:
        os.makedirs(cfg.exp_dir, exist_ok=True)
        self.file = open(os.path.join(cfg.exp_dir, METRICS_LOG), "a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def cut_metrics_log(path: str, since: int, keep_through: int | None, side_path: str) -> list[int | None]:
    """A global restart redoes the steps after its checkpoint: of the rows written to the JSONL log
    at `path` after byte offset `since` (this run's rows), move those of steps after `keep_through`
    (every one when None: the run starts over) to the end of `side_path`, so that the redone steps'
    rows are the only ones in the log. A row cut short by a killed writer goes there too. Rows
    before `since` (an earlier run in the same directory) stay as they are. Returns the moved
    rows' steps (None for a row that does not parse)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        head, tail = f.read(since), f.read()
    kept, moved, steps = [], [], []
    for line in tail.splitlines(keepends=True):
        step = _row_step(line)
        if step is not None and keep_through is not None and step <= keep_through and line.endswith(b"\n"):
            kept.append(line)
        else:
            moved.append(line if line.endswith(b"\n") else line + b"\n")
            steps.append(step)
    if moved:
        with open(side_path, "ab") as f:
            f.writelines(moved)
        with open(path + ".cut", "wb") as f:
            f.write(head)
            f.writelines(kept)
        os.replace(path + ".cut", path)  # a crash now leaves the old log or the new one, never half of one
    return steps


def _row_step(line: bytes) -> int | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step") if isinstance(row, dict) and isinstance(row.get("step"), int) else None


class TensorBoardSink:
    """TensorBoard scalars (`--use-tensorboard`), one tag per key."""

    def __init__(self, cfg: SinkConfig) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = cfg.tb_dir or os.path.join(cfg.exp_dir, "tb")
        self.writer = SummaryWriter(log_dir=log_dir)
        logger.info("TensorBoard scalars -> %s", log_dir)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_text(self, step: int, entries: dict[str, str]) -> None:
        for key, value in entries.items():
            self.writer.add_text(key[len(TEXT_PREFIX):], value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_mode() -> str:
    """$WANDB_MODE if set; else online when credentials are found ($WANDB_API_KEY or a netrc
    entry for the W&B host), offline otherwise (`wandb sync <dir>` uploads it later)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0].split(":")[0]
    try:
        return "online" if netrc.netrc().authenticators(host) else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


class WandbSink:
    """Weights & Biases (`--use-wandb`). Every row is logged with the run's step as the `step`
    metric that all charts use as their x axis, so rows may arrive out of order (a role's late
    report) without W&B dropping them."""

    def __init__(self, cfg: SinkConfig) -> None:
        import wandb

        mode = wandb_mode()
        directory = os.environ.get("WANDB_DIR") or cfg.exp_dir
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(project=cfg.project or os.environ.get("WANDB_PROJECT") or "relax", name=cfg.name,
                              dir=directory, mode=mode, config=cfg.run_config, reinit="create_new",
                              settings=wandb.Settings(console="off"))  # the console stays the run's own
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        later = f"; upload it with `wandb sync {os.path.dirname(self.run.dir)}`" if mode == "offline" else ""
        logger.info("W&B run %s (%s) -> %s%s", self.run.name, mode, self.run.dir, later)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "step": step})

    def log_text(self, step: int, entries: dict[str, str]) -> None:
        import wandb

        self.run.log({**{k: wandb.Html(f"<pre>{v}</pre>") for k, v in entries.items()}, "step": step})

    def close(self) -> None:
        self.run.finish()


# Frameworks ClearML would patch on Task.init (and its git/requirements scan): all off, the sink
# reports scalars itself, and the scan can hold `close()` for minutes.
CLEARML_AUTO_CONNECT = {name: False for name in (
    "matplotlib", "tensorflow", "tensorboard", "pytorch", "xgboost", "scikit", "fastai", "lightgbm", "hydra",
    "tfdefines", "joblib", "megengine", "catboost", "gradio", "detect_repository")}


def clearml_offline() -> bool:
    """$CLEARML_OFFLINE_MODE if set; else offline unless credentials are configured
    ($CLEARML_API_ACCESS_KEY, $CLEARML_CONFIG_FILE or ~/clearml.conf)."""
    if os.environ.get("CLEARML_OFFLINE_MODE"):
        return os.environ["CLEARML_OFFLINE_MODE"].lower() in ("1", "true", "yes", "on")
    configured = os.environ.get("CLEARML_API_ACCESS_KEY") or os.environ.get("CLEARML_CONFIG_FILE") or any(
        os.path.exists(os.path.expanduser(p)) for p in ("~/clearml.conf", "~/.clearml.conf"))
    return not configured


def split_key(key: str) -> tuple[str, str]:
    """`train/pg_loss` -> ClearML title `train`, series `pg_loss`; `eval/gsm8k/pass@1` -> (`eval/gsm8k`, `pass@1`)."""
    title, _, series = key.rpartition("/")
    return (title, series) if title else (key, key)


class ClearMLSink:
    """ClearML (`--use-clearml`): one task per run, one scalar plot per key prefix."""

    def __init__(self, cfg: SinkConfig) -> None:
        from clearml import Task

        offline = clearml_offline()
        if offline:
            Task.set_offline(True)
            # Offline there is nothing to upload; the reporting subprocess only makes close() wait
            # ~10 s for a liveness check.
            Task._report_subprocess_enabled = False
        self.task = Task.init(project_name=cfg.project or "relax", task_name=cfg.name, reuse_last_task_id=False,
                              auto_connect_frameworks=CLEARML_AUTO_CONNECT, auto_connect_arg_parser=False,
                              auto_connect_streams=False)
        if cfg.run_config:
            self.task.connect(cfg.run_config, name="flags")
        self.logger = self.task.get_logger()
        where = (f"{self.task.get_offline_mode_folder()} (upload the .zip written at the end with "
                 "clearml.Task.import_offline_session)") if offline else "the ClearML server"
        logger.info("ClearML task %s (%s) -> %s", self.task.id, "offline" if offline else "online", where)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            title, series = split_key(key)
            self.logger.report_scalar(title, series, value, iteration=step)

    def log_text(self, step: int, entries: dict[str, str]) -> None:
        for key, value in entries.items():
            self.logger.report_text(f"{key} (step {step})\n{value}", print_console=False)

    def close(self) -> None:
        self.task.close()


SINKS: dict[str, Callable[[SinkConfig], Sink]] = {
    "jsonl": JsonlSink,
    "tensorboard": TensorBoardSink,
    "wandb": WandbSink,
    "clearml": ClearMLSink,
}
# sink -> (the flag that turns it on, the package it needs)
SINK_FLAGS: dict[str, tuple[str, str]] = {
    "tensorboard": ("--use-tensorboard", "tensorboard"),
    "wandb": ("--use-wandb", "wandb"),
    "clearml": ("--use-clearml", "clearml"),
}


def enabled_sinks(logging_cfg: Any) -> list[str]:
    """The sinks a run's logging flags (`cfg.logging`) turn on: the JSONL log always."""
    on = {"tensorboard": logging_cfg.use_tensorboard, "wandb": logging_cfg.use_wandb,
          "clearml": logging_cfg.use_clearml}
    return ["jsonl"] + [name for name, flag_on in on.items() if flag_on]


def missing_packages(names: list[str]) -> list[str]:
    """One message per enabled sink whose package is not installed, naming the flag and the fix."""
    out = []
    for name in names:
        if name in SINK_FLAGS and importlib.util.find_spec(SINK_FLAGS[name][1]) is None:
            flag, package = SINK_FLAGS[name]
            out.append(f"{flag} needs the '{package}' package, which is not installed: "
                       f"pip install 'relax-rl[{package}]' (or pip install {package}), or drop {flag}")
    return out


# ---- running sinks without blocking ---------------------------------------------------------

_STOP = object()


class BackgroundSink:
    """One sink behind a bounded queue and a daemon thread that builds it, then writes its rows.

    `log` never waits: a full queue drops the row (counted, warned at 1, 10, 100, ... drops). A
    sink that raises is turned off with one error, and its rows are discarded from then on."""

    def __init__(self, name: str, factory: Callable[[], Sink], max_rows: int = QUEUE_ROWS) -> None:
        self.name, self.max_rows = name, max_rows
        self.queue: queue.Queue = queue.Queue()  # bounded by `log` (the stop marker always fits)
        self.dropped = 0
        self.failed = False
        self.thread = threading.Thread(target=self._run, args=(factory,), daemon=True, name=f"metrics-{name}")
        self.thread.start()

    def log(self, step: int, metrics: dict[str, Any], method: str = "log") -> bool:
        """Queue a row for the sink's `method` (`log`, or `log_text` for text entries, skipped by a
        sink without it); False when it was dropped (sink full or turned off)."""
        if self.failed:
            return False
        if self.queue.qsize() >= self.max_rows:
            self.dropped += 1
            if math.log10(self.dropped).is_integer():
                logger.warning("metrics sink %s is %d rows behind: %d rows dropped for it so far (training "
                               "is not held up)", self.name, self.max_rows, self.dropped)
            return False
        self.queue.put((method, step, metrics))
        return True

    def _run(self, factory: Callable[[], Sink]) -> None:
        try:
            sink = factory()
        except Exception as exc:  # noqa: BLE001 - a sink that cannot start is turned off, the run goes on
            self._fail("could not start", exc)
            return
        while (item := self.queue.get()) is not _STOP:
            method, step, row = item
            try:
                if hasattr(sink, method):
                    getattr(sink, method)(step, row)
            except Exception as exc:  # noqa: BLE001 - a broken sink is turned off, the run goes on
                self._fail("failed", exc)
                break
        try:
            sink.close()
        except Exception as exc:  # noqa: BLE001 - closing a broken sink must not raise either
            if not self.failed:
                self._fail("could not close", exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        self.failed = True
        logger.error("metrics sink %s %s and is turned off for the rest of the run (the run and the other sinks "
                     "go on): %s: %s", self.name, what, type(exc).__name__, exc)

    def stop(self) -> None:
        """No more rows: the thread writes what is queued, then closes the sink."""
        self.queue.put(_STOP)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued and close the sink, waiting at most `timeout_s`."""
        self.stop()
        self.join(timeout_s)

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            logger.warning("metrics sink %s still busy after %.0f s at shutdown; up to %d rows may be lost",
                           self.name, timeout_s, self.queue.qsize())
        if self.dropped:
            logger.warning("metrics sink %s dropped %d rows during the run (it fell behind)", self.name, self.dropped)


class MetricsFanout:
    """Every row to every enabled sink (`names`, looked up in `registry`, default `SINKS`)."""

    def __init__(self, cfg: SinkConfig, names: list[str], registry: dict[str, Callable[[SinkConfig], Sink]] = SINKS):
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise ValueError(f"unknown metrics sinks {unknown}; known: {sorted(registry)}")
        self.sinks = [BackgroundSink(n, lambda n=n: registry[n](cfg), cfg.queue_rows) for n in names]

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A row's scalars to every sink, and its text entries (`text/...`) to those that show text."""
        row, text = scalars(metrics), texts(metrics)
        for sink in self.sinks:
            sink.log(step, row)
            if text:
                sink.log(step, text, method="log_text")

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close every sink at once (each writes its backlog), all within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for sink in self.sinks:
            sink.stop()
        for sink in self.sinks:
            sink.join(max(0.0, deadline - time.monotonic()))
