"""Multi-turn true on-policy with image observations: a tiny Qwen2.5-VL, an environment whose
observation is a zoomed crop of the prompt's image (the image joins the sample's media and its
encoder tensors, MediaContext); every response token's log-prob from the engine equals the
trainer's (which gets the rows' tensors as TransferQueue carries them), bitwise."""

from __future__ import annotations

from collections import Counter

import pytest
from agentic_helpers import TEMPERATURE, EngineServer, generate, generator, vl_model

from relax.types import Sample


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory) -> str:
    return vl_model(str(tmp_path_factory.mktemp("agentic-vl") / "model"))


@pytest.fixture(scope="module")
def vl_engine(vl_dir):
    server = EngineServer(vl_dir, rl_on_policy_target="fsdp", dtype="float32")
    yield server
    server.close()


def image_prompt(index: int):
    import numpy as np
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(index).integers(0, 256, size=(112, 112, 3), dtype=np.uint8))
    content = [{"type": "image", "image": image}, {"type": "text", "text": "what colour" + " is it" * index}]
    return Sample(index=index, group_index=index, prompt=[{"role": "user", "content": content}],
                  multimodal_inputs={"image": [image]}, metadata={"mode": "image"})


def test_true_on_policy_with_image_observations_is_exact(vl_dir, vl_engine, one_thread):
    from relax.algorithms.policy_loss import PolicyLossConfig
    from relax.backends.base import TrainerSpec
    from relax.backends.trainer.trainer import Trainer
    from relax.config.schema import BatchConfig, OptimizerConfig
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.multimodal.tensors import to_bytes
    from relax.utils.net import free_port

    processor = MultimodalProcessor(vl_dir, vl_engine.engine.tokenizer)
    gen = generator(vl_engine, env="agentic_envs", processor=processor, max_turns=3, true_on_policy=True)
    done = generate(gen, [image_prompt(i) for i in range(3)])
    for s in done:  # the prompt's image and one crop per observation, in order
        assert s.metadata["turns"] == 3 and s.metadata["rescored"] is True
        assert len(s.multimodal_inputs["image"]) == 3
        assert s.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 8, 8], [1, 4, 4], [1, 4, 4]]
    spec = TrainerSpec(model_path=vl_dir, optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=4),
                       loss=PolicyLossConfig(), temperature=TEMPERATURE, threads=1, true_on_policy=True)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        scored = worker.compute_log_probs([s.tokens for s in done], [s.response_length for s in done],
                                          [to_bytes(s.multimodal_train_inputs) for s in done])
    finally:
        worker.shutdown()
    differ = Counter(a != b for s, row in zip(done, scored) for a, b in zip(s.rollout_log_probs, row))
    assert differ[True] == 0 and differ[False] == sum(s.response_length for s in done) > 150
