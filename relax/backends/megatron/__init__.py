"""The `megatron` training backend: megatron-core GPTModels from HF checkpoints (docs/backends/megatron.md).

worker.py is the Ray actor class (`relax.backends.registry`); convert.py the HF <-> Megatron
converters; model.py builds the model from config.json; head.py the response log-prob head;
attention.py the SDPA attention and RMSNorm of the layer spec; cpu_shim.py megatron-core's
CUDA-only spots on a CPU.
"""
