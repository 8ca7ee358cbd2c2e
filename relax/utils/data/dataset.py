"""Prompt datasets: rows of `.jsonl` / `.parquet` files as prompt `Sample`s.

`PromptDataset` reads every row at construction and keeps the prompts in memory (the default;
slime's `Dataset`). `StreamingPromptDataset` (`--use-streaming-dataset`) reads rows lazily,
for datasets larger than memory: rows pass through a shuffle buffer of
`--streaming-buffer-size` rows (seeded by `seed + epoch`), and its position (epoch, rows
consumed) can be saved and restored; restoring re-reads the epoch's rows up to the position
without formatting them. With `--multimodal-keys` it loads each row's media (images decoded),
ahead of use in a background prefetch buffer (`relax.utils.data.prefetch`,
`--prefetch-chunk-size/-max-cached/-num-workers`), or when the row is taken with
`--prefetch-max-cached 0`. Given `media_pipelines` (`relax.utils.multimodal`), media are also
resized / frame-sampled / resampled per the multimodal flags; a corrupt file is then caught too.

`PromptDataset` keeps media references as they are; with `check_media` (the run's training data)
it first checks each local item is there and decodable (`relax.utils.multimodal.check`; URLs
are not fetched).

Both turn rows into samples with `relax.utils.data.formatting.build_sample` and drop prompts
longer than `--rollout-max-prompt-len` tokens. Given `media_length` (a multimodal run with that
flag: `relax.utils.data.formatting.MediaLength`), a row with media is measured as the model sees
it, each placeholder expanded to its media tokens, since the expansion, not the placeholder text,
is what fills the context; media that cannot be processed make the row malformed. A malformed row
raises `DataError` naming the file and the row, or, with `--skip-malformed-rows`, is skipped,
counted and logged.
"""

from __future__ import annotations

import itertools
import logging
import random
from typing import Any, Callable, Iterator

from relax.types import Sample
from relax.utils.data.formatting import MediaLength, PromptFormat, build_sample, prompt_token_length
from relax.utils.data.prefetch import PrefetchBuffer, load_row_media
from relax.utils.data.readers import (
    DataError,
    RowLocation,
    check_data_file,
    count_rows,
    decode_record,
    iter_raw_records,
    iter_records,
    read_rows,
    resolve_prompt_paths,
)

__all__ = ["DataError", "PromptDataset", "StreamingPromptDataset", "read_rows"]

logger = logging.getLogger(__name__)

_MAX_REASONS = 5  # skipped-row reasons kept for the log line


class _RowPipeline:
    """Row -> Sample or None (skipped / too long), with the counters both datasets report."""

    def __init__(self, fmt: PromptFormat, tokenizer: Any, *, max_prompt_len: int | None,
                 skip_malformed: bool, media_length: MediaLength | None = None) -> None:
        if max_prompt_len is not None and tokenizer is None:
            raise ValueError("--rollout-max-prompt-len needs a tokenizer; set --hf-checkpoint")
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.media_length = media_length if max_prompt_len is not None else None
        self.skip_malformed = skip_malformed
        self.num_skipped = 0
        self.num_too_long = 0
        self.skip_reasons: list[str] = []
        self._warned_unmeasured = False

    def __call__(self, location: RowLocation, row: dict | DataError) -> Sample | None:
        try:
            if isinstance(row, DataError):
                raise row
            sample = build_sample(row, location, self.fmt, self.tokenizer)
            too_long = self._too_long(sample, location)
        except DataError as exc:
            if not self.skip_malformed:
                raise DataError(f"{exc}. To skip malformed rows instead, pass --skip-malformed-rows") from None
            self.num_skipped += 1
            if len(self.skip_reasons) < _MAX_REASONS:
                self.skip_reasons.append(str(exc))
            return None
        if too_long:
            self.num_too_long += 1
            return None
        return sample

    def _too_long(self, sample: Sample, location: RowLocation) -> bool:
        if self.max_prompt_len is None:
            return False
        length = self._length(sample, location)
        if length is None:
            if not self._warned_unmeasured:
                logger.warning("--rollout-max-prompt-len: message-list prompts cannot be measured without a chat "
                               "template; they are kept. Pass --apply-chat-template to filter them.")
                self._warned_unmeasured = True
            return False
        return length > self.max_prompt_len

    def _length(self, sample: Sample, location: RowLocation) -> int | None:
        """The prompt's token count; with `media_length`, media expanded (DataError if they cannot be)."""
        if self.media_length is None or not sample.multimodal_inputs:
            return prompt_token_length(sample.prompt, self.tokenizer, self.fmt)
        try:
            return prompt_token_length(sample.prompt, self.tokenizer, self.fmt, media=sample.multimodal_inputs,
                                       media_length=self.media_length)
        except (ValueError, OSError) as exc:  # MediaError (a ValueError): unreadable, undecodable or unmatched
            raise DataError(f"{location}: cannot count its media tokens for --rollout-max-prompt-len: {exc}; "
                            "fix the row or the media it names") from exc

    def log_summary(self, what: str) -> None:
        if self.num_too_long:
            counted = " (media counted as the model's media tokens)" if self.media_length is not None else ""
            logger.info("%s: dropped %d prompt(s) longer than --rollout-max-prompt-len=%d tokens%s",
                        what, self.num_too_long, self.max_prompt_len, counted)
        if self.num_skipped:
            logger.warning("%s: skipped %d malformed row(s) (--skip-malformed-rows); first reasons:\n  %s",
                           what, self.num_skipped, "\n  ".join(self.skip_reasons))


def _make_format(input_key: str, label_key: str | None, metadata_key: str | None, tool_key: str | None,
                 apply_chat_template: bool, apply_chat_template_kwargs: dict | None, system_prompt: str | None,
                 multimodal_keys: dict | None, custom_prompt_fn: Callable | None) -> PromptFormat:
    return PromptFormat(
        input_key=input_key, label_key=label_key, metadata_key=metadata_key, tool_key=tool_key,
        apply_chat_template=apply_chat_template, apply_chat_template_kwargs=dict(apply_chat_template_kwargs or {}),
        system_prompt=system_prompt, multimodal_keys=multimodal_keys, custom_prompt_fn=custom_prompt_fn,
    )


class PromptDataset:
    """All prompts of `paths` in memory, in file order (`samples`), plus what was dropped and why.

    `paths`: anything `resolve_prompt_paths` accepts (a path, a list, a verl-style list string).
    `check_media`: check each row's local media files exist and decode (a bad one is a malformed row).
    `media_length`: measure rows with media as the model sees them (module doc); None: placeholder text.
    Counters: `num_skipped` (malformed rows, with --skip-malformed-rows), `num_too_long`.
    """

    def __init__(self, paths: Any, tokenizer: Any = None, *, input_key: str = "input", label_key: str | None = None,
                 metadata_key: str | None = "metadata", tool_key: str | None = "tools",
                 apply_chat_template: bool = False, apply_chat_template_kwargs: dict | None = None,
                 system_prompt: str | None = None, max_prompt_len: int | None = None,
                 multimodal_keys: dict[str, str] | None = None,
                 custom_prompt_fn: Callable[[Any, dict], Any] | None = None, skip_malformed: bool = False,
                 check_media: bool = False, media_length: MediaLength | None = None) -> None:
        self.paths = resolve_prompt_paths(paths)
        fmt = _make_format(input_key, label_key, metadata_key, tool_key, apply_chat_template,
                           apply_chat_template_kwargs, system_prompt, multimodal_keys, custom_prompt_fn)
        pipeline = _RowPipeline(fmt, tokenizer, max_prompt_len=max_prompt_len, skip_malformed=skip_malformed,
                                media_length=media_length)
        for path in self.paths:
            check_data_file(path)
        self.samples: list[Sample] = []
        for path in self.paths:
            for location, row in iter_records(path):
                if check_media and multimodal_keys and not isinstance(row, DataError):
                    row = _checked_media(location, row, multimodal_keys)
                sample = pipeline(location, row)
                if sample is not None:
                    self.samples.append(sample)
        pipeline.log_summary(f"prompt data {self.paths}")
        self.num_skipped = pipeline.num_skipped
        self.num_too_long = pipeline.num_too_long
        self.skip_reasons = pipeline.skip_reasons
        logger.info("loaded %d prompt(s) from %s", len(self.samples), self.paths)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Sample:
        return self.samples[index]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)


def _checked_media(location: RowLocation, row: dict, multimodal_keys: dict[str, str]) -> dict | DataError:
    """The row, or a DataError naming it when a media file is missing or corrupt (relax.utils.multimodal.check)."""
    from relax.utils.multimodal.check import check_row_media

    try:
        check_row_media(row, multimodal_keys)
    except ValueError as exc:
        return DataError(f"{location}: {exc}; fix the row or the file it names")
    return row


def _shuffle_buffer(records: Iterator, buffer_size: int, rng: random.Random) -> Iterator:
    """Approximate shuffle in O(buffer_size) memory: emit a random buffered item as each new one arrives."""
    buffer: list = []
    for record in records:
        if len(buffer) < buffer_size:
            buffer.append(record)
            continue
        slot = rng.randrange(buffer_size)
        yield buffer[slot]
        buffer[slot] = record
    rng.shuffle(buffer)
    yield from buffer


class StreamingPromptDataset:
    """Prompts read lazily, epoch after epoch; `take(n)` returns the next n prompt samples.

    Order within an epoch: file order, or with `shuffle` a shuffle-buffer order of
    `buffer_size` rows seeded by `seed + epoch` (a full shuffle when the buffer holds the
    whole dataset). Position: `epoch` and `position` (rows consumed in the epoch, counting
    dropped ones). `len()` is the number of rows in the files (before any dropping).
    """

    def __init__(self, paths: Any, tokenizer: Any = None, *, buffer_size: int = 10000, shuffle: bool = False,
                 seed: int = 42, input_key: str = "input", label_key: str | None = None,
                 metadata_key: str | None = "metadata", tool_key: str | None = "tools",
                 apply_chat_template: bool = False, apply_chat_template_kwargs: dict | None = None,
                 system_prompt: str | None = None, max_prompt_len: int | None = None,
                 multimodal_keys: dict[str, str] | None = None,
                 custom_prompt_fn: Callable[[Any, dict], Any] | None = None, skip_malformed: bool = False,
                 prefetch_chunk_size: int = 32, prefetch_max_cached: int = 256, prefetch_num_workers: int = 1,
                 media_pipelines: dict[str, Any] | None = None, media_length: MediaLength | None = None) -> None:
        if buffer_size < 1:
            raise ValueError(f"--streaming-buffer-size must be >= 1, got {buffer_size}")
        if prefetch_max_cached < 0:
            raise ValueError(f"--prefetch-max-cached must be >= 0 (0 = no prefetching), got {prefetch_max_cached}")
        self.multimodal_keys = dict(multimodal_keys or {})
        self.media_pipelines = media_pipelines  # relax.utils.multimodal.build_pipelines; None: decode only
        self.prefetch = dict(chunk_size=prefetch_chunk_size, max_cached=prefetch_max_cached,
                             num_workers=prefetch_num_workers)
        self._prefetcher: PrefetchBuffer | None = None
        self.paths = resolve_prompt_paths(paths)
        for path in self.paths:
            check_data_file(path)
        self.buffer_size, self.shuffle, self.seed = buffer_size, shuffle, seed
        fmt = _make_format(input_key, label_key, metadata_key, tool_key, apply_chat_template,
                           apply_chat_template_kwargs, system_prompt, multimodal_keys, custom_prompt_fn)
        self._pipeline = _RowPipeline(fmt, tokenizer, max_prompt_len=max_prompt_len, skip_malformed=skip_malformed,
                                      media_length=media_length)
        self._num_rows: int | None = None
        self._start_epoch(0, position=0)

    @property
    def num_skipped(self) -> int:
        return self._pipeline.num_skipped

    @property
    def num_too_long(self) -> int:
        return self._pipeline.num_too_long

    def __len__(self) -> int:
        if self._num_rows is None:
            self._num_rows = sum(count_rows(path) for path in self.paths)
        return self._num_rows

    def _epoch_records(self, epoch: int) -> Iterator[tuple[RowLocation, str | dict]]:
        records = itertools.chain.from_iterable(iter_raw_records(path) for path in self.paths)
        if not self.shuffle:
            return records
        return _shuffle_buffer(records, self.buffer_size, random.Random(self.seed + epoch))

    def _start_epoch(self, epoch: int, *, position: int) -> None:
        self.close()
        self.epoch, self.position = epoch, 0
        records = self._epoch_records(epoch)
        self._produced_in_epoch = position > 0
        for _ in itertools.islice(records, position):  # replay without formatting
            self.position += 1
        if self.position != position:
            raise ValueError(f"streaming dataset position {position} is past the end of epoch {epoch} "
                             f"({self.position} rows); the checkpoint was written for a different dataset")
        if self.multimodal_keys and self.prefetch["max_cached"] > 0:
            self._prefetcher = PrefetchBuffer(records, self._load, **self.prefetch)
            self._records = self._prefetcher
        else:
            self._records = map(self._load, records)

    def _load(self, record: tuple[RowLocation, str | dict]) -> tuple[RowLocation, dict | DataError]:
        """Decode a raw record and, with multimodal keys, load its media (see `prefetch`)."""
        location, payload = record
        row = decode_record(location, payload)
        if self.multimodal_keys and not isinstance(row, DataError):
            try:
                row = load_row_media(row, self.multimodal_keys, self.media_pipelines)
            except ValueError as exc:
                row = DataError(f"{location}: {exc}; fix the row or the file it names")
        return location, row

    @property
    def prefetch_stats(self) -> dict[str, int]:
        """Rows loaded ahead, rows cached now and the peak (zeros without prefetching)."""
        p = self._prefetcher
        return {"loaded": p.loaded, "cached": p.cached(), "peak_cached": p.peak_cached} if p else \
            {"loaded": 0, "cached": 0, "peak_cached": 0}

    def close(self) -> None:
        """Stop the current epoch's prefetch thread (a new one starts with the next epoch)."""
        if getattr(self, "_prefetcher", None) is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def take(self, count: int) -> list[Sample]:
        """The next `count` prompt samples, crossing into the next epoch when the files run out."""
        samples: list[Sample] = []
        while len(samples) < count:
            record = next(self._records, None)
            if record is None:
                self._finish_epoch()
                continue
            self.position += 1
            sample = self._pipeline(*record)
            if sample is not None:
                samples.append(sample)
                self._produced_in_epoch = True
        return samples

    def _finish_epoch(self) -> None:
        if not self._produced_in_epoch:
            raise ValueError(f"no usable prompts in {self.paths} (all rows dropped or no rows); check --prompt-data, "
                             "--rollout-max-prompt-len and the skipped-row log")
        self._pipeline.log_summary(f"streaming prompt data, epoch {self.epoch}")
        self._start_epoch(self.epoch + 1, position=0)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start_epoch(int(state["epoch"]), position=int(state["position"]))
