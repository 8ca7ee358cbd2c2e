"""One Trainer rank on the fsdp runner in-process (world size 1, gloo): log-prob passes, a training
step, metrics, the streamed pass, checkpoints."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed.ray.actor_group import free_port
from relax.types import TrainBatch


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("m")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    from relax.backends.trainer.trainer import Trainer

    spec = TrainerSpec(model_path=str(path), optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=2),
                       loss=PolicyLossConfig(), threads=1)
    w = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    yield w
    w.shutdown()


def batch() -> TrainBatch:
    tokens = [[1, 2, 3, 4, 5], [1, 2, 6, 7], [3, 4, 5, 6, 7, 8]]
    lengths = [2, 2, 3]
    return TrainBatch(tokens_RL=tokens, response_lengths_R=lengths, loss_masks_RT=[[1] * n for n in lengths],
                      advantages_RT=[[1.0] * 2, [-1.0] * 2, [0.5] * 3])


def log_probs(worker, b: TrainBatch) -> list[list[float]]:
    return worker.compute_log_probs(b.tokens_RL, b.response_lengths_R)


def test_log_probs_match_a_plain_forward(worker):
    b = batch()
    got = log_probs(worker, b)
    model = worker.runner.model
    for toks, n, lp in zip(b.tokens_RL, b.response_lengths_R, got):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([toks], device=worker.device)).logits[0, :-1].cpu()
        ref = torch.log_softmax(logits.float(), -1)[torch.arange(len(toks) - n - 1, len(toks) - 1),
                                                     torch.tensor(toks[-n:])]
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-5)


def test_log_probs_chunk_size_chunks_the_output_layer_with_the_same_numbers(worker, monkeypatch):
    from relax.backends.fsdp import head

    chunks = []

    def recorded(*args, chunk, **kwargs):
        chunks.append(chunk)
        return chunked_token_log_probs(*args, chunk=chunk, **kwargs)

    chunked_token_log_probs = head.chunked_token_log_probs
    monkeypatch.setattr(head, "chunked_token_log_probs", recorded)
    whole = log_probs(worker, batch())  # --log-probs-chunk-size -1 (the default): auto-sized chunks
    spec = worker.runner.spec
    monkeypatch.setattr(worker.runner, "spec", dataclasses.replace(
        spec, batch=dataclasses.replace(spec.batch, log_probs_chunk_size=2)))
    unchunked_calls = len(chunks)
    chunked = log_probs(worker, batch())
    assert set(chunks[:unchunked_calls]) == {-1} and set(chunks[unchunked_calls:]) == {2}  # a call per micro-batch
    for a, b in zip(whole, chunked):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)


def test_first_step_has_unit_ratio_and_reports_rollout_mismatch(worker):
    b = batch()
    b.old_log_probs_RT = log_probs(worker, b)
    b.rollout_log_probs_RT = [[x - 0.25 for x in lp] for lp in b.old_log_probs_RT]
    metrics = worker.train(b, 1, [7])
    assert metrics["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["pg_clipfrac"] == 0.0
    assert metrics["train_rollout_logprob_abs_diff_mean"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["grad_norm"] > 0
    assert metrics["compute_seconds"] > 0


def test_streamed_pass_equals_the_whole_shard_pass(worker):
    """The fully-async streaming loader (train_begin / train_rows in any order / train_end) runs
    the same micro-batches in the same order as `train`, so metrics and weights match exactly."""
    import copy

    b = batch()
    b.tokens_RL.append([2, 3, 4, 5, 6])
    b.response_lengths_R.append(2)
    b.loss_masks_RT.append([1, 1])
    b.advantages_RT.append([-0.5, -0.5])
    b.old_log_probs_RT = log_probs(worker, b)
    saved = (copy.deepcopy(worker.runner.model.state_dict()), copy.deepcopy(worker.optimizer.state_dict()),
             copy.deepcopy(worker.scheduler.state_dict()), worker.step)

    def restore():
        worker.runner.model.load_state_dict(copy.deepcopy(saved[0]))
        worker.optimizer.load_state_dict(copy.deepcopy(saved[1]))
        worker.scheduler.load_state_dict(copy.deepcopy(saved[2]))
        worker.step = saved[3]

    def params():
        return [p.detach().clone() for p in worker.runner.model.parameters()]

    whole = worker.train(b, 2, [4, 4])
    after_whole = params()
    restore()
    worker.train_begin([len(t) for t in b.tokens_RL], 2, [4, 4])
    ran = []
    for rows in ([3], [1, 2], [0]):  # late rows first: nothing can run until row 0 is in
        ran.append(worker.train_rows(rows, b.rows(rows)))
    streamed = worker.train_end()
    assert ran == [0, 0, 2]  # 2 optimizer steps of 2 rows, micro_batch_size 2: one micro-batch each
    whole.pop("compute_seconds"), streamed.pop("compute_seconds")
    if worker.device.type == "cpu":  # bitwise; CUDA kernels may reduce in another order between two runs
        assert streamed == whole
        assert all(torch.equal(a, b) for a, b in zip(params(), after_whole))
    else:
        same = lambda m: {k: v for k, v in m.items() if not k.startswith("memory/")}  # noqa: E731 (allocator state)
        assert same(streamed) == pytest.approx(same(whole), rel=1e-4, abs=1e-6)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params(), after_whole))


def test_train_end_names_rows_never_sent(worker):
    b = batch()
    b.old_log_probs_RT = log_probs(worker, b)
    worker.train_begin([len(t) for t in b.tokens_RL], 1, [7])
    worker.train_rows([0], b.rows([0]))
    with pytest.raises(RuntimeError, match="2 row"):
        worker.train_end()



def test_an_offloaded_rank_checkpoints_exports_and_pushes(worker, tmp_path):
    """Colocate offloads the ranks between steps (their storages freed: `offload.HostStash`); a
    checkpoint, an HF export or a weight gather at that point must see the real state, and leave
    the rank offloaded. Found on GPUs: --save-hf after the last colocate step read freed memory."""
    with torch.no_grad():  # CPU weights loaded from safetensors are memory-mapped (not resizable); GPU ones are
        for p in worker.runner.model.parameters():
            p.data = p.data.clone()
    before = {n: p.detach().clone() for n, p in worker.runner.model.named_parameters()}
    worker._stash_state()  # what `offload` does on a GPU rank
    assert all(p.untyped_storage().nbytes() == 0 for p in worker.runner.model.parameters())
    worker.save(str(tmp_path / "ckpt"), 3)
    worker.export_hf(str(tmp_path / "hf"), worker.spec.model_path)
    assert worker.stash.stashed  # offloaded again after each call
    worker.stash.onload()
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert all(torch.equal(p, before[n]) for n, p in exported.named_parameters() if n in before)
    worker._stash_state()
    meta = worker.load(str(tmp_path / "ckpt"))
    worker.stash.onload()
    assert meta["rollout_id"] == 3
    assert all(torch.equal(p, before[n]) for n, p in worker.runner.model.named_parameters())
