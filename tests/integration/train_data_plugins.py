"""A --custom-convert-samples-to-train-data-path plugin for the integration tests."""

from __future__ import annotations

import os


def mask_first_token(args, samples):
    """The default rows, except that every response's first token is masked out of the loss (the
    rest of each sample's mask is kept). Appends one line per call to <exp_dir>/convert_calls.txt."""
    with open(os.path.join(args.exp_dir, "convert_calls.txt"), "a") as f:
        f.write(f"{len(samples)}\n")
    return {"loss_masks": [[0] + list(s.loss_mask[1:]) for s in samples],
            "raw_reward": [0.0 for _ in samples]}  # a slime key no role here reads: dropped
