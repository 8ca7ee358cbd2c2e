"""Partial rollout: a request a weight update aborted is resumed on the new weights, not lost.

With `--partial-rollout` (fully-async only) every weight push pauses the engines in "abort"
mode: each in-flight request is answered at once with finish_reason "abort" and the tokens it
had generated so far. The Rollout then resubmits the sample with prompt + partial response as
the input and only the remaining token budget (`max_new_tokens` minus what it has); the engine
queues the request until the push ends, so the continuation runs on the new weights. The reply
is appended to the sample (`sglang_rollout.apply_output`): tokens, log-probs, loss-mask entries
and the segment's weight version, so `weight_versions` lists every version the response saw.

Per abort (`record_abort`):
  - `abort_count += 1`, which also moves the sample's seed (`sample_seed`), so each segment has
    its own reproducible random stream;
  - with `--mask-offpolicy-in-partial-rollout` every token generated so far gets loss_mask 0:
    in the end only the last segment — one weight version, the newest — is trained on.

`--partial-rollout-max-aborted-count N`: the engine cannot refuse a pause, so no request can be
exempted from an abort. What the cap guarantees instead is that the sample still completes:
after N counted aborts it is resumed on every further abort as before (its tokens are kept
and only the rest of its budget is asked for, so it always finishes), but those aborts are no
longer counted — `abort_count` stays at N, the seed stops moving, and they are reported as
`rollout/partial_aborts_over_cap`. Masking still applies to them: which tokens are off-policy
does not depend on counting. (In fully-async mode at most `--max-staleness` pushes land while
one step generates, so a sample is aborted at most that many times anyway.)

Why the trained row's version stays a lower bound: each segment reports its own version, and
`transfer_queue.row_version` takes the minimum of them and the step's start version.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Awaitable, Callable

from relax.engine.specs import PartialRolloutSpec
from relax.types import Sample

STAT_KEYS = ("rollout/partial_aborts", "rollout/partial_aborts_over_cap", "rollout/partial_resumed_samples",
             "rollout/partial_resumed_tokens", "rollout/partial_offpolicy_masked_tokens")


def is_resuming(sample: Sample) -> bool:
    """An aborted sample's next request continues its response instead of starting over."""
    return sample.status == Sample.Status.ABORTED


def resume_request(sample: Sample, prompt_ids: list[int], params: dict[str, Any]
                   ) -> tuple[list[int], dict[str, Any] | None]:
    """(input_ids, sampling params) for the sample's next request.

    Fresh sample: the prompt and `params` as given. Aborted sample: prompt + partial response
    (`sample.tokens`) and the budget left (`max_new_tokens` / `min_new_tokens` minus the tokens
    it has); params None when nothing is left to generate."""
    if not is_resuming(sample):
        return list(prompt_ids), params
    generated = sample.response_length
    params = dict(params)
    if params.get("max_new_tokens") is not None:
        left = int(params["max_new_tokens"]) - generated
        if left <= 0:
            return list(sample.tokens), None
        params["max_new_tokens"] = left
    if params.get("min_new_tokens"):
        params["min_new_tokens"] = max(0, int(params["min_new_tokens"]) - generated)
    return list(sample.tokens), params


def record_abort(sample: Sample, cfg: PartialRolloutSpec, stats: Counter[str], *, first: bool) -> None:
    """Book one abort of `sample` before it is resubmitted: count it (up to the cap), mask the
    tokens generated so far when asked, and add to the step's stats (`first`: its first abort)."""
    if cfg.max_aborted_count is None or sample.abort_count < cfg.max_aborted_count:
        sample.abort_count += 1
    else:
        stats["rollout/partial_aborts_over_cap"] += 1
    stats["rollout/partial_aborts"] += 1
    stats["rollout/partial_resumed_samples"] += int(first)
    stats["rollout/partial_resumed_tokens"] += sample.response_length
    if cfg.mask_offpolicy and sample.loss_mask:
        stats["rollout/partial_offpolicy_masked_tokens"] += sum(1 for m in sample.loss_mask if m)
        sample.loss_mask = [0] * len(sample.loss_mask)


async def resume_until_done(sample: Sample, regenerate: Callable[[Sample], Awaitable[Sample]],
                            cfg: PartialRolloutSpec, stats: Counter[str]) -> Sample:
    """Resubmit `sample` (`await regenerate(sample)`) for as long as it comes back aborted.

    It terminates: every resubmission keeps the tokens generated so far and asks only for the
    rest of the budget, and a step's generation sees at most `--max-staleness` weight pushes."""
    if not cfg.enabled:
        return sample
    first = True
    while is_resuming(sample):
        record_abort(sample, cfg, stats, first=first)
        first = False
        sample = await regenerate(sample)
    return sample


def partial_metrics(stats: Counter[str]) -> dict[str, float]:
    """The step's partial-rollout metrics (every key, zeros included), and `stats` cleared."""
    out = {key: float(stats.get(key, 0)) for key in STAT_KEYS}
    stats.clear()
    return out
