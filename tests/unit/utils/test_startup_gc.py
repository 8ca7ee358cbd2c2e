"""relax/utils/startup_gc.py: full collections held back from `import relax` to `started()` in the
processes a run starts (RELAX_STARTUP_GC=1 from configs/env.yaml), and nowhere else; there the collection at
exit is skipped."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from relax.core.service import env_file_vars
from relax.utils import startup_gc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _python(code: str, env: dict[str, str]) -> str:
    """`code` in a fresh interpreter (its first `import relax` is what defers), its stdout."""
    base = {k: v for k, v in os.environ.items() if k != startup_gc.ENV}
    out = subprocess.run([sys.executable, "-c", code], env=base | env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_run_hands_the_variable_to_its_processes():
    assert env_file_vars()[startup_gc.ENV] == "1"


def test_importing_relax_defers_full_collections_until_started():
    code = ("import gc; b = gc.get_threshold(); import relax; from relax.utils import startup_gc as s; "
            "a = gc.get_threshold(); d = s.deferred(); s.started(); print(b, a, d, gc.get_threshold(), s.deferred())")
    code_default = "import gc; print(gc.get_threshold())"
    python = _python(code_default, {})  # a fresh interpreter's own thresholds
    young, middle, _ = python.strip("()").split(", ")
    assert _python(code, {startup_gc.ENV: "1"}) == \
        f"{python} ({young}, {middle}, {startup_gc.DEFERRED_OLDEST}) True {python} False"
    assert _python(code, {startup_gc.ENV: "0"}) == f"{python} {python} False {python} False"  # 0 or unset: untouched
    assert _python(code, {}) == f"{python} {python} False {python} False"


def test_a_process_with_the_variable_skips_the_collection_at_exit():
    """`gc.freeze` runs after the exit handlers registered after `import relax` (the process's own,
    Ray's shutdown), and before finalization: its full collection then has nothing to scan."""
    code = ("import atexit, gc; atexit.register(lambda: print(gc.get_freeze_count() > 0)); import relax; "
            "atexit.register(lambda: print(gc.get_freeze_count()))")
    assert _python(code, {startup_gc.ENV: "1"}).split() == ["0", "True"]
    assert _python(code, {startup_gc.ENV: "0"}).split() == ["0", "False"]


def test_thresholds_someone_else_set_are_left_alone():
    # set before relax is imported: not deferred; set while deferred: started() keeps them
    before = ("import gc; gc.set_threshold(500, 5, 2000); import relax; from relax.utils import startup_gc as s; "
              "print(s.deferred(), gc.get_threshold())")
    assert _python(before, {startup_gc.ENV: "1"}) == "False (500, 5, 2000)"
    during = ("import gc, relax; from relax.utils import startup_gc as s; gc.set_threshold(900, 9, 9); "
              "s.started(); print(s.deferred(), gc.get_threshold())")
    assert _python(during, {startup_gc.ENV: "1"}) == "False (900, 9, 9)"


def test_a_role_replica_ends_the_deferral_when_its_constructor_returns():
    code = ("import relax; from relax.utils import startup_gc as s; from relax.core.service import replica_class\n"
            "class Role:\n    def __init__(self): self.deferred_inside = s.deferred()\n"
            "r = replica_class(Role, 'role')(); print(r.deferred_inside, s.deferred())")
    assert _python(code, {startup_gc.ENV: "1"}) == "True False"


def test_a_training_rank_ends_the_deferral_once_built(tmp_path, monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.utils.net import free_port

    Qwen3ForCausalLM(Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, head_dim=8)).save_pretrained(tmp_path)
    monkeypatch.setenv(startup_gc.ENV, "1")
    was = gc.get_threshold()  # (tests/conftest.py raised this worker's oldest threshold: CPython's for the test)
    gc.set_threshold(700, 10, 10)
    try:
        assert startup_gc.defer() and gc.get_threshold()[2] == startup_gc.DEFERRED_OLDEST
        worker = Trainer(0, 1, "127.0.0.1", free_port(), TrainerSpec(model_path=str(tmp_path), trainable=False,
                                                                     threads=1))
        worker.shutdown()
        assert not startup_gc.deferred() and gc.get_threshold() == (700, 10, 10)
    finally:
        startup_gc.started()
        gc.set_threshold(*was)
