"""Token log-probs and entropy from hidden states, without the [tokens, vocab] float32 logits.

The training forward needs, per response token, `log_softmax(h @ W.T / T)[target]` and (for
the entropy metric or bonus) the entropy of that distribution. Written plainly that is a
[N, V] logits tensor in the model's dtype, its float32 copy, a temperature-scaled copy and a
log-softmax: four [N, V] tensors kept for backward. With Qwen's 151,936-token vocabulary,
16 x 1024 tokens make 10 GB per copy, which is what ran an H100 out of memory at micro-batch 16.

`chunked_token_log_probs` goes over the N tokens in chunks of `chunk` rows: it multiplies a
chunk of hidden states by the output embedding, reduces it to the chunk's log-sum-exp, target
log-prob and entropy, and drops it. Backward does the same per chunk (recomputing the chunk's
logits from the saved hidden states, weight and log-sum-exp) and accumulates the gradients of
the hidden states and the weight. Peak extra memory is three [chunk, V] float32 tensors;
`auto_chunk` sizes a chunk to 1 GiB of float32 logits.

Numerics equal the plain computation's: the matmul runs in the inputs' dtype, everything after
it in float32 (as `logits.float()` then `log_softmax`), and the gradient of a log-prob and of
an entropy with respect to the scaled logits z are `onehot - p` and `-p * (log p - E_p[log p])`.

`fused=True` (the fsdp backend with `--use-torch-compile` on a GPU): the per-chunk work after
each matmul is two compiled functions (`_chunk_stats`: log-sum-exp, target log-prob and the
entropy metric; `_chunk_grad`: the logits' gradient in the model's dtype, used when no entropy
gradient is asked for), which read the chunk's logits in the model's dtype instead of making
float32 copies: on an H100 this elementwise work was two thirds of the head's time.
"""

from __future__ import annotations

import torch

AUTO_CHUNK_BYTES = 1 << 30  # float32 logits of one chunk (bigger chunks: fewer, larger matmuls)


def auto_chunk(vocab_size: int, chunk_bytes: int = AUTO_CHUNK_BYTES) -> int:
    """Tokens per chunk so one chunk's float32 logits take about `chunk_bytes`."""
    return max(1, chunk_bytes // (4 * max(vocab_size, 1)))


def _scaled_logits(hidden_CH: torch.Tensor, weight_VH: torch.Tensor, temperature: float) -> torch.Tensor:
    """Float32 `hidden @ weight.T / temperature` of a chunk (one new [C, V] tensor)."""
    z_CV = (hidden_CH @ weight_VH.T).float()
    return z_CV.div_(temperature) if temperature != 1.0 else z_CV


def _chunk_stats(z_CV: torch.Tensor, targets_C: torch.Tensor, temperature: float, with_entropy: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-sum-exp, target log-prob, entropy or None) of one chunk's unscaled logits, in float32."""
    z_CV = z_CV.float() / temperature
    lse_C = torch.logsumexp(z_CV, dim=-1)
    logp_C = z_CV.gather(1, targets_C[:, None]).squeeze(1) - lse_C
    if not with_entropy:
        return lse_C, logp_C, None
    logp_CV = z_CV - lse_C[:, None]
    return lse_C, logp_C, -(torch.exp(logp_CV) * logp_CV).sum(-1)


def _chunk_grad(z_CV: torch.Tensor, lse_C: torch.Tensor, targets_C: torch.Tensor, grad_logp_C: torch.Tensor,
                temperature: float) -> torch.Tensor:
    """d(sum grad_logp * logp[target]) / d(unscaled logits) = grad_logp * (onehot - p) / T, in z's dtype."""
    p_CV = torch.exp(z_CV.float() / temperature - lse_C[:, None])
    onehot_CV = torch.arange(z_CV.shape[1], device=z_CV.device)[None, :] == targets_C[:, None]
    return (grad_logp_C[:, None] * (onehot_CV.float() - p_CV) / temperature).to(z_CV.dtype)


_COMPILED: dict[str, object] = {}


def _fused(name: str):
    """`_chunk_stats` / `_chunk_grad`, compiled once per process (dynamic chunk lengths)."""
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile({"stats": _chunk_stats, "grad": _chunk_grad}[name], dynamic=True)
    return _COMPILED[name]


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor,
                temperature: float, chunk: int, with_entropy: bool, fused: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden_NH.shape[0]
        logp_N = hidden_NH.new_empty(n, dtype=torch.float32)
        lse_N = hidden_NH.new_empty(n, dtype=torch.float32)
        ent_N = hidden_NH.new_empty(n if with_entropy else 0, dtype=torch.float32)
        ctx.fused = fused
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            if fused:
                lse_N[s:e], logp_N[s:e], ent_C = _fused("stats")(hidden_NH[s:e] @ weight_VH.T, targets_N[s:e],
                                                                 temperature, with_entropy)
                if with_entropy:
                    ent_N[s:e] = ent_C
                continue
            z_CV = _scaled_logits(hidden_NH[s:e], weight_VH, temperature)
            lse_C = torch.logsumexp(z_CV, dim=-1)
            lse_N[s:e] = lse_C
            logp_N[s:e] = z_CV.gather(1, targets_N[s:e, None]).squeeze(1) - lse_C
            if with_entropy:
                logp_CV = z_CV.sub_(lse_C[:, None])  # in place: z is not needed any more
                ent_N[s:e] = -(logp_CV.exp() * logp_CV).sum(-1)
        ctx.save_for_backward(hidden_NH, weight_VH, targets_N, lse_N)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.set_materialize_grads(False)
        return logp_N, ent_N

    @staticmethod
    def backward(ctx, grad_logp_N: torch.Tensor | None, grad_ent_N: torch.Tensor | None):
        hidden_NH, weight_VH, targets_N, lse_N = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_logp_N is None and grad_ent_N is None) or not (want_h or want_w):
            return None, None, None, None, None, None, None
        n, temperature = hidden_NH.shape[0], ctx.temperature
        grad_h = torch.empty_like(hidden_NH) if want_h else None
        grad_w = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if want_w else None
        for s in range(0, n, ctx.chunk):
            e = min(s + ctx.chunk, n)
            if ctx.fused and grad_logp_N is not None and (grad_ent_N is None or not grad_ent_N.numel()):
                grad_z_CV = _fused("grad")(hidden_NH[s:e] @ weight_VH.T, lse_N[s:e], targets_N[s:e], grad_logp_N[s:e],
                                           temperature)
                if want_h:
                    grad_h[s:e] = grad_z_CV @ weight_VH
                if want_w:
                    grad_w += (grad_z_CV.T @ hidden_NH[s:e]).float()
                continue
            # The chunk's logits again (the saved log-sum-exp spares their reduction); then the
            # gradient with respect to the scaled logits, built in place in the p tensor:
            # d logp[target]/dz = onehot - p, dH/dz = -p (log p - E_p[log p]).
            logp_CV = _scaled_logits(hidden_NH[s:e], weight_VH, temperature).sub_(lse_N[s:e, None])
            p_CV = logp_CV.exp()
            coef_C = -grad_logp_N[s:e] if grad_logp_N is not None else torch.zeros_like(lse_N[s:e])
            if grad_ent_N is not None and grad_ent_N.numel():
                mean_C = (p_CV * logp_CV).sum(-1)
                coef_C = coef_C + grad_ent_N[s:e] * mean_C
                grad_z_CV = logp_CV.mul_(-grad_ent_N[s:e, None]).add_(coef_C[:, None]).mul_(p_CV)
            else:
                grad_z_CV = p_CV.mul_(coef_C[:, None])
            if grad_logp_N is not None:
                grad_z_CV.scatter_add_(1, targets_N[s:e, None], grad_logp_N[s:e, None])
            if temperature != 1.0:
                grad_z_CV.div_(temperature)
            grad_z_CV = grad_z_CV.to(hidden_NH.dtype)
            if want_h:
                grad_h[s:e] = grad_z_CV @ weight_VH
            if want_w:
                grad_w += (grad_z_CV.T @ hidden_NH[s:e]).float()
        return grad_h, grad_w.to(weight_VH.dtype) if want_w else None, None, None, None, None, None


def chunked_token_log_probs(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor, *,
                            temperature: float = 1.0, chunk: int | None = None, entropy: bool = False,
                            fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`log_softmax(hidden @ weight.T / temperature)[target]` -> float32 [N], and the entropy of
    each row's distribution -> [N] (None unless `entropy`), differentiable in `hidden_NH` and
    `weight_VH`. `chunk`: tokens per chunk (None or <= 0: `auto_chunk`). `fused`: the compiled
    per-chunk kernels (module doc; entropy keeps the eager path)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    chunk = chunk if chunk and chunk > 0 else auto_chunk(weight_VH.shape[0])
    logp_N, ent_N = _ChunkedLogProbs.apply(hidden_NH, weight_VH, targets_N.long(), float(temperature),
                                           int(chunk), bool(entropy), bool(fused))
    return logp_N, ent_N if entropy else None
