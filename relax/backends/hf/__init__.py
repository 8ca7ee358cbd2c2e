"""The `hf` inference backend: SGLang's native HTTP API served from a transformers model.

Modules: `sampling` (sampling params + token sampler), `decoder` (batched KV-cache decode
loop) with `rows` (a row's input, state and result), `batch` (the running batch's KV cache
bookkeeping) and `prefill` (a group's prefill), `static_cache` (the slot cache and CUDA
graphs), `scheduler` (request queue -> batches on one decode thread), `weights` (engine side of
the distributed weight update), `engine` (all of it around one model), `protocol` (request
models, reply builders), `server` (FastAPI app + CLI), `streaming` (server-sent events of
`/generate` and the OpenAI routes), `grammar` (constrained decoding through llguidance),
`openai_api` + `openai_constraints` (the OpenAI routes), `launcher` (child-process launch),
`tiny_model` (tiny random Qwen3s for tests and CPU runs). Nothing is imported here, so
importing the package stays cheap.
"""
