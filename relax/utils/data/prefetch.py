"""Multimodal prefetching for the streaming dataset: media loaded ahead of use, in a bounded cache.

With `--use-streaming-dataset` and `--multimodal-keys`, every media item of a row is loaded
before the row becomes a prompt (`load_row_media`): an image is decoded to an RGB `uint8`
tensor `[H, W, 3]` (a plain tensor, so samples stay checkpointable and any HF image processor
takes it); video and audio are read into `bytes` (decoding them needs FFmpeg-class libraries,
left to the processor). Items may be a file path (or `file://` URL), an `http(s)://` URL, a
`data:...;base64,` URI, raw bytes, or an HF datasets-style `{"bytes": ..., "path": ...}` struct
(`relax.utils.multimodal.sources`); an already-loaded tensor passes through. Given the media
pipelines (`relax.utils.multimodal`), media are resized / sampled / resampled per the flags.

`PrefetchBuffer` does that loading off the consumer's thread: a background thread pulls up to
`--prefetch-chunk-size` records from the source, has `--prefetch-num-workers` threads load them,
and appends the results, in source order, to a cache of at most `--prefetch-max-cached` entries;
when the cache is full it waits until the consumer takes some. Errors are delivered in order:
the consumer gets the exception at the position of the record that caused it.
"""

from __future__ import annotations

import io
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Generic, Iterator, TypeVar

from relax.utils.multimodal.sources import read_bytes

T = TypeVar("T")
R = TypeVar("R")


def _item_bytes(item: Any, kind: str) -> bytes:
    """The raw bytes of a media item (path, file:// / http(s):// URL, data: URI, bytes or {"bytes"|"path"})."""
    return read_bytes(item, kind)


def load_image(item: Any) -> Any:
    """An image item -> RGB uint8 tensor [H, W, 3]."""
    import numpy as np
    import torch
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, torch.Tensor):
        return item
    data = _item_bytes(item, "image")
    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"image {_describe(item)}: not a decodable image ({exc})") from exc
    return torch.from_numpy(rgb.copy())  # [H, W, 3]


def load_raw(item: Any) -> Any:
    """A video/audio item -> its bytes (decoding is left to the model's processor)."""
    return _item_bytes(item, "media")


MEDIA_LOADERS: dict[str, Callable[[Any], Any]] = {"image": load_image, "video": load_raw, "audio": load_raw}


def _describe(item: Any) -> str:
    return repr(item) if isinstance(item, str) else f"<{type(item).__name__}>"


def load_row_media(row: dict, multimodal_keys: dict[str, str], pipelines: dict[str, Any] | None = None) -> dict:
    """A copy of `row` whose multimodal columns hold loaded media (ValueError naming the column).

    With `pipelines` (`relax.utils.multimodal.build_pipelines`), a modality that has one is
    processed by it instead: images resized, videos frame-sampled ([T, H, W, 3]), audio resampled
    and cut ([T] float32), per the multimodal flags."""
    out = dict(row)
    for kind, column in multimodal_keys.items():
        value = out.get(column)
        if value is None:
            continue
        if kind not in MEDIA_LOADERS:
            raise ValueError(f"--multimodal-keys: unknown type {kind!r}; known types are {sorted(MEDIA_LOADERS)}")
        if hasattr(value, "tolist") and not _is_tensor(value):  # numpy arrays from pandas-written parquet
            value = value.tolist()
        items = value if isinstance(value, (list, tuple)) else [value]
        load = pipelines[kind].process if pipelines and kind in pipelines else MEDIA_LOADERS[kind]
        try:
            out[column] = [_loaded_tensor(load(item)) for item in items]
        except ValueError as exc:
            raise ValueError(f"column {column!r}: {exc}") from exc
    return out


def _loaded_tensor(loaded: Any) -> Any:
    """A pipeline result -> its tensor (samples keep plain tensors); loader results pass through."""
    for name in ("pixels", "frames", "waveform"):
        if hasattr(loaded, name) and not isinstance(loaded, dict):
            return getattr(loaded, name)
    return loaded


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch")


class _Failed:
    """An exception travelling through the cache to the consumer, in order."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class PrefetchBuffer(Generic[T, R]):
    """`fn(record)` for each record of `source`, computed ahead in a bounded, ordered cache.

    Iterate it like the source. `close()` stops the background thread (also done at the end).
    Counters: `loaded` (records processed), `peak_cached` (largest cache size seen).
    """

    def __init__(self, source: Iterator[T], fn: Callable[[T], R], *, chunk_size: int = 32,
                 max_cached: int = 256, num_workers: int = 1) -> None:
        for flag, value in (("--prefetch-chunk-size", chunk_size), ("--prefetch-max-cached", max_cached),
                            ("--prefetch-num-workers", num_workers)):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1 for a prefetch buffer, got {value}")
        self._source, self._fn = source, fn
        self.chunk_size, self.max_cached = chunk_size, max_cached
        self._cache: deque = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.loaded = 0
        self.peak_cached = 0
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="relax-prefetch-worker")
        self._thread = threading.Thread(target=self._run, name="relax-prefetch", daemon=True)
        self._thread.start()

    # ---- background thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                room = self._wait_for_room()
                if room == 0:
                    return  # closed
                chunk, read_error = self._next_chunk(room)
                futures = [self._pool.submit(self._fn, record) for record in chunk]
                self._push([_Failed(f.exception()) if f.exception() is not None else f.result() for f in futures])
                if read_error is not None:  # the consumer gets it after the rows read before it
                    self._push([_Failed(read_error), _END])
                    return
                if len(chunk) < room:
                    self._push([_END])
                    return
        finally:
            self._pool.shutdown(wait=False)

    def _wait_for_room(self) -> int:
        with self._cond:
            while not self._closed and len(self._cache) >= self.max_cached:
                self._cond.wait()
            return 0 if self._closed else min(self.chunk_size, self.max_cached - len(self._cache))

    def _next_chunk(self, size: int) -> tuple[list[T], BaseException | None]:
        """Up to `size` records, and the error that stopped reading early (None: no error)."""
        chunk: list[T] = []
        try:
            for record in self._source:
                chunk.append(record)
                if len(chunk) == size:
                    break
        except Exception as exc:  # delivered to the consumer in order, not lost in this thread
            return chunk, exc
        return chunk, None

    def _push(self, items: list) -> None:
        with self._cond:
            self._cache.extend(items)
            self.loaded += sum(item is not _END for item in items)
            self.peak_cached = max(self.peak_cached, sum(item is not _END for item in self._cache))
            self._cond.notify_all()

    # ---- consumer ------------------------------------------------------------------------
    def __iter__(self) -> PrefetchBuffer[T, R]:
        return self

    def __next__(self) -> R:
        with self._cond:
            while not self._cache:
                if self._closed:
                    raise StopIteration
                self._cond.wait()
            item = self._cache.popleft()
            if item is _END:
                self._cache.appendleft(_END)  # stay exhausted
                raise StopIteration
            self._cond.notify_all()
        if isinstance(item, _Failed):
            raise item.error
        return item

    def cached(self) -> int:
        with self._cond:
            return sum(item is not _END for item in self._cache)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cache.clear()
            self._cond.notify_all()
        self._thread.join(timeout=10)
