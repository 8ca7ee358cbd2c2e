"""The fsdp backend's response head: the chunked log-prob head swapped in for an HF model's
output embedding for one forward, so no `[B, L, V]` logits are ever built
(`relax.algorithms.chunked_logprobs`)."""

from __future__ import annotations

import torch

from relax.algorithms.chunked_logprobs import chunked_token_log_probs


class ResponseHead:
    """Context manager: for one forward, `head` (the model's output embedding, a Linear without
    bias) returns `[B, T, 2]` = (log-prob, entropy) of the response tokens instead of `[B, L, V]`
    logits. Row b's token t is read at hidden position `index_BT[b, t]` and predicts
    `targets_BT[b, t]`; masked-out slots are 0."""

    def __init__(self, head: torch.nn.Module, index_BT: torch.Tensor, mask_BT: torch.Tensor,
                 targets_BT: torch.Tensor, *, temperature: float, chunk: int | None, entropy: bool,
                 entropy_grad: bool, fused: bool = False):
        if getattr(head, "bias", None) is not None:
            raise ValueError("the chunked log-prob head needs an output layer without bias")
        self.head, self.index_BT, self.mask_BT, self.targets_BT = head, index_BT, mask_BT.bool(), targets_BT
        self.temperature, self.chunk, self.entropy, self.entropy_grad = temperature, chunk, entropy, entropy_grad
        self.fused = fused

    def forward(self, hidden_BLH: torch.Tensor) -> torch.Tensor:
        b, length, h = hidden_BLH.shape
        rows_B1 = torch.arange(b, device=hidden_BLH.device)[:, None] * length
        hidden_NH = hidden_BLH.reshape(b * length, h)[(rows_B1 + self.index_BT)[self.mask_BT]]
        logp_N, ent_N = chunked_token_log_probs(hidden_NH, self.head.weight, self.targets_BT[self.mask_BT],
                                                temperature=self.temperature, chunk=self.chunk,
                                                entropy=self.entropy, fused=self.fused)

        def scatter(values_N: torch.Tensor) -> torch.Tensor:
            return values_N.new_zeros(self.mask_BT.shape).index_put((self.mask_BT,), values_N)

        ent_BT = scatter(ent_N if self.entropy_grad else ent_N.detach()) if ent_N is not None \
            else torch.zeros_like(self.mask_BT, dtype=torch.float32)
        return torch.stack([scatter(logp_N), ent_BT], dim=-1)

    def __enter__(self) -> "ResponseHead":
        self.head.forward = self.forward  # the instance attribute shadows the class's forward
        return self

    def __exit__(self, *exc: object) -> None:
        del self.head.forward
