"""Run fsdp and megatron ranks on a tiny Qwen2.5-VL, Qwen3-VL or Qwen3-Omni thinker and report what they computed (for
test_megatron_multimodal.py): the same pattern as `parity_cases.run`, on rows with images, a
video and text. `make_data` writes the model and the rows once; `run` (one process per rank)
scores them, trains one step, scores again, and reports the HF-named weights it would push and
which weights the step moved."""

from __future__ import annotations

import dataclasses

import json
import os

import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import ModelParallelSpec, TrainerSpec
from relax.components.training import step_plan
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.types import TrainBatch

CONTENTS = {"vl": ["<image>which cell is red?", "no image here", "<image>and this one<image>?", "<video>what moves?",
                   "plain text again", "<image>one more"],
            "omni": ["<audio>is the second tone higher?", "no media here", "<audio>and this one<image>?",
                     "<video>what moves?", "plain text again", "<image>one more"]}


def contents(kind: str) -> list[str]:
    return CONTENTS["omni" if "omni" in kind else "vl"]


def tone(rng):
    """A sine tone of 0.5-1.5 s at 16 kHz (float32), as the loader gives audio."""
    import numpy as np

    n = int(16000 * rng.uniform(0.5, 1.5))
    return (0.4 * np.sin(2 * np.pi * rng.uniform(200, 800) * np.arange(n) / 16000)).astype(np.float32)


def make_data(root: str, kind: str = "qwen2_5_vl") -> tuple[str, str]:
    """A tiny `kind` VL model (vocabulary padded to a multiple of 8: tensor parallelism splits it) and a
    batch of its rows (token ids with expanded media tokens, a response each, the encoder tensors
    as TransferQueue's bytes)."""
    import numpy as np
    from PIL import Image

    from relax.utils.multimodal import VideoConfig, VideoPipeline
    from relax.utils.multimodal.items import through_pipelines
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.multimodal.tensors import to_bytes
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_omni, build_tiny_vl

    tokenizer = train_chatml_tokenizer(["which cell is red? and this one no image here what moves is the second "
                                        "tone higher"] * 10, vocab_size=300)
    out = os.path.join(root, kind)
    model = (build_tiny_omni(tokenizer, out, vocab_multiple=8) if kind == "qwen3_omni" else
             build_tiny_vl(kind, tokenizer, out, vocab_multiple=8))
    processor = MultimodalProcessor(model)
    video = {"video": VideoPipeline(VideoConfig(min_tokens=4, max_tokens=8, patch_size=processor.video.patch_size))}
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(3)
    tokens, lengths, media = [], [], []
    for i, content in enumerate(contents(kind)):
        text = processor.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                       add_generation_prompt=True)
        items = {"image": [Image.fromarray(rng.integers(0, 256, (56, 84, 3), dtype=np.uint8))
                           for _ in range(content.count("<image>"))],
                 "video": [{"frames": list(rng.integers(0, 256, (8, 56, 56, 3), dtype=np.uint8)), "fps": 4}
                           for _ in range(content.count("<video>"))],
                 "audio": [tone(rng) for _ in range(content.count("<audio>"))]}
        encoded = processor.encode(text, through_pipelines({k: v for k, v in items.items() if v}, video))
        n = 3 + i % 3
        tokens.append(encoded.input_ids + torch.randint(3, 250, (n,), generator=g).tolist())
        lengths.append(n)
        media.append(to_bytes(encoded.tensors))
    data = os.path.join(root, f"{kind}-rows.pt")
    torch.save({"tokens": tokens, "lengths": lengths, "media": media}, data)
    return model, data


def run(rank: int, world_size: int, ports: list[int], cases: list, model: str, data: str, out: str) -> None:
    from relax.backends.trainer.trainer import Trainer

    rows = torch.load(data, weights_only=False)
    n = len(rows["tokens"])
    batch = TrainBatch(tokens_RL=rows["tokens"], response_lengths_R=rows["lengths"],
                       loss_masks_RT=[[1] * k for k in rows["lengths"]],
                       advantages_RT=[[(-1.0) ** i * 0.5 * (1 + i)] * k for i, k in enumerate(rows["lengths"])],
                       multimodal_train_inputs_RB=rows["media"])
    results = []
    for i, (backend, parallel) in enumerate(cases):
        spec = TrainerSpec(model_path=model, optim=OptimizerConfig(lr=1e-2, clip_grad=1.0),
                           batch=BatchConfig(micro_batch_size=3), loss=PolicyLossConfig(), threads=1,
                           model_parallel=ModelParallelSpec(**parallel))
        worker = Trainer(rank, world_size, "127.0.0.1", ports[i], dataclasses.replace(spec, backend=backend))
        info = worker.parallel_info()
        _, shards, tokens = step_plan(batch.loss_masks_RT, n, info["dp_size"])
        mine = batch.rows(shards[info["dp_rank"]])
        before = worker.compute_log_probs(mine.tokens_RL, mine.response_lengths_R, mine.multimodal_train_inputs_RB)
        blind = worker.compute_log_probs(mine.tokens_RL, mine.response_lengths_R)  # the same rows without media
        start = {name: t.clone() for name, t, _ in worker.runner.hf_state()}
        mine.old_log_probs_RT = before
        metrics = worker.train(mine, 1, tokens)
        after = worker.compute_log_probs(mine.tokens_RL, mine.response_lengths_R, mine.multimodal_train_inputs_RB)
        hf = {name: t.float() for name, t, _ in worker.runner.hf_state()}
        moved = sorted(name for name, t in hf.items() if name in start and not torch.equal(t, start[name].float()))
        if backend == "megatron":  # scripts/tools/convert_megatron_to_hf.py reads it back; --save-hf writes this
            worker.save(f"{out}-ckpt{i}", 0)
            worker.export_hf(f"{out}-hf{i}", model)
        worker.shutdown()
        results.append({"info": info, "rows": shards[info["dp_rank"]], "before": before, "after": after,
                        "blind": blind, "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
                        "hf": {k: v.tolist() for k, v in hf.items()} if rank == 0 else {}, "moved": moved,
                        "start": {k: v.float().tolist() for k, v in start.items()} if rank == 0 else {}})
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(results, f)


def receive(model: str, data: str, pushed: dict[str, list], port: int) -> dict:
    """A megatron scoring rank (ActorFwd's, fully async) takes HF-named weights (the fsdp trainer's
    after its step) through its weight receiver, then scores the rows; also what it says of a
    tensor the model does not have."""
    from relax.backends.trainer.trainer import Trainer
    from relax.distributed.weights.protocol import TensorSpec

    rows = torch.load(data, weights_only=False)
    spec = TrainerSpec(backend="megatron", model_path=model, trainable=False, optim=OptimizerConfig(), threads=1,
                       batch=BatchConfig(micro_batch_size=3))
    worker = Trainer(0, 1, "127.0.0.1", port, spec)
    try:
        receiver = worker.runner.weight_receiver()
        tensors = {name: torch.tensor(values) for name, values in pushed.items()}
        specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in tensors.items()]
        bad = receiver.problems([TensorSpec("model.visual.blocks.9.attn.qkv.weight", torch.float32, (3, 3)),
                                 TensorSpec("model.visual.patch_embed.proj.weight", torch.float32, (1, 2))])
        problems = receiver.problems(specs)
        receiver.load(specs, list(tensors.values()))
        ok, message = receiver.finish(1, "")
        scores = worker.compute_log_probs(rows["tokens"], rows["lengths"], rows["media"])
    finally:
        worker.shutdown()
    return {"problems": problems, "bad": bad, "finished": ok, "message": message, "scores": scores}
