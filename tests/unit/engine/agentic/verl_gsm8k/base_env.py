"""The environment interface of Relax's multi-turn rollout, for this example and its copies.

The verl migration guide's "Migrate tool environment" step copies this file next to a new env
module (`from examples.<algo>.base_env import BaseInteractionEnv`); it re-exports the framework's
class, so a copy stays in step with the rollout that calls it (docs/agentic.md).
"""

from relax.engine.agentic.env import BaseInteractionEnv, Observation

__all__ = ["BaseInteractionEnv", "Observation"]
