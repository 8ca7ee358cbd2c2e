"""The CUDA-only spots of megatron-core, made to run on a CPU (gloo, fp32), in one place.

megatron-core assumes a GPU in these places that a tiny CPU model reaches:
  1. `torch.cuda.current_device()` is used as a device by RoPE's frequency table and by the
     tensor-parallel scratch buffers (`get_tensor`): on a machine without CUDA it points at
     "cpu" instead of raising.
  2. `CudaRNGStatesTracker.fork()` swaps CUDA RNG states around dropout and weight init; on a
     CPU there is no CUDA state to swap, so it is a null context (dropout is 0 in RL training and
     weights come from the HF checkpoint, so no draw depends on it).
  3. `model_parallel_cuda_manual_seed` seeds those CUDA states: the worker does not call it on
     a CPU (`seed_model_parallel` below).
  5. The pipeline schedules allocate a token counter with `device="cuda"`: the worker runs a
     schedule under `cuda_to_cpu()`, a torch function mode that sends tensors created on "cuda"
     to the CPU instead (a no-op context on GPUs).
  4. With tied embeddings under pipeline parallelism, `setup_embeddings_and_output_layer`
     moves the last stage's embedding copy to "cuda" before the all-reduce that initialises it
     from the first stage's; on a CPU `Tensor.cuda` is the identity while that method runs.
  6. Under context parallelism RoPE's table is cut to this rank's chunks by
     `get_pos_emb_on_this_cp_rank`, whose chunk index goes through pinned memory to "cuda"; on a
     CPU the same cut is made with a CPU index (`_pos_emb_on_this_cp_rank`).
megatron's optimizer (`get_megatron_optimizer`) also hard-codes CUDA; the worker uses torch's
AdamW on CPU instead (docs/backends/megatron.md). Two more spots are avoided without patching:
the default causal mask (`get_default_causal_mask`, device="cuda": the worker passes its own
mask) and the all-to-all MoE token dispatcher (CUDA streams: the CPU uses the all-gather one).

One fix applies on GPUs too: with Transformer Engine absent, megatron-core 0.16's MoE router
GEMM reads an undefined `te_general_gemm` (a NameError); it is defined as None, which selects the
plain torch path the code already has. Nothing else is patched. `apply()` is idempotent.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

_applied = False


def apply() -> None:
    global _applied
    if _applied:
        return
    _applied = True
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel import random as mp_random

    torch.cuda.current_device = lambda: "cpu"  # (1)

    @contextlib.contextmanager
    def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):  # (2)
        yield

    mp_random.CudaRNGStatesTracker.fork = fork

    from megatron.core.models.common.language_module.language_module import LanguageModule

    setup = LanguageModule.setup_embeddings_and_output_layer

    def setup_on_cpu(self, *args, **kwargs):  # (4)
        cuda, torch.Tensor.cuda = torch.Tensor.cuda, lambda t, *a, **k: t
        try:
            return setup(self, *args, **kwargs)
        finally:
            torch.Tensor.cuda = cuda

    LanguageModule.setup_embeddings_and_output_layer = setup_on_cpu

    from megatron.core.models.common.embeddings import rotary_pos_embedding

    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = _pos_emb_on_this_cp_rank  # (6)


def _pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group: Any) -> torch.Tensor:
    """megatron-core's `get_pos_emb_on_this_cp_rank` with its chunk index on the CPU."""
    cp_size, cp_rank = cp_group.size(), cp_group.rank()
    index = torch.tensor([cp_rank, 2 * cp_size - cp_rank - 1])
    pos_emb = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp_size, -1, *pos_emb.shape[seq_dim + 1:])
    pos_emb = pos_emb.index_select(seq_dim, index)
    return pos_emb.view(*pos_emb.shape[:seq_dim], -1, *pos_emb.shape[seq_dim + 2:])


def seed_model_parallel(seed: int) -> None:
    """(3) Seed torch; on GPUs also megatron's per-TP-rank CUDA RNG streams."""
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)


class _CudaToCpu(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_to_cpu() -> Iterator[None]:
    """(5) Tensors created on "cuda" inside the context are created on the CPU (CPU runs only)."""
    if torch.cuda.is_available():
        yield
        return
    with _CudaToCpu():
        yield
