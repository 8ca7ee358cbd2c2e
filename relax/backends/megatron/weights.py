"""Receiving side of the weight push for a megatron rank: ActorFwd taking the actor's weights.

In fully-async mode the ActorFwd ranks are receivers of the same broadcast group as the
inference engines (SGLang's protocol, `relax.distributed.weights`), as the fsdp ranks are
(`relax.backends.fsdp.weights`). The push carries HF-named tensors in buckets; a Megatron
tensor may be made of several (q/k/v fused into `linear_qkv`, gate/up into `linear_fc1`), and a
bucket boundary may fall between them. So each rank keeps the HF tensors of a fused tensor
until all of them have arrived, then builds the full Megatron tensor with the raw converter
(`convert.fuse`) and copies in only its own tensor / pipeline / expert shard
(`convert.shard_state`, as `MegatronTrainWorker._load_hf` does at start). Every rank receives
every tensor from the sender, so loading needs no collective among the ranks and cannot
deadlock against the sender. A well-formed bucket is always received in full; names or shapes
the model does not have reject the bucket (nothing loaded); a push whose last bucket leaves a
fused tensor incomplete is refused and its version not taken, whether the buckets were broadcast
or handed over as CUDA IPC handles (`load_tensor_payload`, the engine's).
A VL / omni model (`vision.py`) takes its text weights under the model's names (either layout)
and its encoders' straight into the replicated encoders.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from relax.backends.megatron.convert import Layout, fuse, hf_shapes, megatron_sources
from relax.distributed.weights.protocol import TensorSpec
from relax.distributed.weights.receiver import WeightReceiver

# Full Megatron tensors under global names -> this rank's local state dict (its shards only).
Placer = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


class MegatronWeightReceiver(WeightReceiver):
    """The engine's receiver, loading HF-named tensors into a megatron-core model's shards;
    `version`: the last complete push's."""

    version_type = int

    def __init__(self, model: torch.nn.Module, layout: Layout, place: Placer, *, device: torch.device,
                 timeout_s: float = 600.0, vision: Any = None) -> None:
        super().__init__(model, timeout_s=timeout_s, device=device)
        self.layout, self.place, self.vision = layout, place, vision
        self.sources = megatron_sources(layout)
        self.target_of = {hf: name for name, src in self.sources.items() for hf in src.hf_names}
        self.shapes = hf_shapes(layout)
        self.pending: dict[str, torch.Tensor] = {}  # HF tensors of fused tensors still incomplete

    def _text_name(self, name: str) -> str | None:
        """The text-model HF name of an incoming tensor (None: a VL model's tower tensor)."""
        return self.vision.text_name(name) if self.vision is not None else name

    def problems(self, specs: list[TensorSpec]) -> list[str]:
        found = []
        params = dict(self.model.named_parameters()) if self.vision is not None else {}
        for spec in specs:
            text = self._text_name(spec.name)
            if text is None:
                param = params.get(self.vision.tower_name(spec.name))
                shape = None if param is None else tuple(param.shape)
            else:
                shape = self.shapes.get(text)
            if shape is None:
                found.append(f"{spec.name!r} is not a weight of the model ({self.layout.model_type})")
            elif shape != spec.shape:
                found.append(f"{spec.name!r} has shape {list(spec.shape)}, the model has {list(shape)}")
        return found

    def begin(self) -> None:
        """A new push: what an unfinished one left behind is dropped."""
        self.pending.clear()

    def finish(self, version: int | str, message: str) -> tuple[bool, str]:
        """The push's last bucket is loaded: it must leave no fused tensor incomplete (`update`,
        `load_tensor_payload`; a worker may call it after a bucket it loaded without the version)."""
        if self.pending:
            missing = sorted({h for n in {self.target_of[p] for p in self.pending}
                              for h in self.sources[n].hf_names} - set(self.pending))
            self.pending.clear()
            return False, (f"the push of version {version} ended without {missing[:4]} ({len(missing)} tensor(s)); "
                           "their fused Megatron tensors are incomplete, the version is not taken")
        return super().finish(version, message)

    def load_named(self, named: list[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
        # CUDA IPC: the sender frees these blocks after the call; keep copies of what waits for more.
        return super().load_named([(n, t.clone()) for n, t in named])

    @torch.no_grad()
    def load(self, specs: list[TensorSpec], tensors: list[torch.Tensor]) -> None:
        touched = set()
        params = dict(self.model.named_parameters())
        for spec, tensor in zip(specs, tensors):
            text = self._text_name(spec.name)
            if text is None:  # an encoder: whole on every rank
                params[self.vision.tower_name(spec.name)].copy_(tensor)
                continue
            name = self.target_of.get(text)
            if name is not None:  # None: a tied model's lm_head copy
                self.pending[text] = tensor.to(self.device)
                touched.add(name)
        full = {}
        for name in touched:
            src = self.sources[name]
            if all(h in self.pending for h in src.hf_names):
                full[name] = fuse(src, [self.pending.pop(h) for h in src.hf_names], self.layout)
        for local, tensor in self.place(full).items():
            params[local].copy_(tensor)
