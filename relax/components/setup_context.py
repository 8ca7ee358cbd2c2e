"""What the roles' `setup` publish for the roles set up after them, in plan order.

The Controller starts with an empty `SetupContext` and hands it through every role's
`setup(ctx) -> ctx` in the plan's deploy order; a role returns it with what it publishes filled
in (`dataclasses.replace`), and reads what the roles before it published. A typed record instead
of a dict of strings: a reader can see who publishes what, and who reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.utils.checkpoints import ResumePoint


@dataclass(frozen=True)
class SetupContext:
    # GenRM: its router's URL, for the Rollout's `genrm` reward.
    genrm_url: str | None = None
    # Actor: the first rollout step to run, and the checkpoint the run resumes from (its parts are
    # the other roles' to load: the Rollout's data position, the Critic's weights).
    start_rollout_id: int = 0
    resume: ResumePoint | None = None
    # Rollout: prompts in the training data (the run's length when --num-rollout is unset).
    num_prompts: int = 0
    # Critic: the step of the checkpoint it loaded (None: fresh).
    critic_loaded_rollout_id: int | None = None
