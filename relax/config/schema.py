"""Typed config groups. Every field is a flat CLI flag named as in the seed configuration
reference (`docs/configuration.md`), with the seed's default.

Internal code takes the group it needs (`cfg.rollout`, `cfg.optim`); the flat `args`
namespace (`RelaxConfig.args`) exists only for plugins written against Relax/slime.
Every group is frozen: validation returns a new config with the derived values filled in
(`RelaxConfig.replace`), nothing is written in place. Choices are `Literal` annotations (or a
registry's names, `relax.config.choices`: the reward types), checked at parse time; the
command line and `--custom-config-path` YAML go through the same coercion (`fields.coerce`).
Fields marked `supported=False` are accepted for script compatibility; setting them to a
non-default value fails validation with a message, so nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from relax.config.agentic import AgenticConfig
from relax.config.elastic import ElasticConfig
from relax.config.engine_profile import EngineProfileConfig
from relax.config.lora import LoraConfig
from relax.config.choices import REWARD_TYPES, parse_rm_type
from relax.config.fields import opt, parse_bool, parse_bytes, parse_json
from relax.config.megatron_arch import MEGATRON_ONLY, MegatronArchConfig
from relax.config.observability import DebugConfig, LoggingConfig, TrainProfileConfig
from relax.config.router import RouterConfig
from relax.config.train_memory import TrainMemoryConfig

TrainBackend = Literal["megatron", "fsdp", "auto"]
RolloutBackend = Literal["sglang", "hf", "auto"]
AdvantageEstimator = Literal["grpo", "gspo", "sapo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                             "on_policy_distillation"]
KlType = Literal["k1", "k2", "k3", "low_var_kl"]
TRAIN_BACKENDS, ROLLOUT_BACKENDS = get_args(TrainBackend), get_args(RolloutBackend)
ADVANTAGE_ESTIMATORS, KL_TYPES = get_args(AdvantageEstimator), get_args(KlType)
# --genrm-sampling-config keys and their defaults (seed configuration reference).
GENRM_SAMPLING_DEFAULTS: dict[str, float | int] = {"temperature": 0.1, "top_p": 1.0, "top_k": -1,
                                                   "max_response_len": 4096}


@dataclass(frozen=True)
class ClusterConfig:
    resource: dict | None = opt(None, "Roles to deploy as JSON {role: [replicas, gpus]}; on CPU the second number "
                                "is the number of worker processes (actor) or engines (rollout).", type=parse_json)
    colocate: bool = opt(False, "Colocate (sync) mode: rollout and training take turns on the same devices.")
    fully_async: bool = opt(False, "Fully asynchronous pipeline: Rollout, Actor, ActorFwd, Reference and "
                                   "Advantages run concurrently, rollout at most --max-staleness steps ahead "
                                   "(docs/fully-async.md).")
    offload: bool = opt(False, "Same as --offload-train --offload-rollout.")
    offload_train: bool | None = opt(None, "Move the training ranks' parameters, gradients and optimizer state to the "
                                     "host while the engines generate (on by default with --colocate on GPUs; "
                                     "--no-offload-train keeps them on the GPU).")
    offload_rollout: bool | None = opt(None, "Engines release weights and KV cache while the trainer runs (on by "
                                       "default with --colocate; --no-offload-rollout keeps them).")
    rollout_num_gpus_per_engine: int = opt(1, "GPUs per inference engine: SGLang's tensor parallel size (tp_size) "
                                           "with --rollout-backend sglang; an hf engine runs on one GPU (more is an "
                                           "error); unused on CPU.")
    num_gpus_per_node: int = opt(8, "GPUs per node.", ignored="placement is by --resource per role and Ray's view of "
                                 "the cluster; a per-node GPU count is not used")
    distributed_backend: str = opt("nccl", "torch.distributed backend of the training ranks on GPUs (gloo is used "
                                   "on CPU).")
    distributed_timeout_minutes: int = opt(10, "Timeout of training collectives, minutes.")
    num_data_storage_units: int = opt(1, "TransferQueue SimpleStorage units.")
    max_staleness: int = opt(0, "Fully async: rollout step k starts only once the engines hold weight version "
                                "k - N; every trained row lags at most N versions (0 = on-policy, equals colocate). "
                                "Colocate takes 0 or 1, both on-policy (the seeds' scripts write 1).")
    polling_mode: bool = opt(True, "Poll TransferQueue metadata: a consumer asking for more ready rows than exist "
                             "gets none at once and asks again (every consumer here streams this way). false, "
                             "TransferQueue's blocking fetch, is refused (checks/rollout_tools.py says why).",
                             type=parse_bool)
    num_iters_per_train_update: int = opt(1, "Passes over each step's batch (PPO epochs; the old log-probs stay "
                                          "those of the step's first pass), in both modes.")
    ref_actor_config: dict | None = opt(None, "JSON overrides for the Reference/ActorFwd services: "
                                        "tensor/pipeline/context_parallel_size, sequence_parallel (megatron), "
                                        "max_tokens_per_gpu, only_load_weight, threads (CPU torch threads).",
                                        type=parse_json)
    train_backend: TrainBackend = opt("auto", "Training backend; auto = megatron when megatron-core is installed "
                                      "and a GPU is visible, else fsdp (the choice is logged). megatron also runs "
                                      "on CPU when asked for (gloo, float32; docs/backends/megatron.md).")
    rollout_backend: RolloutBackend = opt("auto", "Inference backend; auto = sglang when it is installed and a GPU "
                                          "is visible, else hf (the choice and the reason are logged; "
                                          "docs/backends/sglang.md).")
    qkv_format: Literal["thd", "bshd"] = opt("thd", "Megatron rows: thd packed, bshd padded.", ignored=MEGATRON_ONLY)
    megatron_to_hf_mode: Literal["raw", "bridge"] = opt("raw", "Megatron<->HF weight conversion.",
                                                        ignored=MEGATRON_ONLY)
    true_on_policy_mode: bool = opt(False, "True on-policy: rollout log-probs are bitwise equal to the trainer's "
                                    "(the engine rescores each finished response as the trainer does: one unpadded "
                                    "float32 row), so on-policy the PPO ratio is exactly 1. fsdp + hf only; costs one "
                                    "extra forward per response (docs/true-on-policy.md).")
    ray_address: str | None = opt(None, "Ray cluster to join (default: $RAY_ADDRESS, else start a local one).")
    ray_num_cpus: int | None = opt(None, "Logical CPUs for a locally started Ray (default: max(8, cores)).")
    cluster: dict | None = opt(None, "With --dry-run: plan for a cluster this machine is not part of, as JSON "
                               "{\"nodes\": N, \"gpus_per_node\": G, \"cpus_per_node\": C}: backends as there "
                               "(GPU packages assumed installed), per-node placement and the same fit checks "
                               "(docs/launch.md).", type=parse_json)
    engine_threads: int = opt(1, "Torch threads per CPU engine process, and per training rank in fully async mode "
                              "(CPU runs only); in colocate mode the training-backend ranks (actor, reference, "
                              "critic) split every core between them while they run, since the engines wait "
                              "meanwhile (with --true-on-policy-mode they use this count, as the engines do). "
                              "Both wait with OMP_WAIT_POLICY=PASSIVE unless the environment (or "
                              "--train-env-vars) sets it.")


@dataclass(frozen=True)
class CheckpointConfig:
    hf_checkpoint: str | None = opt(None, "HF checkpoint: tokenizer, architecture and initial weights.")
    ref_load: str | None = opt(None, "Reference model checkpoint (initial actor weights when --load is unset).")
    ref_ckpt_step: int | None = opt(None, "Reference checkpoint step: --ref-load is then a checkpoint directory "
                                    "(iter_XXXXXXX, as --save writes) and the Reference loads step N's weights over "
                                    "--hf-checkpoint's model; the Actor starts from --hf-checkpoint (or --load).")
    load: str | None = opt(None, "Actor checkpoint directory to resume from.")
    load_fallback: bool = opt(False, "When the latest checkpoint under --load is incomplete (a save that did not "
                                     "finish), resume from the newest complete one before it instead of refusing.")
    save: str | None = opt(None, "Directory to save checkpoints to.")
    save_interval: int | None = opt(None, "Save every N rollout steps.")
    save_hf: str | None = opt(None, "Also export an HF model here (may contain {rollout_id}).")
    async_save: bool = opt(False, "Asynchronous checkpoint saving: the ranks copy their state to the host and "
                           "training goes on while it is written; the checkpoint becomes the latest once written "
                           "(a failed write is raised at the next save or at the end).")
    no_save_optim: bool = opt(False, "Do not save optimizer state.")
    rotate_ckpt: bool = opt(False, "Save every step, keeping the latest and the --save-interval ones (at most "
                            "--max-actor-ckpt-to-keep of those); needs --save and --save-interval.")
    max_actor_ckpt_to_keep: int | None = opt(None, "Keep at most N actor checkpoints (oldest deleted).")
    checkpoint_engine_backend: str = opt("nccl", "Weight-sync transport backend (gloo is used on CPU).")
    critic_load: str | None = opt(None, "Critic checkpoint directory to resume from (ppo); default <--load>/critic. "
                                  "Without a checkpoint there the critic starts from --hf-checkpoint plus a new "
                                  "value head.")
    critic_save: str | None = opt(None, "Directory for critic checkpoints (ppo), saved with the actor's; "
                                  "default <--save>/critic.")


@dataclass(frozen=True)
class DataConfig:
    prompt_data: Any = opt(None, "Training prompts (.jsonl/.parquet, or a JSON list of paths).")
    input_key: str = opt("input", "Row key of the prompt.")
    label_key: str | None = opt(None, "Row key of the label.")
    metadata_key: str = opt("metadata", "Row key of the metadata dict.")
    tool_key: str = opt("tools", "Row key of the tools passed to the chat template.")
    apply_chat_template: bool = opt(False, "Format message-list prompts with the tokenizer's chat template.")
    apply_chat_template_kwargs: dict = opt(None, "Extra chat-template kwargs (JSON).", type=parse_json,
                                           default_factory=dict)
    system_prompt: str | None = opt(None, "System message inserted before the prompt.")
    rollout_shuffle: bool = opt(False, "Shuffle prompts every epoch.")
    rollout_seed: int = opt(42, "Seed for prompt shuffling and sampling.")
    use_streaming_dataset: bool = opt(False, "Stream the dataset instead of loading it into memory.")
    streaming_buffer_size: int = opt(10000, "Shuffle buffer of the streaming dataset.")
    prefetch_chunk_size: int = opt(32, "Rows handed to the prefetch workers per round (streaming dataset with "
                                   "--multimodal-keys).")
    prefetch_max_cached: int = opt(256, "Most prefetched rows (media loaded) held ahead of use; the prefetch thread "
                                   "waits when full. 0 = no prefetching (media loaded when a row is taken).")
    prefetch_num_workers: int = opt(1, "Threads loading/decoding media in the prefetch buffer.")
    custom_prompt_path: str | None = opt(None, "Dotted path fn(prompt, data) -> prompt.")
    data_source_path: str = opt("relax.engine.rollout.data_source.RolloutDataSourceWithBuffer",
                                "Rollout data source class.")
    start_rollout_id: int | None = opt(None, "First rollout step (default: from --load).")
    multimodal_keys: dict | None = opt(None, "Multimodal column mapping (JSON).", type=parse_json)
    skip_malformed_rows: bool = opt(False, "Skip (and count) malformed data rows instead of failing.")
    # Media pipelines (relax.utils.multimodal; docs/multimodal.md). None = the seed's default.
    use_audio_in_video: bool = opt(False, "Each video's audio track is heard with its frames, their tokens "
                                   "interleaved by time (Omni models; docs/multimodal.md).")
    image_max_token_num: int | None = opt(None, "Most vision tokens per image (default 16384): the rollout resizes "
                                          "each image to within [min, max] tokens x (patch x merge)^2 pixels of the "
                                          "model before its processor sees it (docs/multimodal.md).")
    image_min_token_num: int | None = opt(None, "Fewest vision tokens per image (default 4).")
    video_min_token_num: int | None = opt(None, "Fewest vision tokens per video frame (default 128): the rollout "
                                          "sizes each video's frames within [min, max] tokens x (patch x merge)^2 "
                                          "pixels of the model (docs/multimodal.md).")
    video_max_token_num: int | None = opt(None, "Most vision tokens per video frame (default 768).")
    video_fps: float | None = opt(None, "Frames per second sampled from videos (default 2.0).")
    video_fps_min_frames: int | None = opt(None, "Fewest frames sampled per video (default 4).")
    video_fps_max_frames: int | None = opt(None, "Most frames sampled per video (default 768).")
    image_resize_scale_factor: int | None = opt(None, "Side alignment of the image pre-resize (default: the "
                                                "model's patch_size * spatial_merge_size, 28 for Qwen2.5-VL; 0 = no "
                                                "alignment).")
    audio_sample_rate: int | None = opt(None, "Audio is resampled to this rate as it loads (default 16000), and a "
                                        "bare waveform array is taken to be at it; the model's processor then "
                                        "resamples to its feature extractor's rate (docs/multimodal.md).")
    frame_factor: int | None = opt(None, "Sampled frame counts are multiples of this (default 2).")
    mm_processor_pool_size: int = opt(0, "Processes that encode multimodal prompts (decode, resize, patchify) "
                                      "beside the rollout's event loop; 0 = a worker thread per prompt "
                                      "(docs/multimodal.md).")


@dataclass(frozen=True)
class RolloutConfig:
    num_rollout: int | None = opt(None, "Number of rollout steps.")
    num_epoch: int | None = opt(None, "Epochs over the prompt data (sets --num-rollout when it is unset).")
    rollout_batch_size: int | None = opt(None, "Prompts per rollout step (required).")
    n_samples_per_prompt: int = opt(1, "Responses per prompt (group size).")
    rollout_temperature: float = opt(1.0, "Sampling temperature.")
    rollout_top_p: float = opt(1.0, "Top-p.")
    rollout_top_k: int = opt(-1, "Top-k (-1 = off).")
    rollout_max_response_len: int | None = opt(None, "Max new tokens per response (default: the context length, "
                                               "--rollout-max-context-len or the model's max_position_embeddings, "
                                               "minus --rollout-max-prompt-len).")
    rollout_max_prompt_len: int | None = opt(None, "Drop prompts longer than this (tokens).")
    rollout_max_context_len: int | None = opt(None, "Engine context length: prompt + response tokens; a response "
                                              "is cut to fit (<= the model's max_position_embeddings).")
    rollout_stop: list | None = opt(None, "Stop strings.", nargs="+")
    rollout_stop_token_ids: list | None = opt(None, "Stop token ids.", nargs="+", type=int)
    rollout_skip_special_tokens: bool = opt(False, "Skip special tokens when decoding responses.")
    over_sampling_batch_size: int | None = opt(None, "Groups drawn and generated per sampling round (>= "
                                               "--rollout-batch-size; default: the rollout batch size); kept groups "
                                               "beyond the batch go back to the data source as prompts.")
    dynamic_sampling_filter_path: str | None = opt(None, "Group filter fn(args, samples) -> bool | "
                                                   "DynamicFilterOutput, e.g. "
                                                   "relax.engine.filters.dynamic_sampling_filters."
                                                   "check_reward_nonzero_std (DAPO).")
    buffer_filter_path: str | None = opt(None, "Buffer filter fn(args, rollout_id, buffer, num_samples).")
    partial_rollout: bool = opt(False, "Fully async: requests a weight push aborts are resumed on the new weights "
                                "from their partial response instead of being lost (docs/partial-rollout.md).")
    partial_rollout_max_aborted_count: int | None = opt(None, "Aborts counted per sample (abort_count, seed); "
                                                        "later aborts are still resumed, so the sample always "
                                                        "completes (default: no cap).")
    mask_offpolicy_in_partial_rollout: bool = opt(False, "Partial rollout: tokens generated before a sample's last "
                                                  "abort (older weights) get loss_mask 0.")
    update_weight_buffer_size: int = opt(512 << 20, "Weight-sync bucket size in bytes (e.g. 512MB).",
                                         type=parse_bytes)
    update_weights_interval: int = opt(1, "Colocate: the engines take the actor's weights every N steps (rows "
                                       "then lag up to N - 1 versions; the first push always goes).")
    weight_sync_timeout: float = opt(120.0, "Deadline of one weight sync, seconds.")
    rollout_external: bool = opt(False, "Use engines already running elsewhere (SGLang's HTTP API, at "
                                 "--rollout-external-engine-addrs) instead of launching them: they receive weights and "
                                 "are never launched or stopped by Relax (docs/rollout.md).")
    rollout_external_engine_addrs: list | None = opt(None, "The external engines as host:port, one per engine "
                                                     "(with --rollout-external).", nargs="+")
    sglang_router_ip: str | None = opt(None, "Address of an already-running router (with --sglang-router-port): "
                                       "generate requests go there, Relax starts none and registers the engines it "
                                       "launches with it. Default: Relax starts its built-in router.")
    sglang_router_port: int | None = opt(None, "Port of the router at --sglang-router-ip.")
    rollout_function_path: str = opt("relax.engine.rollout.sglang_rollout.generate_rollout",
                                     "Rollout function fn(args, rollout_id, data_source, evaluation=False).")
    custom_generate_function_path: str | None = opt(None, "Generate fn(args, sample, sampling_params[, evaluation]).")
    rollout_data_postprocess_path: str | None = opt(None, "fn(args, rollout_id, rollout_data) run by the Actor on "
                                                    "each step's columns before training (e.g. to edit loss_masks; "
                                                    "colocate mode).")
    custom_rollout_log_function_path: str | None = opt(
        None, "fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool, called with each step's "
        "samples; True skips the default sample statistics (a dict: logged instead of them; docs/observability.md).")
    custom_eval_rollout_log_function_path: str | None = opt(
        None, "fn(rollout_id, args, data, extra_metrics) -> bool, called after each evaluation with data = {set: "
        "{rewards, truncated, samples}}; True skips the default eval statistics (a dict: logged instead of them).")
    engine_startup_timeout: float = opt(300.0, "Seconds to wait for an engine to become healthy.")
    http_timeout: float = opt(600.0, "Timeout of one generate request, seconds.")


@dataclass(frozen=True)
class BatchConfig:
    global_batch_size: int | None = opt(None, "Samples per optimizer step.")
    micro_batch_size: int = opt(1, "Samples per micro-batch (ignored with --use-dynamic-batch-size).")
    num_steps_per_rollout: int | None = opt(None, "Optimizer steps per rollout (sets --global-batch-size).")
    use_dynamic_batch_size: bool = opt(False, "Pack micro-batches up to --max-tokens-per-gpu tokens.")
    max_tokens_per_gpu: int | None = opt(None, "Token budget of a dynamic micro-batch, counted padded: rows x "
                                         "its longest row (what the right-padded forward holds).")
    log_probs_max_tokens_per_gpu: int | None = opt(None, "Token budget for log-prob passes (counted as "
                                                   "--max-tokens-per-gpu's).")
    log_probs_chunk_size: int = opt(-1, "Tokens per chunk of the output layer in every fsdp forward: log-probs "
                                    "and entropy are computed chunk by chunk from the hidden states, never as "
                                    "[tokens, vocab] logits; -1 sizes a chunk to 1 GiB of float32 logits.")
    balance_data: bool = opt(False, "Split each optimizer step's rows over the data-parallel ranks so their token "
                             "counts are about equal (Karmarkar-Karp, equal row counts; groups stay in their step).")


@dataclass(frozen=True)
class ParallelConfig:
    tensor_model_parallel_size: int = opt(1, "Tensor parallel size (megatron).", ignored=MEGATRON_ONLY)
    pipeline_model_parallel_size: int = opt(1, "Pipeline parallel size (megatron).", ignored=MEGATRON_ONLY)
    sequence_parallel: bool = opt(False, "Sequence parallel (megatron).", ignored=MEGATRON_ONLY)
    context_parallel_size: int = opt(1, "Context parallel size (megatron).", ignored=MEGATRON_ONLY)
    expert_model_parallel_size: int = opt(1, "Expert parallel size (megatron).", ignored=MEGATRON_ONLY)
    expert_tensor_parallel_size: int = opt(1, "Expert tensor parallel size (megatron).", ignored=MEGATRON_ONLY)
    recompute_granularity: Literal["full", "selective"] | None = opt(
        None, "Activation recomputation: full keeps only each decoder layer's input and recomputes the layer in "
        "backward (fsdp: per-layer checkpointing). selective is Megatron's (attention core only): an error with fsdp.")
    recompute_method: Literal["uniform", "block"] | None = opt(
        None, "With --recompute-granularity full: uniform recomputes every layer; block only the first "
        "--recompute-num-layers layers (fsdp).")
    use_torch_compile: bool = opt(False, "On GPUs (fsdp and megatron): compile each decoder layer with torch.compile "
                                  "(fuses the norms, RoPE and activations; the first steps compile; a megatron MoE "
                                  "layer's expert block stays uncompiled). Off on CPU.")
    recompute_num_layers: int | None = opt(None, "Layers recomputed with --recompute-method block (all layers when "
                                           "unset); with uniform, Megatron's layers per recompute unit (fsdp "
                                           "recomputes per layer).")


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = opt(1e-6, "Learning rate.")
    min_lr: float = opt(0.0, "Minimum learning rate of the decay schedule.")
    lr_warmup_iters: int = opt(0, "Linear warm-up steps.")
    lr_decay_style: Literal["constant", "linear", "cosine"] = opt("constant", "LR schedule.")
    lr_decay_iters: int | None = opt(None, "Steps of the decay (default: all steps).")
    optimizer: Literal["adam", "adamw", "sgd"] = opt("adam", "Optimizer of every trained model (fsdp and megatron): "
                                                     "adam and adamw are AdamW (decoupled weight decay, as "
                                                     "Megatron's adam); sgd is SGD with momentum 0.9 (Megatron's "
                                                     "--sgd-momentum default).")
    weight_decay: float = opt(0.0, "Weight decay.")
    adam_beta1: float = opt(0.9, "Adam beta1.")
    adam_beta2: float = opt(0.999, "Adam beta2.")
    adam_eps: float = opt(1e-8, "Adam epsilon.")
    clip_grad: float = opt(1.0, "Gradient clipping by global norm (0 = off).")
    seed: int = opt(1234, "Random seed.")
    optimizer_cpu_offload: bool = opt(False, "Keep the optimizer's state (pinned float32 copies of the optimized "
                                      "weights, Adam's moments) on the host and step it there: gradients go device->"
                                      "host and updated weights back every step (megatron's HybridDeviceOptimizer; "
                                      "both backends; with --use-distributed-optimizer each rank offloads its shard).")
    overlap_cpu_optimizer_d2h_h2d: bool = opt(False, "With --optimizer-cpu-offload: copy gradients down and weights "
                                              "up chunk by chunk on side CUDA streams, so a chunk's CPU step overlaps "
                                              "the next chunk's copies (on a CPU the copies are plain copies).")
    use_precision_aware_optimizer: bool = opt(False, "Adam's moments stored in bfloat16, computed in float32 over "
                                              "float32 weights: 4 bytes per weight saved (optimizer/moments_saved_gib; "
                                              "megatron's precision-aware optimizer with bf16 moments; both backends; "
                                              "adam/adamw).")
    use_distributed_optimizer: bool = opt(False, "ZeRO-1 optimizer (megatron).", ignored=MEGATRON_ONLY)
    overlap_grad_reduce: bool = opt(False, "megatron: all-reduce gradient buckets over the data-parallel ranks "
                                    "during the step's last backward, not after it (megatron-core DDP's overlap); "
                                    "fsdp: a plan note (FSDP2 reduce-scatters during backward always).")
    overlap_param_gather: bool = opt(False, "megatron (with --use-distributed-optimizer): the next forward waits for "
                                     "ZeRO-1's broadcast of the updated weights layer by layer instead of the step "
                                     "waiting for all; requires --overlap-grad-reduce; fsdp: a plan note (FSDP2 "
                                     "prefetches parameter all-gathers always).")
    calculate_per_token_loss: bool = opt(False, "Token-sum loss over the global batch's token count.")
    bf16: bool = opt(False, "bf16 training (GPU).")
    reset_optimizer_states: bool = opt(False, "Drop the actor's optimizer state (Adam moments, SGD momentum) after "
                                       "each rollout step's training; the LR schedule goes on.")
    only_train_params_name_list: list | None = opt(None, "Regexes of parameters to train.", nargs="+")
    freeze_params_name_list: list | None = opt(None, "Regexes of parameters to freeze.", nargs="+")


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage_estimator: AdvantageEstimator = opt("grpo", "Advantage estimator.")
    normalize_advantages: bool = opt(False, "Whiten advantages over the batch.")
    disable_grpo_std_normalization: bool = opt(False, "GRPO without dividing by the group std (Dr.GRPO).")
    disable_rewards_normalization: bool = opt(False, "Use raw rewards as advantages (no group baseline).")
    disable_compute_advantages_and_returns: bool = opt(False, "The Actor computes no advantages or returns (SFT, "
                                                       "or a --loss-type custom_loss that needs none; colocate).")
    loss_type: Literal["policy_loss", "custom_loss"] = opt("policy_loss", "Loss.")
    custom_loss_function_path: str | None = opt(None, "With --loss-type custom_loss: fn(inputs: PolicyLossInputs, "
                                                "cfg: PolicyLossConfig) -> PolicyLossOutput | (loss, metrics).")
    eps_clip: float = opt(0.2, "PPO clip (lower).")
    eps_clip_high: float | None = opt(None, "PPO clip (upper); default --eps-clip.")
    eps_clip_c: float | None = opt(None, "Dual-clip constant (> 1).")
    value_clip: float = opt(0.2, "Value clip.")
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient.")
    kl_coef: float = opt(0.0, "KL reward-shaping coefficient: reward - kl_coef * sum_t k1(old || ref) "
                              "before advantages.")
    use_kl_loss: bool = opt(False, "Add a KL(actor || reference) loss.")
    kl_loss_coef: float = opt(0.0, "KL loss coefficient.")
    kl_loss_type: KlType = opt("k1", "KL estimator.")
    use_unbiased_kl: bool = opt(False, "Importance-weighted KL estimate.")
    ref_update_interval: int | None = opt(None, "Every N rollout steps the reference model takes the actor's current "
                                          "weights (None: the reference stays fixed).")
    sapo_tau_pos: float = opt(1.0, "SAPO temperature for A > 0.")
    sapo_tau_neg: float = opt(1.05, "SAPO temperature for A < 0.")
    gamma: float = opt(1.0, "Discount (PPO/REINFORCE++).")
    lambd: float = opt(1.0, "GAE lambda.")
    use_rollout_logprobs: bool = opt(False, "Use rollout log-probs as the old policy.")
    use_tis: bool = opt(False, "Truncated importance sampling.")
    tis_clip: float = opt(2.0, "TIS upper clip.")
    tis_clip_low: float = opt(0.0, "TIS lower clip.")
    custom_tis_function_path: str | None = opt(None, "With --use-tis: fn(logp_old, logp_rollout, *, clip, clip_low) "
                                               "-> importance weights, replacing the truncated ratio.")
    custom_pg_loss_reducer_function_path: str | None = opt(None, "Reducer factory for pg_loss only: fn(mask_BT, *, "
                                                           "per_token_loss, num_global_samples, num_global_tokens) "
                                                           "-> fn(values_BT) -> scalar.")
    use_opsm: bool = opt(False, "Off-policy sequence masking.")
    opsm_delta: float = opt(1e-4, "OPSM threshold.")
    use_routing_replay: bool = opt(False, "Routing replay (MoE): the first forward over a step's rows (the old "
                                   "log-probs, else the first training pass) records each token's experts and "
                                   "every later pass over those rows replays them (docs/moe.md).")
    use_rollout_routing_replay: bool = opt(False, "Rollout routing replay, R3 (MoE): the engines return the experts "
                                           "they routed every token to and every trainer forward of the row (old "
                                           "log-probs, training, reference) replays them; gate weights still come "
                                           "from the router. Implies --use-routing-replay (docs/moe.md).")
    use_rollout_entropy: bool = opt(False, "The Actor's old-log-prob forward also gives each token's entropy "
                                    "(rollout_data['entropy'] for --rollout-data-postprocess-path, and the dumps; "
                                    "colocate mode).")
    get_mismatch_metrics: bool = opt(False, "Mismatch metrics (always on in this build).",
                                     ignored="train/rollout mismatch metrics are always reported")
    use_opd: bool = opt(False, "On-policy distillation: advantages get -opd_kl_coef * (logp_student - "
                        "logp_teacher) per token, on top of any estimator. Needs --opd-type.")
    opd_type: Literal["sglang", "megatron"] | None = opt(None, "Where the teacher runs: sglang = an inference "
                               "engine (launched from --opd-teacher-load with --rollout-backend, or an "
                               "external server at --rm-url); "
                               "megatron = the training backend, loading --opd-teacher-load.",
)
    opd_kl_coef: float = opt(1.0, "OPD KL coefficient.")
    opd_teacher_load: str | None = opt(None, "OPD teacher checkpoint (HF directory; same tokenizer as the student).")
    opd_teacher_ckpt_step: int | None = opt(None, "OPD teacher checkpoint step (--opd-type megatron): "
                                            "--opd-teacher-load is then a checkpoint directory (iter_XXXXXXX) of a "
                                            "run of --hf-checkpoint's model, whose step N the teacher loads.")
    num_critic_only_steps: int = opt(0, "ppo: the first N rollout steps train only the critic (actor weights "
                                     "unchanged).")
    critic_train_only: bool = opt(False, "ppo: train only the critic, never the actor.")
    critic_lr: float | None = opt(None, "Critic learning rate (default --lr).")
    critic_lr_warmup_iters: int = opt(0, "Linear warm-up steps of the critic's learning rate.")


@dataclass(frozen=True)
class EvalConfig:
    eval_interval: int | None = opt(None, "Evaluate every N rollout steps.")
    eval_prompt_data: list | None = opt(None, "Eval sets: name path [name path ...].", nargs="+")
    eval_config: str | None = opt(None, "OmegaConf YAML/JSON of eval datasets with per-dataset overrides "
                                  "(replaces --eval-prompt-data; format in docs/rollout.md).")
    eval_function_path: str | None = opt(None, "Eval rollout function fn(args, rollout_id, data_source, "
                                         "evaluation=True) -> groups (default --rollout-function-path).")
    skip_eval_before_train: bool = opt(False, "Skip the evaluation before step 0.")
    eval_input_key: str | None = opt(None, "Eval input key (default --input-key).")
    eval_label_key: str | None = opt(None, "Eval label key (default --label-key).")
    eval_tool_key: str | None = opt(None, "Eval tool key (default --tool-key).")
    n_samples_per_eval_prompt: int = opt(1, "Samples per eval prompt.")
    eval_temperature: float | None = opt(None, "Eval temperature (default rollout's).")
    eval_top_p: float | None = opt(None, "Eval top-p.")
    eval_top_k: int | None = opt(None, "Eval top-k.")
    eval_max_response_len: int | None = opt(None, "Eval max new tokens.")
    eval_max_prompt_len: int | None = opt(None, "Eval max prompt length.")
    eval_min_new_tokens: int | None = opt(None, "Eval min new tokens.")
    eval_max_context_len: int | None = opt(None, "Eval max prompt+response tokens (default "
                                           "--rollout-max-context-len).")


@dataclass(frozen=True)
class RewardConfig:
    rm_type: str | None = opt(None, "Built-in reward type, checked when the flags are parsed: "
                              f"{', '.join(REWARD_TYPES)}, or boxed_<type>.", type=parse_rm_type)
    custom_rm_path: str | None = opt(None, "Custom reward fn(args, sample, **kw) (or samples with --group-rm).")
    reward_key: str | None = opt(None, "Key of the score when the reward is a dict.")
    eval_reward_key: str | None = opt(None, "Key of the eval score when the reward is a dict (default --reward-key).")
    group_rm: bool = opt(False, "The reward function scores a whole group.")
    rm_url: str | None = opt(None, "Remote reward service URL (--rm-type remote_rm).")
    custom_reward_post_process_path: str | None = opt(None, "fn(args, samples) -> (raw_rewards, rewards); the "
                                                      "returned rewards are used as-is (no group normalisation).")
    custom_convert_samples_to_train_data_path: str | None = opt(
        None, "fn(args, samples) -> dict of per-sample lists (tokens, response_lengths, rewards, loss_masks, "
        "rollout_log_probs, ...) that become the step's training rows; missing keys keep the default conversion.")
    reward_timeout: float = opt(60.0, "Per-call reward timeout, seconds (a timeout scores --reward-failure-value).")
    reward_num_workers: int = opt(2, "Worker processes for synchronous rewards.")
    reward_max_concurrency: int = opt(64, "Concurrent reward calls.")
    reward_failure_value: float = opt(0.0, "Reward given when the reward function fails or times out.")
    genrm_model_path: str | None = opt(None, "GenRM (LLM-as-judge) model; deploys the GenRM role, used by "
                                       "--rm-type genrm.")
    genrm_num_gpus: int = opt(1, "GPUs for GenRM in total (on CPU: with --genrm-num-gpus-per-engine, the number "
                              "of judge engine processes).")
    genrm_num_gpus_per_engine: int = opt(1, "GPUs per GenRM engine.")
    genrm_engine_config: dict | None = opt(None, "GenRM engine options (JSON), e.g. '{\"max_context_len\": 4096}'.",
                                           type=parse_json)
    genrm_sampling_config: dict | None = opt(None, "GenRM sampling (JSON): temperature (0.1), top_p (1.0), top_k "
                                             "(-1), max_response_len (4096).", type=parse_json)


@dataclass(frozen=True)
class FaultConfig:
    """Health checks and recovery (docs/operations.md, relax.core.health)."""

    use_fault_tolerance: bool = opt(False, "Tier 1: an engine the run launched (rollout, GenRM judge, OPD teacher) "
                                    "that dies or hangs (no answer to its health check) is replaced in place by a "
                                    "fresh one (a rollout engine gets the current weights before it is routed to); "
                                    "its requests in flight are sent again to the other engines or to it.")
    use_health_check: bool = opt(False, "The Controller's HealthManager: role heartbeats and engine health checks; "
                                 "tier 2: when a trainer rank, a role or an engine fails beyond tier 1, every role is "
                                 "torn down and the run resumes from the last checkpoint under --save.")
    max_global_restart: int = opt(3, "Most tier-2 global restarts (with --use-health-check); the next failure "
                                  "ends the run.")
    rollout_health_check_interval: float = opt(30.0, "Seconds between health checks of the engines and roles "
                                               "(with --use-fault-tolerance or --use-health-check).")
    rollout_health_check_timeout: float = opt(30.0, "An engine that does not answer GET /health within this many "
                                              "seconds is hung.")
    rollout_health_check_first_wait: float = opt(0.0, "Seconds to wait after start-up before the first health "
                                                 "check.")
    max_engine_replacements: int = opt(3, "Relax extension (with --use-fault-tolerance): most tier-1 replacements "
                                       "of one engine slot (an engine and those that replaced it) per attempt of the "
                                       "run; the slot's next failure escalates to tier 2 (a global restart with "
                                       "--use-health-check, else the run ends). 0: never replace an engine.")


@dataclass(frozen=True)
class MiscConfig:
    custom_config_path: str | None = opt(None, "YAML of extra key: value pairs set on args (for plugins).")
    train_env_vars: dict = opt(None, "Extra env vars for training processes (JSON).", type=parse_json,
                               default_factory=dict)
    model_name: str | None = opt(None, "Megatron<->HF conversion family (default: model_type).", ignored=MEGATRON_ONLY)
    only_load_weight: bool = opt(False, "The Reference and ActorFwd load the weights only.",
                                 ignored="the Reference and ActorFwd are frozen scorers: they always load the weights "
                                 "only (no optimizer state), as this flag asks")
    rlsp_server_port: int = opt(8234, "RLSP server HTTP port (the seeds' reference lists it).",
                                ignored="the seeds document no RLSP protocol and this build serves none; the run's "
                                "own REST API (engine fleet status and scaling) listens on --scale-api-port")
    exp_dir: str | None = opt(None, "Run output directory (default ./outputs/<timestamp>).")
    dry_run: bool = opt(False, "Print the run plan (mode, roles with their resources and placement, which role "
                               "writes and reads each data column, weight-sync receivers) and exit before Ray starts.")


GROUPS: dict[str, type] = {
    "cluster": ClusterConfig, "ckpt": CheckpointConfig, "data": DataConfig, "rollout": RolloutConfig,
    "batch": BatchConfig, "parallel": ParallelConfig, "optim": OptimizerConfig, "algo": AlgorithmConfig,
    "eval": EvalConfig, "reward": RewardConfig, "agentic": AgenticConfig, "logging": LoggingConfig,
    "debug": DebugConfig, "fault": FaultConfig, "elastic": ElasticConfig, "misc": MiscConfig,
    "megatron": MegatronArchConfig, "lora": LoraConfig, "router": RouterConfig, "engine_profile": EngineProfileConfig,
    "train_profile": TrainProfileConfig, "train_memory": TrainMemoryConfig,
}


@dataclass(frozen=True)
class RelaxConfig:
    """All groups, plus `--sglang-*` passthrough options and the unknown flags (`megatron_extra`, an error)."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ckpt: CheckpointConfig = field(default_factory=CheckpointConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    agentic: AgenticConfig = field(default_factory=AgenticConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    misc: MiscConfig = field(default_factory=MiscConfig)
    megatron: MegatronArchConfig = field(default_factory=MegatronArchConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    engine_profile: EngineProfileConfig = field(default_factory=EngineProfileConfig)
    train_profile: TrainProfileConfig = field(default_factory=TrainProfileConfig)
    train_memory: TrainMemoryConfig = field(default_factory=TrainMemoryConfig)
    sglang: dict[str, Any] = field(default_factory=dict)
    megatron_extra: list[str] = field(default_factory=list)
    custom: dict[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> RelaxConfig:
        """A copy with flat fields changed (`cfg.replace(lr=1e-5, fully_async=True)`); the
        config itself is frozen, so derived values are always new configs."""
        groups: dict[str, dict[str, Any]] = {}
        for key, value in changes.items():
            owner = FIELD_GROUP.get(key)
            if owner is None:
                raise AttributeError(f"RelaxConfig has no field {key!r}")
            groups.setdefault(owner, {})[key] = value
        return dataclasses.replace(self, **{g: dataclasses.replace(getattr(self, g), **v) for g, v in groups.items()})

    @property
    def args(self) -> Namespace:
        """The flat namespace handed to plugins (Relax/slime compatible attribute names)."""
        flat: dict[str, Any] = {}
        for name in GROUPS:
            flat.update(dataclasses.asdict(getattr(self, name)))
        flat.update({f"sglang_{k}": v for k, v in self.sglang.items()})
        flat.update(self.custom)
        return Namespace(**flat)


# flat field name -> the group that owns it (flag names are unique across groups)
FIELD_GROUP: dict[str, str] = {f.name: name for name, cls in GROUPS.items() for f in dataclasses.fields(cls)}
