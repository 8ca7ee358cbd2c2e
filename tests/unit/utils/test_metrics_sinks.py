"""Metrics sinks: every row reaches every sink, W&B and ClearML offline runs hold every key of the
JSONL log, a slow sink never holds up `log`, a failing sink is turned off with one error."""

from __future__ import annotations

import json
import logging
import struct
import threading
from pathlib import Path

import pytest

from relax.utils.metrics_sinks import JsonlSink, MetricsFanout, SinkConfig, split_key

# A realistic run's rows: a step with eval, a plain step, a late report; plus a non-metric entry.
STEP_METRICS = {
    "rollout/reward_mean": 0.41, "rollout/response_len_mean": 9.5, "rollout/truncated_frac": 0.0,
    "rollout/weight_version_min": 2, "reward/failures": 0, "train/pg_loss": -0.012, "train/pg_clipfrac": 0.03,
    "train/ppo_kl": 0.0004, "train/kl_loss": 0.0021, "train/entropy": 0.52, "train/grad_norm": 0.18,
    "train/lr": 1e-6, "train/train_rollout_logprob_abs_diff_mean": 0.004, "train/max_version_lag": 1,
    "weight_sync/bytes": 2.4e7, "weight_sync/seconds": 0.05, "weight_sync/gbps": 0.48, "time/rollout": 0.77,
    "time/train": 1.88, "time/step": 3.23, "stream/reference_seconds": 0.6, "export/hf_path": "/ckpt/hf",
}
ROWS = [(0, STEP_METRICS | {"eval/tiny/reward_mean": 0.28, "eval/tiny/pass@1": 0.25, "eval/tiny/pass@2": 0.4}),
        (1, {k: v * 2 if isinstance(v, float) else v for k, v in STEP_METRICS.items()}),
        (1, {"stream/actor_fwd_seconds": 0.3, "stream/actor_fwd_rows": 16})]


def jsonl_rows(exp_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (exp_dir / "metrics.jsonl").read_text().splitlines()]


def by_step(rows: list[tuple[int, dict[str, float]]]) -> dict[int, dict[str, float]]:
    merged: dict[int, dict[str, float]] = {}
    for step, values in rows:
        merged.setdefault(step, {}).update(values)
    return merged


def jsonl_by_step(exp_dir: Path) -> dict[int, dict[str, float]]:
    return by_step([(r.pop("step"), r) for r in jsonl_rows(exp_dir)])


def log_rows(tmp_path: Path, names: list[str], **config) -> Path:
    exp_dir = tmp_path / "run"
    fanout = MetricsFanout(SinkConfig(str(exp_dir), run_config={"lr": 1e-6, "rollout_batch_size": 4}, **config),
                           names)
    for step, metrics in ROWS:
        fanout.log(step, metrics)
    fanout.close()
    assert not any(s.failed or s.dropped for s in fanout.sinks)
    return exp_dir


def test_jsonl_and_tensorboard_get_every_numeric_entry(tmp_path):
    exp_dir = log_rows(tmp_path, ["jsonl", "tensorboard"])
    rows = jsonl_rows(exp_dir)
    assert [r["step"] for r in rows] == [0, 1, 1]
    assert "export/hf_path" not in rows[0] and rows[0]["eval/tiny/pass@1"] == 0.25
    assert list((exp_dir / "tb").glob("events.out.tfevents.*"))


# ---- W&B ---------------------------------------------------------------------------------------

def wandb_records(path: Path):
    """The records of a `.wandb` file: W&B's run log is a LevelDB-style log (32 KiB blocks of
    checksummed chunks: 4-byte CRC, 2-byte length, 1-byte type) after a 7-byte `:W&B` header."""
    from wandb.proto import wandb_internal_pb2

    data, block, header = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    pos, chunks = 7, []
    while pos + header <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + header]) if left >= header else (0, 0, 0)
        if kind == 0:  # the rest of the block is padding
            pos += left
            continue
        chunks.append(data[pos + header:pos + header + length])
        pos += header + length
        if kind in (1, 4):  # a whole record, or its last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def wandb_history(exp_dir: Path, wait_s: float = 30.0) -> list[tuple[int, dict[str, float]]]:
    """The history rows of the offline run, once its file is complete (W&B's writer process may
    still be flushing when `finish()` has returned on a loaded machine: its last record is `exit`)."""
    import time

    (run_file,) = exp_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + wait_s
    def kinds() -> list[str]:
        try:
            return [r.WhichOneof("record_type") for r in wandb_records(run_file)]
        except Exception as exc:  # noqa: BLE001 - a record still being written
            return [f"partial ({exc})"]

    while (seen := kinds())[-1:] != ["exit"]:
        assert time.monotonic() < deadline, f"{run_file} has no exit record after {wait_s} s: {seen}"
        time.sleep(0.5)
    rows = []
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append((row.pop("step"), {k: v for k, v in row.items() if not k.startswith("_")}))
    return rows


def test_wandb_offline_run_holds_every_metric_of_the_jsonl_log(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    exp_dir = log_rows(tmp_path, ["jsonl", "wandb"], project="relax-tests", run_name="offline")
    assert by_step(wandb_history(exp_dir)) == jsonl_by_step(exp_dir)


# ---- ClearML -----------------------------------------------------------------------------------

def clearml_scalars(cache_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """Scalar events of the offline session(s) under ClearML's cache dir, as (step, {key: value})."""
    rows = []
    for events_file in cache_dir.glob("offline/*/metrics.jsonl"):
        for line in events_file.read_text().splitlines():
            for event in json.loads(line):
                if event["type"] == "training_stats_scalar":
                    title, series = event["metric"], event["variant"]
                    key = title if title == series else f"{title}/{series}"
                    rows.append((event["iter"], {key: event["value"]}))
    return rows


def test_clearml_offline_task_holds_every_metric_of_the_jsonl_log(tmp_path, monkeypatch):
    pytest.importorskip("clearml")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml"))
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    exp_dir = log_rows(tmp_path, ["jsonl", "clearml"], project="relax-tests", run_name="offline")
    assert by_step(clearml_scalars(tmp_path / "clearml")) == jsonl_by_step(exp_dir)


def test_clearml_titles_split_at_the_last_slash():
    assert split_key("train/pg_loss") == ("train", "pg_loss")
    assert split_key("eval/gsm8k/pass@1") == ("eval/gsm8k", "pass@1")
    assert split_key("loss") == ("loss", "loss")


# ---- a slow or failing sink --------------------------------------------------------------------

class BlockedSink:
    """Blocks in `log` until the test releases it (a W&B upload over a dead link)."""

    def __init__(self, cfg: SinkConfig) -> None:
        self.release, self.rows = BLOCKED["release"], BLOCKED["rows"]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.release.wait()
        self.rows.append(step)

    def close(self) -> None:
        pass


@pytest.fixture
def blocked():
    """A `BlockedSink`'s release event and the steps it wrote; released at the end whatever happens."""
    BLOCKED.update(release=threading.Event(), rows=[])
    yield BLOCKED
    BLOCKED["release"].set()


BLOCKED: dict = {}
SLOW_REGISTRY = {"jsonl": JsonlSink, "blocked": BlockedSink}


def test_a_slow_sink_never_holds_up_log_and_drops_what_it_cannot_queue(tmp_path, blocked):
    fanout = MetricsFanout(SinkConfig(str(tmp_path), queue_rows=2), ["blocked"], registry=SLOW_REGISTRY)
    for step in range(6):  # would hang here if a sink could hold up `log`
        fanout.log(step, {"time/step": 1.0})
    sink = fanout.sinks[0]
    assert not blocked["rows"] and sink.dropped >= 3  # at most one row in its hands and two queued
    blocked["release"].set()
    fanout.close()
    assert len(blocked["rows"]) == 6 - sink.dropped


def test_the_other_sinks_write_while_one_is_blocked(tmp_path, blocked):
    fanout = MetricsFanout(SinkConfig(str(tmp_path)), ["blocked", "jsonl"], registry=SLOW_REGISTRY)
    for step in range(6):
        fanout.log(step, {"time/step": 1.0})
    fanout.sinks[1].close()  # the JSONL sink writes everything and closes; the blocked one still waits
    assert [r["step"] for r in jsonl_rows(tmp_path)] == list(range(6)) and not blocked["rows"]
    blocked["release"].set()
    fanout.close()
    assert blocked["rows"] == list(range(6))


class FailingSink:
    def __init__(self, cfg: SinkConfig) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise ConnectionError("server went away")

    def close(self) -> None:
        raise ConnectionError("still away")


def test_a_failing_sink_is_turned_off_with_one_error_and_the_others_go_on(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="relax.utils.metrics_sinks")
    fanout = MetricsFanout(SinkConfig(str(tmp_path)), ["failing", "jsonl"],
                           registry={"jsonl": JsonlSink, "failing": FailingSink})
    for step in range(3):
        fanout.log(step, {"train/pg_loss": 0.5})
    fanout.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "metrics sink failing failed and is turned off" in errors[0]
    assert "ConnectionError: server went away" in errors[0]
    assert fanout.sinks[0].failed and not fanout.sinks[1].failed
    assert [r["step"] for r in jsonl_rows(tmp_path)] == [0, 1, 2]


def test_a_sink_that_cannot_start_is_turned_off_with_one_error(tmp_path, caplog):
    def broken(cfg: SinkConfig):
        raise RuntimeError("no credentials")

    fanout = MetricsFanout(SinkConfig(str(tmp_path)), ["broken", "jsonl"], registry={"jsonl": JsonlSink,
                                                                                       "broken": broken})
    fanout.log(0, {"time/step": 1.0})
    fanout.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "metrics sink broken could not start" in errors[0]
    assert [r["step"] for r in jsonl_rows(tmp_path)] == [0]


def test_an_unknown_sink_name_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="unknown metrics sinks"):
        MetricsFanout(SinkConfig(str(tmp_path)), ["jsonl", "prometheus"])


# ---- online or offline ---------------------------------------------------------------------------

def test_wandb_and_clearml_go_offline_without_credentials_and_follow_their_mode_variables(tmp_path, monkeypatch):
    from relax.utils.metrics_sinks import clearml_offline, wandb_mode

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no ~/clearml.conf
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "CLEARML_OFFLINE_MODE", "CLEARML_API_ACCESS_KEY",
                 "CLEARML_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert wandb_mode() == "offline" and clearml_offline()
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password k\n")
    (tmp_path / ".netrc").chmod(0o600)
    (tmp_path / "clearml.conf").write_text("api {}\n")
    assert wandb_mode() == "online" and not clearml_offline()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    assert wandb_mode() == "offline" and clearml_offline()


class TextSink:
    """Records what reaches it; shows text (`log_text`)."""

    seen: list = []

    def __init__(self, cfg):
        pass

    def log(self, step, metrics):
        TextSink.seen.append(("log", step, metrics))

    def log_text(self, step, entries):
        TextSink.seen.append(("text", step, entries))

    def close(self):
        pass


def test_text_entries_reach_the_sinks_that_show_text_and_no_others(tmp_path):
    TextSink.seen = []
    fanout = MetricsFanout(SinkConfig(str(tmp_path)), ["text", "jsonl"], registry={"text": TextSink,
                                                                                   "jsonl": JsonlSink})
    fanout.log(3, {"rollout/reward_mean": 0.5, "text/rollout/multi_turn/trajectories": "turn 1 ...",
                   "export/hf_path": "/ckpt/hf"})
    fanout.close()
    assert TextSink.seen == [("log", 3, {"rollout/reward_mean": 0.5}),
                             ("text", 3, {"text/rollout/multi_turn/trajectories": "turn 1 ..."})]
    assert jsonl_rows(tmp_path) == [{"step": 3, "rollout/reward_mean": 0.5}]  # the JSONL log stays numeric
    assert not any(s.failed for s in fanout.sinks)
