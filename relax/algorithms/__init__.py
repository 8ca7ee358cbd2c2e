"""Pure tensor math for GRPO-family RL post-training: advantages, KL, policy/value losses, reducers.

This package is a LEAF: it imports only the standard library and torch, never ray, relax.config
or any other part of relax. Backends (fsdp, megatron) and the Advantages role call these
functions; they never re-implement the math. Every named choice (advantage estimator, policy
loss, KL estimator, reducer) is resolved through one plain dict registry.

Shape-suffix legend used in every tensor name (``logprobs_BT``, ``rewards_GN``, ...):

    B   batch of sequences (one row per sampled response)
    T   response tokens, right-padded to the longest response in the batch
    G   groups (prompts); each group holds N responses to the same prompt
    N   samples per group (``--n-samples-per-prompt``)
    V   vocabulary

All [B, T] tensors are response-aligned (token t of row b is the t-th generated token) and come
with ``mask_BT`` (1 = token counts towards the loss, 0 = padding or a masked-out token such as
tool output). Groups are contiguous: group g is rows ``g*N .. g*N + N - 1``.

Submodules:

    advantages     GRPO / Dr.GRPO, GAE, REINFORCE++ (+ baseline), whitening, the ESTIMATORS
                   registry driven by one ``AdvantageInputs`` value.
    kl             k1 / k2 / k3 / low_var_kl estimators (``KL_ESTIMATORS``), unbiased KL.
    losses         per-token PPO clip (+ dual clip), GSPO, SAPO, clipped value loss, entropy,
                   TIS weights, OPSM mask; ``POLICY_LOSSES`` registry.
    reducers       per-sample-mean and per-token reductions normalised by GLOBAL batch size,
                   so sums over micro-batches and data-parallel ranks give the global mean.
    logprobs       one-row response log-probs shared by the hf engine and the fsdp trainer
                   (the numerics contract of ``--true-on-policy-mode``).
    policy_loss    ``compute_policy_loss(PolicyLossInputs, PolicyLossConfig) -> PolicyLossOutput``:
                   the single entry point a training backend calls per micro-batch.
    value_loss     ``compute_value_loss(ValueLossInputs, value_clip=...)``: the critic's clipped
                   value loss per micro-batch, reduced like the policy loss.
"""
