"""Epoch-based index order over an in-memory dataset, with a checkpointable position.

Epoch `e` visits indices `0..n-1` in order, or, with shuffling, in the permutation that
`random.Random(seed + e).shuffle` gives: the same order slime's `Dataset.shuffle` produces
(`random.seed(seed + e); random.shuffle(...)`), so a slime run and a Relax run with the same
seed see prompts in the same order. The position is `(epoch, offset)`; `take` crosses epoch
boundaries and can return more indices than one epoch holds.
"""

from __future__ import annotations

import random


def epoch_permutation(num_items: int, epoch: int, *, shuffle: bool, seed: int) -> list[int]:
    """The index order of one epoch."""
    order = list(range(num_items))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    return order


class EpochSampler:
    """Hands out dataset indices epoch after epoch; `state_dict()` is enough to resume exactly."""

    def __init__(self, num_items: int, *, shuffle: bool, seed: int) -> None:
        if num_items <= 0:
            raise ValueError("the prompt dataset is empty (after filtering); check --prompt-data, "
                             "--rollout-max-prompt-len and the skipped-row log")
        self.num_items = num_items
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = epoch_permutation(num_items, 0, shuffle=shuffle, seed=seed)

    def take(self, count: int) -> list[int]:
        """The next `count` indices, moving to the next epoch (new order) at each boundary."""
        indices: list[int] = []
        while len(indices) < count:
            if self.offset >= self.num_items:
                self._set_epoch(self.epoch + 1)
            step = min(count - len(indices), self.num_items - self.offset)
            indices.extend(self._order[self.offset: self.offset + step])
            self.offset += step
        return indices

    def _set_epoch(self, epoch: int) -> None:
        self.epoch, self.offset = epoch, 0
        self._order = epoch_permutation(self.num_items, epoch, shuffle=self.shuffle, seed=self.seed)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if not 0 <= offset <= self.num_items:
            raise ValueError(f"dataset position offset {offset} is outside [0, {self.num_items}]: the checkpoint "
                             "was written for a different dataset; point --load at the matching run")
        self._set_epoch(epoch)
        self.offset = offset
