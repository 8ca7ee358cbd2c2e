"""Typed specs at the engine boundary, built once from the typed config groups.

The rollout side (generation, rewards, evaluation) takes these, not the flat `args`:
`SamplingSpec` (what goes into SGLang's `sampling_params`, plus the context limit),
`RewardSpec` (how samples are scored), `PartialRolloutSpec` (what happens to aborted
requests), `AgenticSpec` (multi-turn episodes: environment, turns, budgets) and `RolloutSpec`
(a rollout step: batch, group size, filters, seeds; with --use-rollout-routing-replay the MoE
`RoutingShape` whose routed experts each request asks for). An eval
dataset (`relax.config.eval_config.EvalDataset`, already fully resolved) derives its own
specs with `RolloutSpec.for_eval` / `RewardSpec.for_eval`: nothing is copied and mutated.
`args` survives only where user plugins are called with the seed's signatures.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from relax.config.eval_config import EvalDataset
from relax.config.role_plans import segments_train
from relax.config.schema import RelaxConfig, RewardConfig, RolloutConfig
from relax.utils.routing import RoutingShape

DATA_FLAGS = ("prompt_data", "hf_checkpoint", "input_key", "label_key", "metadata_key", "tool_key",
              "apply_chat_template", "apply_chat_template_kwargs", "system_prompt", "rollout_max_prompt_len",
              "multimodal_keys", "custom_prompt_path", "skip_malformed_rows", "use_streaming_dataset",
              "streaming_buffer_size", "rollout_shuffle", "rollout_seed", "prefetch_chunk_size",
              "prefetch_max_cached", "prefetch_num_workers", "n_samples_per_prompt", "buffer_filter_path",
              "save", "load", "image_min_token_num", "image_max_token_num", "image_resize_scale_factor",
              "video_min_token_num", "video_max_token_num", "video_fps", "video_fps_min_frames",
              "video_fps_max_frames", "frame_factor", "audio_sample_rate", "use_audio_in_video")


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = False
    max_context_len: int | None = None  # prompt + response tokens; None = the engine's own limit

    @classmethod
    def for_rollout(cls, r: RolloutConfig) -> SamplingSpec:
        return cls(temperature=r.rollout_temperature, top_p=r.rollout_top_p, top_k=r.rollout_top_k,
                   max_new_tokens=r.rollout_max_response_len, stop=tuple(r.rollout_stop or ()),
                   stop_token_ids=tuple(r.rollout_stop_token_ids or ()),
                   skip_special_tokens=r.rollout_skip_special_tokens, max_context_len=r.rollout_max_context_len)

    @classmethod
    def for_eval(cls, d: EvalDataset, skip_special_tokens: bool) -> SamplingSpec:
        return cls(temperature=d.temperature, top_p=d.top_p, top_k=d.top_k, max_new_tokens=d.max_response_len,
                   min_new_tokens=d.min_new_tokens, stop=tuple(d.stop or ()),
                   stop_token_ids=tuple(d.stop_token_ids or ()),
                   skip_special_tokens=skip_special_tokens, max_context_len=d.max_context_len)

    def params(self) -> dict[str, Any]:
        """SGLang `sampling_params` (responses keep their stop string: the trainer sees every token)."""
        params: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                                  "max_new_tokens": self.max_new_tokens,
                                  "skip_special_tokens": self.skip_special_tokens, "no_stop_trim": True}
        if self.stop:
            params["stop"] = list(self.stop)
        if self.stop_token_ids:
            params["stop_token_ids"] = list(self.stop_token_ids)
        if self.min_new_tokens:
            params["min_new_tokens"] = self.min_new_tokens
        return params


@dataclass(frozen=True)
class PartialRolloutSpec:
    """The three partial-rollout flags; `enabled=False` leaves aborted samples as they came back."""

    enabled: bool = False
    max_aborted_count: int | None = None
    mask_offpolicy: bool = False

    @classmethod
    def from_config(cls, r: RolloutConfig) -> PartialRolloutSpec:
        return cls(enabled=r.partial_rollout, max_aborted_count=r.partial_rollout_max_aborted_count,
                   mask_offpolicy=r.mask_offpolicy_in_partial_rollout)


@dataclass(frozen=True)
class AgenticSpec:
    """A multi-turn episode's rules (relax.engine.agentic; the flags of `AgenticConfig`).

    `env_path` None: no environment configured (a custom generate function may name its own).
    `true_on_policy`: rescore a finished multi-request sample once, whole (docs/agentic.md).
    `template_kwargs`: --apply-chat-template-kwargs, also used to render observations.
    `agent_path`: a black-box agent (--agent-function-path) generates through the gateway on
    `gateway_host`, each episode within `agent_timeout` seconds; `tools_in_prompt`: requests' tools
    rendered by the chat template (docs/agents.md); `constrain_tool_calls`: each model turn asks the
    engine for the tool-call constraint of the sample's tools (docs/agentic.md)."""

    env_path: str | None = None
    max_turns: int = 5
    env_timeout: float = 60.0
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    turn_reward: str = "final"
    true_on_policy: bool = False
    log_trajectories: bool = False
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    agent_path: str | None = None
    agent_timeout: float = 300.0
    gateway_host: str = "127.0.0.1"
    tools_in_prompt: bool = True
    constrain_tool_calls: bool = False  # every model turn's tool calls made to parse (tool_calls.py)
    train_segments: bool = False  # --agent-segments resolved: an episode's prior segments are rows too

    @classmethod
    def from_values(cls, v: Any) -> AgenticSpec:
        """From anything with the flags as attributes: the config's groups or the plugin `args`."""
        return cls(env_path=v.rollout_interaction_env_path, max_turns=v.max_turns, env_timeout=v.env_timeout,
                   stop=tuple(v.multi_turn_stop or ()), max_tokens=v.multi_turn_max_tokens,
                   turn_reward=v.turn_reward, true_on_policy=v.true_on_policy_mode,
                   log_trajectories=v.log_multi_turn,
                   template_kwargs=tuple(sorted((v.apply_chat_template_kwargs or {}).items())),
                   agent_path=v.agent_function_path, agent_timeout=v.agent_timeout, gateway_host=v.agent_gateway_host,
                   tools_in_prompt=v.agent_tools_in_prompt,
                   constrain_tool_calls=v.multi_turn_constrain_tool_calls,
                   train_segments=segments_train(v.agent_segments, v.advantage_estimator, v.kl_coef))

    @classmethod
    def from_config(cls, cfg: RelaxConfig) -> AgenticSpec:
        flat = {**dataclasses.asdict(cfg.agentic), "true_on_policy_mode": cfg.cluster.true_on_policy_mode,
                "log_multi_turn": cfg.logging.log_multi_turn,
                "apply_chat_template_kwargs": cfg.data.apply_chat_template_kwargs,
                "advantage_estimator": cfg.algo.advantage_estimator, "kl_coef": cfg.algo.kl_coef}
        return cls.from_values(SimpleNamespace(**flat))


@dataclass(frozen=True)
class RewardSpec:
    """How samples are scored: a custom plugin wins, else the built-in type (per row or the flag)."""

    rm_type: str | None = None
    custom_rm_path: str | None = None
    reward_key: str | None = None
    group_rm: bool = False
    rm_url: str | None = None
    timeout: float = 60.0
    num_workers: int = 2
    max_concurrency: int = 64
    failure_value: float = 0.0
    judge: Any = None  # relax.engine.rewards.genrm.JudgeSpec when a GenRM role is deployed
    http_proxy: str | None = None  # --http-proxy: the way to a remote reward service (remote_rm)

    @classmethod
    def from_config(cls, r: RewardConfig, judge: Any = None, http_proxy: str | None = None) -> RewardSpec:
        return cls(rm_type=r.rm_type, custom_rm_path=r.custom_rm_path, reward_key=r.reward_key, group_rm=r.group_rm,
                   rm_url=r.rm_url, timeout=r.reward_timeout, num_workers=r.reward_num_workers,
                   max_concurrency=r.reward_max_concurrency, failure_value=r.reward_failure_value, judge=judge,
                   http_proxy=http_proxy)

    def for_eval(self, d: EvalDataset) -> RewardSpec:
        """The dataset's reward key; its rm_type (when set) replaces the run's reward plugin."""
        if d.rm_type:
            return dataclasses.replace(self, rm_type=d.rm_type, custom_rm_path=None, group_rm=False,
                                       reward_key=d.reward_key)
        return dataclasses.replace(self, reward_key=d.reward_key)

    @property
    def scorer(self) -> tuple:
        """What decides a score (two specs with the same scorer can share one executor)."""
        return (self.rm_type, self.custom_rm_path, self.reward_key, self.group_rm)


@dataclass(frozen=True)
class DataSpec:
    """What the default data source reads (one attribute per data flag, same names).

    Data sources are plugins constructed as `cls(args)` (the seed's signature), so this spec is
    taken from the run's plugin `args`, once, in the data source's constructor."""

    prompt_data: Any
    hf_checkpoint: str | None
    input_key: str
    label_key: str | None
    metadata_key: str
    tool_key: str
    apply_chat_template: bool
    apply_chat_template_kwargs: dict
    system_prompt: str | None
    rollout_max_prompt_len: int | None
    multimodal_keys: dict | None
    custom_prompt_path: str | None
    skip_malformed_rows: bool
    use_streaming_dataset: bool
    streaming_buffer_size: int
    rollout_shuffle: bool
    rollout_seed: int
    prefetch_chunk_size: int
    prefetch_max_cached: int
    prefetch_num_workers: int
    n_samples_per_prompt: int
    buffer_filter_path: str | None
    save: str | None  # where the data position is checkpointed
    load: str | None
    image_min_token_num: int | None  # the image pipeline (relax.utils.multimodal.ImageConfig)
    image_max_token_num: int | None
    image_resize_scale_factor: int | None
    # The video and audio pipelines: with the image flags, the model's processor's pipelines that
    # measure multimodal prompts for --rollout-max-prompt-len (relax.utils.data.formatting.MediaLength).
    video_min_token_num: int | None
    video_max_token_num: int | None
    video_fps: float | None
    video_fps_min_frames: int | None
    video_fps_max_frames: int | None
    frame_factor: int | None
    audio_sample_rate: int | None
    use_audio_in_video: bool

    @classmethod
    def from_args(cls, args: Any) -> DataSpec:
        missing = [name for name in DATA_FLAGS if not hasattr(args, name)]
        if missing:
            raise TypeError(f"the data source needs the run's args (every flag); this one lacks {missing}")
        return cls(**{name: getattr(args, name) for name in DATA_FLAGS})


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout call of the default rollout function."""

    batch_size: int  # prompt groups to keep
    n_samples_per_prompt: int
    sampling: SamplingSpec
    seed: int = 42
    over_sampling_batch_size: int | None = None
    dynamic_filter_path: str | None = None
    custom_generate_path: str | None = None
    http_timeout: float = 600.0
    evaluation: bool = False
    partial: PartialRolloutSpec = PartialRolloutSpec()
    agentic: AgenticSpec = AgenticSpec()
    routing: RoutingShape | None = None  # R3: the model's routing record shape (relax.engine.rollout.routing)

    @classmethod
    def from_config(cls, cfg: RelaxConfig) -> RolloutSpec:
        r = cfg.rollout
        return cls(batch_size=r.rollout_batch_size, n_samples_per_prompt=r.n_samples_per_prompt,
                   sampling=SamplingSpec.for_rollout(r), seed=cfg.data.rollout_seed,
                   over_sampling_batch_size=r.over_sampling_batch_size,
                   dynamic_filter_path=r.dynamic_sampling_filter_path,
                   custom_generate_path=r.custom_generate_function_path, http_timeout=r.http_timeout,
                   partial=PartialRolloutSpec.from_config(r), agentic=AgenticSpec.from_config(cfg),
                   routing=rollout_routing(cfg))

    def for_eval(self, d: EvalDataset, num_prompts: int) -> RolloutSpec:
        """The whole dataset in one call: its sampling, group size and generate function; no
        dynamic sampling or over-sampling."""
        return dataclasses.replace(
            self, batch_size=num_prompts, n_samples_per_prompt=d.n_samples_per_eval_prompt,
            sampling=SamplingSpec.for_eval(d, self.sampling.skip_special_tokens), over_sampling_batch_size=None,
            dynamic_filter_path=None, custom_generate_path=d.custom_generate_function_path, evaluation=True,
            routing=None)


def rollout_routing(cfg: RelaxConfig) -> RoutingShape | None:
    """--use-rollout-routing-replay: the routing shape of --hf-checkpoint (validation made sure it is MoE)."""
    if not cfg.algo.use_rollout_routing_replay:
        return None
    from relax.config.checks.inputs import hf_config

    return RoutingShape.from_config(hf_config(cfg.ckpt.hf_checkpoint))
