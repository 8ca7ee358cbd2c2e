"""Multimodal prefetch: ordered results, a bounded cache, errors in order, media loading, and the
streaming dataset reading images ahead (same samples as without prefetching)."""

from __future__ import annotations

import io
import threading
import time

import pytest
import torch
from prompt_data_helpers import write_jsonl

from relax.utils.data import DataError, StreamingPromptDataset
from relax.utils.data.prefetch import PrefetchBuffer, load_image, load_raw, load_row_media


def wait_for(predicate, timeout=10.0):
    """Poll a condition (not a timing assumption): True once it holds, False after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def png_bytes(color=(255, 0, 0), size=(3, 2)):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_results_come_in_source_order_from_several_workers():
    threads = set()

    def square(x):
        threads.add(threading.current_thread().name)
        return x * x

    buffer = PrefetchBuffer(iter(range(50)), square, chunk_size=8, max_cached=16, num_workers=4)
    assert list(buffer) == [x * x for x in range(50)]
    assert buffer.loaded == 50 and all(name.startswith("relax-prefetch-worker") for name in threads)
    with pytest.raises(StopIteration):
        next(buffer)  # stays exhausted


def test_the_cache_never_holds_more_than_max_cached_and_the_source_waits():
    pulled = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield i

    buffer = PrefetchBuffer(source(), lambda x: x, chunk_size=4, max_cached=10, num_workers=2)
    assert wait_for(lambda: buffer.cached() == 10)
    assert len(pulled) == 10 and buffer.peak_cached == 10  # the producer stopped reading at the bound
    assert [next(buffer) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert wait_for(lambda: len(pulled) == 15)  # consumption frees room, prefetching resumes
    assert buffer.peak_cached <= 10
    buffer.close()
    assert not buffer._thread.is_alive()


def test_an_error_reaches_the_consumer_at_its_position():
    def fn(x):
        if x == 2:
            raise ValueError("bad item 2")
        return x

    buffer = PrefetchBuffer(iter(range(5)), fn, chunk_size=5, max_cached=5, num_workers=2)
    assert [next(buffer), next(buffer)] == [0, 1]
    with pytest.raises(ValueError, match="bad item 2"):
        next(buffer)
    assert list(buffer) == [3, 4]


def test_a_failing_source_is_reported_to_the_consumer():
    def source():
        yield 1
        raise OSError("disk gone")

    buffer = PrefetchBuffer(source(), lambda x: x, chunk_size=4, max_cached=8)
    assert next(buffer) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(buffer)


def test_bad_prefetch_sizes_name_the_flag():
    with pytest.raises(ValueError, match="--prefetch-num-workers"):
        PrefetchBuffer(iter([]), lambda x: x, num_workers=0)


def test_images_load_from_paths_bytes_and_structs_as_rgb_tensors(tmp_path):
    path = tmp_path / "red.png"
    path.write_bytes(png_bytes())
    for item in (str(path), f"file://{path}", png_bytes(), {"bytes": png_bytes(), "path": None}, {"path": str(path)}):
        image = load_image(item)
        assert image.dtype == torch.uint8 and tuple(image.shape) == (2, 3, 3)
        assert image[0, 0].tolist() == [255, 0, 0]
    assert load_image(image) is image
    assert load_raw(str(path)) == path.read_bytes()


@pytest.mark.parametrize("item, needle", [
    ("/no/such.png", "cannot read"), ("ftp://x.org/a.png", "unsupported URL scheme"),
    (b"not an image", "not a decodable image"), (3, "expected a path"),
])
def test_bad_media_items_raise_naming_the_item(item, needle):
    with pytest.raises(ValueError, match=needle):
        load_image(item)


def test_load_row_media_names_the_column():
    with pytest.raises(ValueError, match="column 'imgs'"):
        load_row_media({"imgs": ["/no/such.png"]}, {"image": "imgs"})


def image_rows(tmp_path, count):
    rows = []
    for i in range(count):
        path = tmp_path / f"img{i}.png"
        path.write_bytes(png_bytes(color=(i, 0, 0)))
        rows.append({"input": f"<image> question {i}", "label": str(i), "images": [str(path)]})
    return rows


def reds(samples):
    return [int(s.multimodal_inputs["image"][0][0, 0, 0]) for s in samples]


@pytest.mark.parametrize("max_cached, workers", [(0, 1), (4, 1), (256, 3)])
def test_streaming_dataset_loads_images_with_or_without_prefetch(tmp_path, max_cached, workers):
    path = write_jsonl(tmp_path / "mm.jsonl", image_rows(tmp_path, 6))
    dataset = StreamingPromptDataset(str(path), label_key="label", multimodal_keys={"image": "images"},
                                     prefetch_chunk_size=2, prefetch_max_cached=max_cached,
                                     prefetch_num_workers=workers)
    samples = dataset.take(8)  # crosses into the second epoch
    assert reds(samples) == [0, 1, 2, 3, 4, 5, 0, 1]
    part = samples[1].prompt[0]["content"][0]
    assert part["type"] == "image" and isinstance(part["image"], torch.Tensor)
    if max_cached:
        assert dataset.prefetch_stats["loaded"] >= 2 and dataset.prefetch_stats["peak_cached"] <= max_cached
    else:
        assert dataset.prefetch_stats == {"loaded": 0, "cached": 0, "peak_cached": 0}
    dataset.close()


def test_prefetching_dataset_resumes_at_its_saved_position(tmp_path):
    path = write_jsonl(tmp_path / "mm.jsonl", image_rows(tmp_path, 6))
    kwargs = dict(label_key="label", multimodal_keys={"image": "images"}, prefetch_chunk_size=4)
    first = StreamingPromptDataset(str(path), **kwargs)
    first.take(3)
    state = first.state_dict()
    rest = reds(first.take(3))
    resumed = StreamingPromptDataset(str(path), **kwargs)
    resumed.load_state_dict(state)
    assert state == {"epoch": 0, "position": 3} and reds(resumed.take(3)) == rest == [3, 4, 5]


def test_a_missing_image_is_a_data_error_naming_the_row_or_is_skipped(tmp_path):
    rows = image_rows(tmp_path, 3)
    rows[1]["images"] = [str(tmp_path / "missing.png")]
    path = write_jsonl(tmp_path / "mm.jsonl", rows)
    kwargs = dict(label_key="label", multimodal_keys={"image": "images"})
    with pytest.raises(DataError, match=r"mm.jsonl \(line 2\).*missing.png.*--skip-malformed-rows"):
        StreamingPromptDataset(str(path), **kwargs).take(3)
    skipping = StreamingPromptDataset(str(path), skip_malformed=True, **kwargs)
    assert reds(skipping.take(2)) == [0, 2] and skipping.num_skipped == 1


def test_samples_with_loaded_images_stay_checkpointable(tmp_path):
    path = write_jsonl(tmp_path / "mm.jsonl", image_rows(tmp_path, 1))
    sample = StreamingPromptDataset(str(path), multimodal_keys={"image": "images"}).take(1)[0]
    torch.save(sample.to_dict(), tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert torch.equal(loaded["multimodal_inputs"]["image"][0], sample.multimodal_inputs["image"][0])
