"""--notify-urls: real Apprise posting to a local HTTP endpoint (`json://127.0.0.1:<port>`): the
run's start, failure (with the error) and finish arrive; a bad URL is a configuration error; a
dead endpoint costs the run nothing."""

from __future__ import annotations

import time

import pytest

from relax.utils.notify import Notifier, check_urls


def test_start_failure_and_finish_reach_the_endpoint(alert_endpoint):
    url, received = alert_endpoint
    notifier = Notifier(url, run_name="exp-1")
    notifier.started({"mode": "colocate", "steps": 3})
    notifier.failed(RuntimeError("engine 0 died"))
    notifier.finished({"heldout": {"before": 0.25, "after": 0.75}})
    notifier.flush()
    titles = sorted(m["title"] for m in received)
    assert titles == ["[relax] exp-1: run failed", "[relax] exp-1: run finished", "[relax] exp-1: run started"]
    by_title = {m["title"].split(": ", 1)[1]: m for m in received}
    assert "RuntimeError: engine 0 died" in by_title["run failed"]["message"]
    assert by_title["run failed"]["type"] == "failure"
    assert "before=0.250 after=0.750" in by_title["run finished"]["message"]
    assert "mode: colocate" in by_title["run started"]["message"]


def test_a_bad_url_is_a_config_error_naming_it():
    from relax.config import parse_config
    from relax.config import ConfigError
    from relax.config.checks.outputs import check_notify

    assert check_urls(" json://a:1/x , ") == ["json://a:1/x"]
    with pytest.raises(ValueError, match="does not accept 'nosuchscheme://x'"):
        check_urls("json://a:1/x,nosuchscheme://x")
    cfg = parse_config(["--hf-checkpoint", "m", "--prompt-data", "d.jsonl", "--notify-urls", "nosuchscheme://x"],
                       validate=False)
    with pytest.raises(ConfigError, match="--notify-urls: Apprise does not accept 'nosuchscheme://x'"):
        check_notify(cfg)


def test_a_dead_endpoint_does_not_hold_the_run():
    notifier = Notifier("json://127.0.0.1:9/nobody", run_name="exp", timeout_s=5)  # port 9: nothing listens
    start = time.perf_counter()
    notifier.started({"mode": "colocate"})
    assert time.perf_counter() - start < 0.5  # sent from a thread
    notifier.flush()
    assert Notifier(None, run_name="exp").urls == []
