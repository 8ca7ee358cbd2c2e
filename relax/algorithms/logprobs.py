"""Response log-probs of one sequence, computed the same way by the engine and the trainer.

This is the numerics contract of `--true-on-policy-mode`: the rollout engine (after a request
finishes) and the training backend (old log-probs, the reference, and the training forward)
both score a response by calling `row_response_logits` + `token_log_probs` on ONE unpadded
row. Same function, same input shapes, same dtype (float32 logits), same temperature
scaling: given the same weights and the same torch thread count, the two processes produce
bitwise-identical log-probs, so the train/rollout log-prob mismatch is exactly 0 and the
first PPO ratio is exactly 1.

Why one row and no padding: a padded batch changes the shapes that reach the matmul and
attention kernels (and adds an attention mask, which selects a different SDPA kernel), and
CPU/GPU kernels pick their blocking and reduction order from the shapes, so a row scored in
a batch of 4 is not bitwise the row scored alone. Incremental decoding with a KV cache is a
different computation altogether. A one-row full forward is the smallest shared ground.

Why every position goes through the LM head: the head is a matmul over the rows it is given,
and the number of rows changes its blocking too (measured on the tiny Qwen3: 8 of 1,792 tokens
differ between a head over the last R + 1 positions and one over all of them). Computing the
head over the whole row makes a token's log-prob depend on the row alone, not on where the
"response" starts: the engine can score a finished multi-turn trajectory (or a prompt,
`logprob_start_len`) without knowing how the trainer splits it, and the two agree bitwise.
The cost is the head over the prompt positions as well (float32 logits [L, V] per row).

Log-prob convention (as the `hf` engine's sampler and SGLang):
`log_softmax(logits / temperature)[token]`, top-k/top-p filtering not applied; callers pass
temperature 1.0 for greedy decoding.

`model` is any callable with the transformers causal-LM signature
(`model(input_ids=..., use_cache=False, logits_to_keep=k).logits`); this module imports only torch.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def row_response_logits(model: Any, tokens: Sequence[int], response_length: int, temperature: float,
                        device: torch.device | str = "cpu", model_inputs: dict[str, Any] | None = None
                        ) -> torch.Tensor:
    """Temperature-scaled float32 logits that predict the last `response_length` tokens -> [R, V].

    One full forward of `tokens` (prompt + response) as a single row, no padding, no mask; every
    position goes through the LM head (module doc), the last R + 1 are kept. Row r of the result
    predicts response token r. Gradients flow when the caller enables them.
    `model_inputs`: more keyword arguments of the forward (a multimodal row's encoder tensors and
    position ids).
    """
    if not 0 <= response_length < len(tokens):
        raise ValueError(f"response_length must be in [0, {len(tokens) - 1}] for a {len(tokens)}-token row "
                         f"(the prompt needs at least one token), got {response_length}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (pass 1.0 for greedy decoding), got {temperature}")
    ids_1L = torch.tensor([list(tokens)], dtype=torch.long, device=device)
    logits_1LV = model(input_ids=ids_1L, use_cache=False, logits_to_keep=0, **(model_inputs or {})).logits
    return logits_1LV[0, -(response_length + 1):-1].float() / temperature  # [R, V]; row k predicts token L - R + k


def token_log_probs(logits_RV: torch.Tensor, targets_R: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """`log_softmax(logits_RV)[r, targets_R[r]]` -> [R] (logits already temperature-scaled)."""
    targets_R = torch.as_tensor(targets_R, dtype=torch.long, device=logits_RV.device)
    return torch.log_softmax(logits_RV, dim=-1).gather(-1, targets_R[:, None]).squeeze(-1)


def row_response_log_probs(model: Any, tokens: Sequence[int], response_length: int, temperature: float,
                           device: torch.device | str = "cpu", model_inputs: dict[str, Any] | None = None
                           ) -> torch.Tensor:
    """Log-probs of the last `response_length` tokens of `tokens` under `model` -> [R]."""
    logits_RV = row_response_logits(model, tokens, response_length, temperature, device, model_inputs)
    return token_log_probs(logits_RV, list(tokens)[len(tokens) - response_length:])
