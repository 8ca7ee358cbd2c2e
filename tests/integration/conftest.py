"""One Ray cluster for the whole integration session, and a tiny model + task built once.

The model is a random-init tiny Qwen3 with its own BPE tokenizer (no hub); the data are
prompts of the quickstart task. Everything lives in a session temp dir.
"""

from __future__ import annotations

import json
import os
import random

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
    from relax.distributed import transfer_queue as tq

    tq.init_data_system()  # one data system for the session: each run attaches, clears it, leaves it
    yield
    from ray import serve

    tq.close_data_system()
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_setup(tmp_path_factory):
    from examples.tiny_math.task import make_row, sample_numbers, tokenizer_corpus
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    root = tmp_path_factory.mktemp("tiny")
    tokenizer = train_chatml_tokenizer(tokenizer_corpus(), vocab_size=300)
    save_tiny_model(build_tiny_qwen3(tokenizer), tokenizer, str(root / "model"))
    rng = random.Random(0)
    for name, n in (("train", 64), ("eval", 8)):
        with open(root / f"{name}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps(make_row(sample_numbers(rng))) + "\n")
    return root
