"""Raw HF <-> Megatron weight conversion for the supported families, both directions, sharded.

Three independent steps, each a small pure function over tensors:
  1. names and layouts, HF checkpoint <-> one *full* Megatron tensor (`hf_to_megatron`,
     `megatron_to_hf`): q/k/v fused into `linear_qkv` grouped by KV head (for each query group:
     its query heads, then its key, then its value), gate/up fused into `linear_fc1`
     ([gate; up]), q/k norms, tied or untied output layer, router and per-expert MLPs;
  2. tensor-parallel shards of a full tensor and back (`tp_split`, `tp_merge`): column-parallel
     weights split by rows (each shard of `linear_fc1` holds its own [gate; up] halves, each shard
     of `linear_qkv` whole query groups), row-parallel ones by columns, the vocabulary by rows,
     norms and routers replicated;
  3. pipeline and expert placement (`stage_layers`, `local_name`, `global_name`): which global
     layers a pipeline stage holds and which global experts an expert-parallel rank holds, under
     their local indices, as a megatron-core `GPTModel` names its parameters.
Every step is exact (reshapes, concatenations and slices only), so HF -> Megatron -> HF returns
the same bits (tests/unit/backends/megatron/test_convert.py).

HF names are the checkpoint's (`model.layers.0.self_attn.q_proj.weight`,
`model.layers.0.mlp.experts.3.gate_proj.weight`), which SGLang's weight loader also expects.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

from relax.config.checks.megatron import SWIGLU_ACTIVATIONS, conversion_family

# model_type -> what its layers have beyond a Llama layer. qkv_bias None: none (a Llama config with
# `attention_bias` also biases the output projection, which is refused).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"qk_norm": False, "qkv_bias": None, "moe": False},
    "mistral": {"qk_norm": False, "qkv_bias": None, "moe": False},
    "qwen2": {"qk_norm": False, "qkv_bias": True, "moe": False},
    "qwen2_5_vl_text": {"qk_norm": False, "qkv_bias": True, "moe": False},  # Qwen2.5-VL's language model (vision.py)
    "qwen3": {"qk_norm": True, "qkv_bias": False, "moe": False},
    "qwen3_vl_text": {"qk_norm": True, "qkv_bias": False, "moe": False},  # Qwen3-VL's language model (vision.py)
    "qwen3_moe": {"qk_norm": True, "qkv_bias": False, "moe": True},
    "qwen3_omni_moe_text": {"qk_norm": True, "qkv_bias": False, "moe": True},  # the Qwen3-Omni thinker's (vision.py)
}


class ConversionError(ValueError):
    pass


@dataclass(frozen=True)
class Layout:
    """The shapes of one model, from its HF `config.json`."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied: bool
    qk_norm: bool
    qkv_bias: bool
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_top_k: int = 0
    mrope_section: tuple[int, ...] = ()  # M-RoPE (a VL model's language model): rotary dims per t / h / w
    mrope_interleaved: bool = False  # Qwen3-VL: h / w frequencies interleaved with t's (model.InterleavedMRoPE)
    # Rows of the Megatron embedding and output layer: the vocabulary padded as megatron pads it
    # (`padded`); 0: the vocabulary itself. The padded rows are zeros no token reaches and no
    # log-prob counts (head.py); HF tensors (pushes, exports) carry `vocab_size` rows.
    padded_vocab: int = 0

    @classmethod
    def from_hf_config(cls, config: Any, model_name: str | None = None) -> "Layout":
        """`model_name` (--model-name): the family whose conversion applies (default: the config's
        model_type), as `relax.config.checks.megatron.conversion_family` resolves it."""
        model_type = family_of(model_name or getattr(config, "model_type", None) or "", given=model_name is not None)
        family = FAMILIES[model_type]
        if family["moe"] and (getattr(config, "mlp_only_layers", None) or getattr(config, "decoder_sparse_step", 1) != 1
                              or not getattr(config, "norm_topk_prob", True)):
            raise ConversionError(f"{model_type}: only configs whose every layer is MoE (decoder_sparse_step 1, no "
                                  "mlp_only_layers) with normalised top-k weights (norm_topk_prob) convert")
        act = getattr(config, "hidden_act", "silu")
        if act not in SWIGLU_ACTIVATIONS:
            raise ConversionError(f"{model_type} with hidden_act={act}: the megatron backend builds SwiGLU "
                                  "(silu-gated) MLPs only; train this model with --train-backend fsdp")
        heads = config.num_attention_heads
        qkv_bias = family["qkv_bias"]
        if qkv_bias is None and getattr(config, "attention_bias", False):  # biases on q, k, v and o
            raise ConversionError(f"{model_type} with attention_bias=true (an output-projection bias) has no "
                                  "Megatron conversion here")
        moe = family["moe"]
        return cls(
            model_type=model_type, num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
            num_heads=heads, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            ffn_hidden_size=config.intermediate_size, vocab_size=config.vocab_size,
            tied=bool(getattr(config, "tie_word_embeddings", False)), qk_norm=family["qk_norm"],
            qkv_bias=bool(qkv_bias),
            num_experts=config.num_experts if moe else 0,
            moe_ffn_hidden_size=config.moe_intermediate_size if moe else 0,
            moe_top_k=config.num_experts_per_tok if moe else 0,
            mrope_section=tuple(_rope_parameters(config).get("mrope_section") or ()),
            # their HF rotary embeddings always interleave
            mrope_interleaved=model_type in ("qwen3_vl_text", "qwen3_omni_moe_text"),
        )

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def vocab_rows(self) -> int:
        return self.padded_vocab or self.vocab_size

    def padded(self, multiple: int) -> "Layout":
        """The vocabulary padded up to a multiple of `multiple` (megatron's
        `--make-vocab-size-divisible-by` times the tensor-parallel size), so it splits over the
        tensor-parallel ranks whatever the tokenizer's size."""
        return dataclasses.replace(self, padded_vocab=-(-self.vocab_size // multiple) * multiple)


def family_of(name: str, *, given: bool = False) -> str:
    """The `FAMILIES` key `name` (a model_type, or --model-name when `given`) names; ConversionError
    listing the known ones when none does."""
    family = conversion_family(name) if name else None
    if family not in FAMILIES:
        what = f"--model-name {name}" if given else f"model_type {name or None!r}"
        raise ConversionError(f"{what} has no Megatron conversion; known: {', '.join(FAMILIES)} (set --model-name "
                              "to the family the model's layers follow)")
    return family


def _rope_parameters(config: Any) -> dict[str, Any]:
    """`rope_parameters` (transformers >= 5) or the older `rope_scaling`."""
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})


# ---- 1. HF <-> full Megatron tensors -----------------------------------------------------------
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Megatron layer suffix -> HF layer suffix, for tensors that map one to one.
_SAME = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
}
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_HF_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> torch.Tensor:
    """[q; k; v] rows (or biases) regrouped per KV head: group g = its query heads, its k, its v."""
    g, d = layout.num_kv_heads, layout.head_dim
    tail = q.shape[1:]
    parts = (q.reshape(g, layout.heads_per_group * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail))
    return torch.cat(parts, dim=1).reshape(-1, *tail)


def split_qkv(qkv: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = layout.num_kv_heads, layout.head_dim, layout.heads_per_group
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *tail)
    q, k, v = grouped.split([hpg * d, d, d], dim=1)
    return q.reshape(-1, *tail).clone(), k.reshape(-1, *tail).clone(), v.reshape(-1, *tail).clone()


def megatron_to_hf(name: str, tensor: torch.Tensor, layout: Layout) -> list[tuple[str, torch.Tensor]]:
    """One full Megatron tensor under its global name -> the HF tensors it holds (a padded
    vocabulary's rows cut back to the HF vocabulary)."""
    if name == "embedding.word_embeddings.weight":  # tied: the HF model has no lm_head parameter of its own
        return [("model.embed_tokens.weight", tensor[:layout.vocab_size])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", tensor)]
    if name == "output_layer.weight":
        return [] if layout.tied else [("lm_head.weight", tensor[:layout.vocab_size])]
    m = _LAYER.match(name)
    if m is None:
        raise ConversionError(f"no HF name for Megatron parameter {name!r}")
    prefix, rest = f"model.layers.{m.group(1)}.", m.group(2)
    if rest in _SAME:
        return [(prefix + _SAME[rest], tensor)]
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = split_qkv(tensor, layout)
        return [(f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v))]
    if rest == "mlp.linear_fc1.weight":
        gate, up = tensor.chunk(2, dim=0)
        return [(prefix + "mlp.gate_proj.weight", gate.clone()), (prefix + "mlp.up_proj.weight", up.clone())]
    e = _EXPERT.match(rest)
    if e is not None:
        expert = f"{prefix}mlp.experts.{e.group(1)}."
        if e.group(2) == "linear_fc2":
            return [(expert + "down_proj.weight", tensor)]
        gate, up = tensor.chunk(2, dim=0)
        return [(expert + "gate_proj.weight", gate.clone()), (expert + "up_proj.weight", up.clone())]
    raise ConversionError(f"no HF name for Megatron parameter {name!r}")


@dataclass(frozen=True)
class Source:
    """The HF tensors one full Megatron tensor is made of, and how: "same" (one tensor), "qkv"
    (`fuse_qkv`), "cat" (gate and up rows) or "vocab" (one tensor, rows padded to the padded
    vocabulary)."""

    hf_names: tuple[str, ...]
    kind: str = "same"


def megatron_sources(layout: Layout) -> dict[str, Source]:
    """Global Megatron name -> its `Source`, for every tensor of the model (every layer, every
    expert): the recipe `hf_to_megatron` and the weight receiver (`weights.py`) both follow."""
    out = {"embedding.word_embeddings.weight": Source(("model.embed_tokens.weight",), "vocab"),
           "decoder.final_layernorm.weight": Source(("model.norm.weight",))}
    if not layout.tied:
        out["output_layer.weight"] = Source(("lm_head.weight",), "vocab")
    for i in range(layout.num_layers):
        hp, mp = f"model.layers.{i}.", f"decoder.layers.{i}."
        suffixes = ["input_layernorm.weight", "self_attention.linear_proj.weight", "pre_mlp_layernorm.weight"]
        if layout.qk_norm:
            suffixes += ["self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"]
        suffixes.append("mlp.router.weight" if layout.num_experts else "mlp.linear_fc2.weight")
        for mg_suffix in suffixes:
            out[mp + mg_suffix] = Source((hp + _SAME[mg_suffix],))
        for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
            out[f"{mp}self_attention.linear_qkv.{kind}"] = Source(
                tuple(f"{hp}self_attn.{p}_proj.{kind}" for p in "qkv"), "qkv")
        if layout.num_experts:
            for e in range(layout.num_experts):
                ep, me = f"{hp}mlp.experts.{e}.", f"{mp}mlp.experts.local_experts.{e}."
                out[me + "linear_fc1.weight"] = Source((ep + "gate_proj.weight", ep + "up_proj.weight"), "cat")
                out[me + "linear_fc2.weight"] = Source((ep + "down_proj.weight",))
        else:
            out[mp + "mlp.linear_fc1.weight"] = Source((hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"), "cat")
    return out


def fuse(source: Source, tensors: list[torch.Tensor], layout: Layout) -> torch.Tensor:
    """The full Megatron tensor of `source` from its HF tensors (in `source.hf_names` order)."""
    if source.kind == "qkv":
        return fuse_qkv(*tensors, layout)
    if source.kind == "cat":
        return torch.cat(tensors)
    if source.kind == "vocab" and layout.vocab_rows > tensors[0].shape[0]:
        return torch.nn.functional.pad(tensors[0], (0, 0, 0, layout.vocab_rows - tensors[0].shape[0]))
    return tensors[0]


def hf_shapes(layout: Layout) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor the HF checkpoint has (a tied one's `lm_head.weight` too:
    some checkpoints and senders carry it)."""
    h, d, v = layout.hidden_size, layout.head_dim, layout.vocab_size
    q, kv = layout.num_heads * d, layout.num_kv_heads * d
    f, fe = layout.ffn_hidden_size, layout.moe_ffn_hidden_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,),
                                       "lm_head.weight": (v, h)}
    for i in range(layout.num_layers):
        p = f"model.layers.{i}."
        out |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q)}
        if layout.qkv_bias:
            out |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,)}
        if layout.qk_norm:
            out |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        if layout.num_experts:
            out[p + "mlp.gate.weight"] = (layout.num_experts, h)
            for e in range(layout.num_experts):
                ep = f"{p}mlp.experts.{e}."
                out |= {ep + "gate_proj.weight": (fe, h), ep + "up_proj.weight": (fe, h),
                        ep + "down_proj.weight": (h, fe)}
        else:
            out |= {p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                    p + "mlp.down_proj.weight": (h, f)}
    return out


def hf_to_megatron(hf: dict[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """An HF state dict -> full Megatron tensors under global names (every layer, every expert).
    Raises on a tensor it does not place and on one the model needs but the checkpoint lacks."""
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in hf:
            raise ConversionError(f"the HF checkpoint has no {key!r} (model_type {layout.model_type})")
        used.add(key)
        return hf[key]

    out = {name: fuse(src, [take(k) for k in src.hf_names], layout) for name, src in megatron_sources(layout).items()}
    if layout.tied and "lm_head.weight" in hf:
        used.add("lm_head.weight")  # the tied copy some checkpoints carry
    extra = sorted(set(hf) - used - {k for k in hf if k.endswith("rotary_emb.inv_freq")})
    if extra:
        raise ConversionError(f"{len(extra)} HF tensor(s) have no Megatron place, e.g. {extra[:3]} "
                              f"(model_type {layout.model_type})")
    return out


# ---- 2. tensor-parallel shards ------------------------------------------------------------------
_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "word_embeddings.weight",
           "output_layer.weight")
_ROW = ("linear_proj.weight", "linear_fc2.weight")


def tp_dim(name: str) -> int | None:
    """The dimension a parameter is split along under tensor parallelism (None: replicated; a VL /
    omni model's encoders, `visual.*` and `audio_tower.*`, are whole on every rank)."""
    if name.startswith(("visual.", "audio_tower.")):
        return None
    if name.endswith(_COLUMN):
        return 0
    if name.endswith(_ROW):
        return 1
    return None


def _gated(name: str) -> bool:
    return name.endswith("linear_fc1.weight")  # [gate; up]: each shard takes its slice of both


def tp_split(name: str, full: torch.Tensor, tp: int) -> list[torch.Tensor]:
    dim = tp_dim(name)
    if tp == 1 or dim is None:
        return [full] * tp
    if full.shape[dim] % (2 * tp if _gated(name) else tp):
        raise ConversionError(f"{name}: dimension {dim} of {tuple(full.shape)} does not split into "
                              f"{tp} tensor-parallel shards")
    if _gated(name):
        gate, up = full.chunk(2, dim=0)
        return [torch.cat([g, u]) for g, u in zip(gate.chunk(tp), up.chunk(tp))]
    return [s.clone() for s in full.chunk(tp, dim=dim)]


def tp_merge(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    dim = tp_dim(name)
    if len(shards) == 1 or dim is None:
        return shards[0]
    if _gated(name):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(shards, dim=dim)


# ---- 3. pipeline stages and expert ranks ------------------------------------------------------
def stage_layers(num_layers: int, pp: int, first: int | None = None, last: int | None = None) -> list[range]:
    """Global layer indices of each pipeline stage: the first and last stages take `first` /
    `last` layers when given (--decoder-first/last-pipeline-num-layers), the rest are even."""
    if pp == 1:
        return [range(num_layers)]
    head, tail = first or 0, last or 0
    middle_stages = pp - (first is not None) - (last is not None)
    rest = num_layers - head - tail
    if middle_stages <= 0 and rest:
        raise ConversionError(f"{num_layers} layers: the first/last stage sizes leave {rest} for no stage")
    if middle_stages and rest % middle_stages:
        raise ConversionError(f"{num_layers} layers do not split evenly into {pp} pipeline stages "
                              f"(first={first}, last={last}); set --decoder-first/last-pipeline-num-layers")
    sizes = ([head] if first is not None else []) + [rest // max(middle_stages, 1)] * middle_stages \
        + ([tail] if last is not None else [])
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def local_name(name: str, layers: range, experts: range | None = None) -> str | None:
    """A global Megatron name -> this rank's name for it (None: another stage / expert rank holds it)."""
    m = _LAYER.match(name)
    if m is None:
        return name
    layer, rest = int(m.group(1)), m.group(2)
    if layer not in layers:
        return None
    e = _EXPERT.match(rest)
    if e is not None and experts is not None:
        expert = int(e.group(1))
        if expert not in experts:
            return None
        rest = f"mlp.experts.local_experts.{expert - experts.start}.{e.group(2)}.weight"
    return f"decoder.layers.{layer - layers.start}.{rest}"


def global_name(name: str, layers: range, experts: range | None = None) -> str:
    m = _LAYER.match(name)
    if m is None:
        return name
    rest = m.group(2)
    e = _EXPERT.match(rest)
    if e is not None and experts is not None:
        rest = f"mlp.experts.local_experts.{int(e.group(1)) + experts.start}.{e.group(2)}.weight"
    return f"decoder.layers.{int(m.group(1)) + layers.start}.{rest}"


def is_expert(name: str) -> bool:
    """A Megatron parameter of an MoE layer's experts (sharded over expert-parallel ranks)."""
    return ".mlp.experts." in name


def expert_range(num_experts: int, ep: int, ep_rank: int) -> range:
    if num_experts % ep:
        raise ConversionError(f"{num_experts} experts do not split over --expert-model-parallel-size {ep}")
    per = num_experts // ep
    return range(ep_rank * per, (ep_rank + 1) * per)


def shard_state(full: dict[str, torch.Tensor], *, tp: int, tp_rank: int, layers: range,
                experts: range | None, first_stage: bool, last_stage: bool, tied: bool, etp: int = 1,
                etp_rank: int = 0) -> dict[str, torch.Tensor]:
    """The local state dict of one (tp, pp, ep, etp) rank from full global tensors: experts split
    over `etp` expert-tensor ranks as dense weights over `tp`. Under pipeline parallelism with tied
    embeddings the last stage holds its own copy as `output_layer.weight` (megatron-core keeps the
    two in sync by an all-reduce of their gradients)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        if name.startswith("embedding.") and not first_stage:
            if tied and last_stage and name == "embedding.word_embeddings.weight":
                out["output_layer.weight"] = tp_split("output_layer.weight", tensor, tp)[tp_rank]
            continue
        if (name.startswith("decoder.final_layernorm") or name.startswith("output_layer")) and not last_stage:
            continue
        local = local_name(name, layers, experts)
        if local is not None:
            size, rank = (etp, etp_rank) if is_expert(name) else (tp, tp_rank)  # --expert-tensor-parallel-size
            out[local] = tp_split(name, tensor, size)[rank]
    return out


def hf_tensors(named_full: Iterable[tuple[str, torch.Tensor]], layout: Layout) -> Iterator[tuple[str, torch.Tensor]]:
    """Full Megatron tensors under global names -> HF tensors, each HF name once."""
    seen: set[str] = set()
    for name, tensor in named_full:
        for hf_name, t in megatron_to_hf(name, tensor, layout):
            if hf_name not in seen:
                seen.add(hf_name)
                yield hf_name, t
