"""The rollout plugin API of the seeds (Relax/slime signatures), on top of `Generator`.

- `generate_rollout(args, rollout_id, data_source, evaluation=False)`: the default
  `--rollout-function-path`. The Rollout role runs its `Generator` directly when this is the
  configured function; a custom rollout function may call it too (it then runs with a fresh
  `StepState`: no progress bar, no streaming of groups).
- `generate(args, sample, sampling_params, evaluation=False)`: the default single-turn generate,
  for custom generate functions that want one plain turn.
- `GenerateState(args).tokenizer`: the tokenizer, as the seed's custom-generate example uses it
  (with `args.sglang_router_ip` / `args.sglang_router_port` for the router).

`args` is the namespace the Rollout hands to plugins; the Rollout binds it to its `Generator`
(`bind`), so these functions use the run's generator, router and rewards. Nothing else in the
project reads per-step or runtime state from `args`.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from relax.engine.rollout.generator import Generator, StepState, parse_weight_version  # noqa: F401 (plugin API)
from relax.engine.rollout.prompt_encoding import encode_prompt
from relax.types import Sample

_BOUND: dict[int, Generator] = {}


def bind(args: Any, generator: Generator) -> None:
    """Plugins called with `args` reach `generator` through the functions of this module."""
    _BOUND[id(args)] = generator
    weakref.finalize(args, _BOUND.pop, id(args), None)


def bound_generator(args: Any) -> Generator:
    generator = _BOUND.get(id(args))
    if generator is None:
        raise RuntimeError("these rollout helpers work on the `args` the Relax Rollout hands to plugins (it binds "
                           "them to the run's generator); call them from a rollout/generate plugin with that args")
    return generator


async def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
                           ) -> list[list[Sample]]:
    """The default rollout function (see `Generator.rollout`)."""
    return await bound_generator(args).rollout(StepState(), rollout_id, data_source)


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False) -> Sample:
    """The default single-turn generate (see `Generator.generate`)."""
    return await bound_generator(args).generate(sample, sampling_params)


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class GenerateState:
    """`GenerateState(args).tokenizer`: the run's tokenizer (the seed's plugin API); `.processor`:
    a multimodal run's `MultimodalProcessor` (None otherwise); `.encode(sample)`: the prompt's
    ids and media request fields as the default generate makes them; `.media(sample)`: a
    `MediaContext` for multi-turn image carry-over (`relax.utils.multimodal.turns`)."""

    def __init__(self, args: Any) -> None:
        self.args = args
        generator = _BOUND.get(id(args))
        self.tokenizer = generator.tokenizer if generator is not None else _tokenizer(args.hf_checkpoint)
        self.processor = generator.processor if generator is not None else None
        self.pipelines = generator.pipelines if generator is not None else None

    def encode(self, sample: Sample) -> tuple[list[int], dict[str, Any]]:
        return encode_prompt(self.tokenizer, self.processor, sample, self.pipelines)

    def media(self, sample: Sample) -> Any:
        from relax.utils.multimodal.turns import MediaContext

        return MediaContext(self.processor, sample, self.pipelines) if self.processor is not None else None
