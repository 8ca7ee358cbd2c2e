"""Multimodal prompt encoding off the rollout's event loop (`--mm-processor-pool-size`).

Decoding, resizing and patchifying a row's images, video frames and audio takes milliseconds to
seconds of CPU. The rollout's event loop serves every in-flight request, so encoding there would
stall them all while one prompt is processed. `PromptEncoder.encode(sample)` returns what
`encode_prompt` returns (the prompt's ids and its /generate media fields; the encoder
tensors set on `sample.multimodal_train_inputs`), computed

- `--mm-processor-pool-size 0` (the default): in a worker thread (`asyncio.to_thread`); PIL,
  numpy and torch release the GIL in their kernels, so encodes overlap with each other and with
  the loop;
- `--mm-processor-pool-size N`: in N processes, each with its own `MultimodalProcessor` and media
  pipelines, built once per process from the checkpoint and the data flags: for heavy media
  (long videos, many images per row) whose Python parts would hold the GIL. The prompt text is
  rendered here (chat template); the ids, tensors and request fields come back through the
  pool's pipe (the trainer still gets the tensors through TransferQueue, as safetensors bytes).

Text runs encode inline (the tokenizer is fast). The pool starts with the first multimodal
prompt and stops with the rollout (`close`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from relax.types import Sample
from relax.utils.data.formatting import render_chat_template
from relax.utils.multimodal.items import through_pipelines

_WORKER: dict[str, Any] = {}  # in a pool process: its processor and pipelines


def prompt_text(tokenizer: Any, sample: Sample) -> str:
    """The prompt as text (a message list through the chat template)."""
    if isinstance(sample.prompt, str):
        return sample.prompt
    return render_chat_template(sample.prompt, tokenizer, tools=None, kwargs={})


def prompt_ids(tokenizer: Any, sample: Sample) -> list[int]:
    """The prompt's token ids (a message list through the chat template)."""
    return tokenizer.encode(prompt_text(tokenizer, sample), add_special_tokens=False)


def encode_prompt(tokenizer: Any, processor: Any, sample: Sample, pipelines: dict[str, Any] | None = None
                  ) -> tuple[list[int], dict[str, Any]]:
    """The prompt's ids and the media fields of its /generate request. A multimodal sample (and a
    VL `processor`) gets its placeholders expanded to the model's media tokens, its encoder tensors
    in `sample.multimodal_train_inputs` (for the trainer) and `image_data` for the engine; its
    media first through `pipelines` (modality -> pipeline: images resized per --image-*-token-num,
    audio resampled to --audio-sample-rate), when given."""
    if processor is None or not sample.multimodal_inputs:
        return prompt_ids(tokenizer, sample), {}
    encoded = processor.encode(prompt_text(tokenizer, sample), through_pipelines(sample.multimodal_inputs, pipelines))
    sample.multimodal_train_inputs = encoded.tensors or None
    return encoded.input_ids, encoded.request


def _init_worker(model_path: str, tokenizer: Any, data_flags: Any) -> None:
    from relax.utils.multimodal.processor import MultimodalProcessor

    processor = MultimodalProcessor.for_run(model_path, tokenizer, data_flags)
    _WORKER.update(processor=processor, pipelines=processor.pipelines(data_flags))


def _encode_in_worker(text: str, media: dict[str, list[Any]]) -> Any:
    return _WORKER["processor"].encode(text, through_pipelines(media, _WORKER["pipelines"]))


class PromptEncoder:
    """The rollout's prompt encoding (module doc). `pool_size` > 0 needs `model_path` and
    `data_flags` (the DataConfig the processes build their processor and pipelines from)."""

    def __init__(self, tokenizer: Any, processor: Any = None, pipelines: dict[str, Any] | None = None, *,
                 pool_size: int = 0, model_path: str | None = None, data_flags: Any = None) -> None:
        if pool_size < 0:
            raise ValueError(f"--mm-processor-pool-size must be >= 0, got {pool_size}")
        if pool_size and (processor is None or model_path is None or data_flags is None):
            raise ValueError("--mm-processor-pool-size > 0 needs a multimodal run (--multimodal-keys) and the "
                             "checkpoint path")
        self.tokenizer, self.processor, self.pipelines = tokenizer, processor, pipelines
        self.pool_size, self.model_path, self.data_flags = pool_size, model_path, data_flags
        self._pool: ProcessPoolExecutor | None = None

    async def encode(self, sample: Sample) -> tuple[list[int], dict[str, Any]]:
        if self.processor is None or not sample.multimodal_inputs:
            return prompt_ids(self.tokenizer, sample), {}
        if not self.pool_size:
            return await asyncio.to_thread(encode_prompt, self.tokenizer, self.processor, sample, self.pipelines)
        text = prompt_text(self.tokenizer, sample)
        encoded = await asyncio.wrap_future(self._processes().submit(_encode_in_worker, text,
                                                                      dict(sample.multimodal_inputs)))
        sample.multimodal_train_inputs = encoded.tensors or None
        return encoded.input_ids, encoded.request

    def _processes(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            # spawn: the rollout process runs Ray's and torch's threads, which a fork would copy mid-state
            self._pool = ProcessPoolExecutor(self.pool_size, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker,
                                             initargs=(self.model_path, self.tokenizer, self.data_flags))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
