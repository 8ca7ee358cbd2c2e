"""Shared pieces of the agentic tests: tiny checkpoints, an `hf` engine served in this process (its
real HTTP app in a uvicorn thread), a `Generator` on it, and a recorder of the /generate traffic.

The engine runs in-process so the tests can also drive it directly (bump its weight version
between turns) and score with an in-process trainer on the same thread count (true on-policy)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from relax.engine.agentic import episode_generate
from relax.engine.rollout.generator import Generator, StepState
from relax.engine.specs import AgenticSpec, PartialRolloutSpec, RolloutSpec, SamplingSpec
from relax.types import Sample
from relax.utils.net import free_port

TEMPERATURE = 0.8
WORDS = "what is the price of plum fig kiwi lookup item answer boxed tool call response zoom region colour"


def text_model(out_dir: str) -> str:
    """A tiny Qwen3 whose tokenizer has Qwen2.5's tool-call chat template."""
    from relax.utils.tiny_model import build_tiny_qwen3, save_tiny_model, train_chatml_tokenizer

    tokenizer = train_chatml_tokenizer([WORDS] * 20, vocab_size=300, tool_template=True)
    model = build_tiny_qwen3(tokenizer, hidden_size=32, num_layers=2, max_position_embeddings=512, seed=3)
    return save_tiny_model(model, tokenizer, out_dir)


def vl_model(out_dir: str) -> str:
    """A tiny Qwen2.5-VL with the same chat template (4..16 image tokens per image)."""
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_vl

    tokenizer = train_chatml_tokenizer([WORDS] * 20, vocab_size=300, tool_template=True)
    return build_tiny_vl("qwen2_5_vl", tokenizer, out_dir, hidden_size=32, vision_hidden=32, max_tokens=16, seed=3)


class EngineServer:
    """An `HFEngine` behind its real FastAPI app, served by uvicorn in a daemon thread."""

    def __init__(self, model_dir: str, **engine_kwargs: Any) -> None:
        import uvicorn

        from relax.backends.hf.engine import HFEngine
        from relax.backends.hf.server import create_app

        self.engine = HFEngine(model_dir, seed=0, **engine_kwargs)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.engine), host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            self.thread.join(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class FakeRewards:
    reward_key = None

    async def score(self, group: list[Sample]) -> None:
        for s in group:
            s.reward = 1.0 if "boxed" in s.response else 0.0


def generator(server: EngineServer, *, env: str | None, processor: Any = None, pipelines: Any = None,
              max_new_tokens: int = 6, short_turns: bool = True, n: int = 1, args: Any = None,
              partial: PartialRolloutSpec = PartialRolloutSpec(), custom: str | None = None,
              **agentic: Any) -> Generator:
    """A Generator on `server` whose environment module is `env` (agentic spec fields as keywords).
    `short_turns`: every token but the first ten ends a turn (a random model's turns end with
    "stop" after a token or two, as a trained one's end with <|im_end|>)."""
    vocab = server.engine.vocab_size
    sampling = SamplingSpec(temperature=TEMPERATURE, max_new_tokens=max_new_tokens,
                            stop_token_ids=tuple(range(10, vocab)) if short_turns else (),
                            max_context_len=server.engine.max_context_len)
    spec = RolloutSpec(batch_size=1, n_samples_per_prompt=n, sampling=sampling, seed=7, partial=partial,
                       custom_generate_path=custom, agentic=AgenticSpec(env_path=env, **agentic))
    return Generator(spec, tokenizer=server.engine.tokenizer, router_url=f"{server.url}/generate",
                     rewards=FakeRewards(), plugin_args=args, processor=processor, pipelines=pipelines,
                     episodes=episode_generate)


def prompt(text: str, index: int, **metadata: Any) -> Sample:
    return Sample(index=index, group_index=index, prompt=[{"role": "user", "content": text}], metadata=dict(metadata))


def run(coro: Any) -> Any:
    """Run `coro` on a fresh loop, closing this loop's HTTP session after it."""
    from relax.utils.http_utils import close_sessions

    async def main() -> Any:
        try:
            return await coro
        finally:
            await close_sessions()

    return asyncio.run(main())


def generate(gen: Generator, samples: list[Sample]) -> list[Sample]:
    """`samples` through the generator's per-sample path (resume included), concurrently."""
    step = StepState()

    async def go() -> list[Sample]:
        return list(await asyncio.gather(*(gen.generate_one(step, s) for s in samples)))

    return run(go())


@dataclass
class Traffic:
    """Every /generate payload and reply of the rollout (`install(monkeypatch)` wraps its `post`)."""

    calls: list[tuple[dict, dict]] = field(default_factory=list)
    rewrite: Any = None  # (payload, reply, index) -> reply: e.g. turn a reply into an abort

    def install(self, monkeypatch: Any) -> Traffic:
        from relax.engine.agentic import rollout as module

        real = module.post

        async def post(url: str, payload: dict, **kw: Any) -> Any:
            reply = await real(url, payload, **kw)
            if self.rewrite is not None:
                reply = self.rewrite(payload, reply, len(self.calls))
            self.calls.append((payload, reply))
            return reply

        monkeypatch.setattr(module, "post", post)
        return self

    def for_prompt(self, first_ids: list[int]) -> list[tuple[dict, dict]]:
        """The calls of the sample whose prompt starts with `first_ids` (requests in order)."""
        return [(p, r) for p, r in self.calls if p["input_ids"][:len(first_ids)] == first_ids]
