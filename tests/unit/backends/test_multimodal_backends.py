"""Vision-language and omni rows through the CPU backends: the hf engine (image_data / audio_data on
/generate, batched with text rows) and the fsdp trainer (encoder tensors from TransferQueue's bytes,
padded micro-batches) give the same per-token log-probs of the same sample (fp32, < 1e-4), for a
tiny Qwen2.5-VL, a tiny Qwen3-VL and a tiny Qwen3-Omni thinker (image rows, an audio row, an audio
+ image row, a video row, a text row); a training step on those rows moves the media encoders too."""

from __future__ import annotations

import asyncio

import pytest
import torch

from relax.algorithms.policy_loss import PolicyLossConfig
from relax.backends.base import TrainerSpec
from relax.config.schema import BatchConfig, OptimizerConfig
from relax.distributed import transfer_queue as tq
from relax.distributed.ray.actor_group import free_port
from relax.types import Sample, TrainBatch

TEMPERATURE = 0.8
CONTENTS = {"vl": ["<image>which cell is red?", "<image>and this one<image>?", "no image here", "<video>what moves?"],
            "qwen3_omni": ["<audio>is the second tone higher?", "<audio>and this one<image>?", "no media here",
                           "<video>what moves?"]}
ENCODER = {"vl": ".visual.", "qwen3_omni": ".audio_tower."}  # the tower a step on these rows must move


def images(seed: int, n: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, size=(int(rng.integers(40, 90)), int(rng.integers(40, 90)), 3),
                                         dtype=np.uint8)) for _ in range(n)]


def tones(seed: int, n: int):
    """n sine tones of different lengths (float32 waveforms at 16 kHz, as the loader gives them)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(0.4 * np.sin(2 * np.pi * rng.uniform(200, 800) * np.arange(int(16000 * rng.uniform(0.4, 1.6))) / 16000)
             ).astype(np.float32) for _ in range(n)]


def clips(seed: int, n: int):
    """n videos: 10 frames of a square moving over noise, at 5 fps (2 s: the pipeline keeps 4)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        frames = rng.integers(0, 256, size=(10, 50, 70, 3), dtype=np.uint8)
        for t in range(10):
            frames[t, 10:30, 5 * t:5 * t + 20] = 255
        out.append({"frames": list(frames), "fps": 5})
    return out


def video_pipelines(processor):
    """The video pipeline at small per-frame bounds (4..8 tokens) in the model's units."""
    from relax.utils.multimodal import VideoConfig, VideoPipeline

    return {"video": VideoPipeline(VideoConfig(min_tokens=4, max_tokens=8, patch_size=processor.video.patch_size,
                                               merge_size=processor.video.merge_size))}


def family(model_dir: str) -> str:
    return "qwen3_omni" if "qwen3_omni" in model_dir else "vl"


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "qwen3_omni"])
def model_dir(request, tmp_path_factory):
    from relax.utils.tiny_model import train_chatml_tokenizer
    from relax.utils.tiny_multimodal import build_tiny_omni, build_tiny_vl

    tokenizer = train_chatml_tokenizer(["which cell is red? and this one no image here is the second tone higher?"]
                                       * 10, vocab_size=300)
    out = str(tmp_path_factory.mktemp(request.param))
    if request.param == "qwen3_omni":
        return build_tiny_omni(tokenizer, out)
    return build_tiny_vl(request.param, tokenizer, out)


def encode(model_dir: str):
    """The rollout side: chat template, placeholders expanded, encoder tensors, image_data / audio_data."""
    from relax.utils.multimodal.items import through_pipelines
    from relax.utils.multimodal.processor import MultimodalProcessor

    processor = MultimodalProcessor(model_dir)
    out = []
    for i, content in enumerate(CONTENTS[family(model_dir)]):
        text = processor.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                       add_generation_prompt=True)
        media = {"image": images(i, content.count("<image>")), "audio": tones(i, content.count("<audio>")),
                 "video": clips(i, content.count("<video>"))}
        out.append(processor.encode(text, through_pipelines(media, video_pipelines(processor))))
    return out


def generate(model_dir: str, encoded):
    """One batched /generate request (SGLang's fields) through an in-process HFEngine."""
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateRequest, normalize_generate

    async def run():
        engine = HFEngine(model_dir, seed=0)
        req = GenerateRequest(input_ids=[e.input_ids for e in encoded],
                              image_data=[e.request.get("image_data") for e in encoded],
                              audio_data=[e.request.get("audio_data") for e in encoded],
                              video_data=[e.request.get("video_data") for e in encoded], return_logprob=True,
                              sampling_params=[dict(temperature=TEMPERATURE, max_new_tokens=12 + 3 * i,
                                                    ignore_eos=True, sampling_seed=i) for i in range(len(encoded))])
        items, _ = normalize_generate(req, engine.tokenizer, vocab_size=engine.vocab_size,
                                      max_context_len=engine.max_context_len)
        await engine.start()
        try:
            return await engine.generate(items)
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_engine_and_trainer_log_probs_agree_on_media_rows(model_dir):
    from relax.backends.trainer.trainer import Trainer
    from relax.utils.multimodal.processor import MultimodalProcessor

    torch.manual_seed(0)
    encoded = encode(model_dir)
    counts = [tuple(len(e.request.get(f"{m}_data", [])) for m in ("image", "audio", "video")) for e in encoded]
    assert counts == ([(1, 0, 0), (2, 0, 0), (0, 0, 0), (0, 0, 1)] if family(model_dir) == "vl" else
                      [(0, 1, 0), (1, 1, 0), (0, 0, 0), (0, 0, 1)])
    assert encoded[3].tensors["video_grid_thw"].tolist() == [[2, 4, 4]]  # 4 frames kept, 2 temporal slices
    results = generate(model_dir, encoded)
    media_ids = set(MultimodalProcessor(model_dir).media_token_ids)
    assert media_ids and not any(t in media_ids for r in results for t in r.output_ids)  # never sampled
    samples = [Sample(index=i, tokens=e.input_ids + r.output_ids, response_length=len(r.output_ids),
                      multimodal_train_inputs=e.tensors or None, rollout_log_probs=r.output_logprobs)
               for i, (e, r) in enumerate(zip(encoded, results))]
    media = tq.media_bytes(tq.media_column(samples).unbind())  # through the data plane's column
    assert media[2] == b"" and media[0] and media[1] and media[3]
    spec = TrainerSpec(model_path=model_dir, optim=OptimizerConfig(lr=1e-2), batch=BatchConfig(micro_batch_size=3),
                       loss=PolicyLossConfig(), temperature=TEMPERATURE, threads=1)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        trainer = worker.compute_log_probs([s.tokens for s in samples], [s.response_length for s in samples], media)
        for s, lp in zip(samples, trainer):
            assert len(lp) == s.response_length
            diff = (torch.tensor(lp) - torch.tensor(s.rollout_log_probs)).abs().max().item()
            assert diff < 1e-4, f"row {s.index}: engine vs trainer log-probs differ by {diff}"
        # Without the media the same tokens score differently: the trainer really used them.
        for row in (0, 3):
            blind = worker.compute_log_probs([samples[row].tokens], [samples[row].response_length])
            assert (torch.tensor(blind[0]) - torch.tensor(trainer[row])).abs().max().item() > 1e-3
        lengths = [s.response_length for s in samples]
        batch = TrainBatch(tokens_RL=[s.tokens for s in samples], response_lengths_R=lengths,
                           loss_masks_RT=[[1] * n for n in lengths],
                           advantages_RT=[[[1.0, -1.0, 0.5, -0.5][i]] * n for i, n in enumerate(lengths)],
                           old_log_probs_RT=trainer, multimodal_train_inputs_RB=media)
        tower = ENCODER[family(model_dir)]
        visual = {n: p.detach().clone() for n, p in worker.runner.model.named_parameters() if tower in f".{n}"}
        assert visual
        metrics = worker.train(batch, 1, [sum(lengths)])
        assert metrics["grad_norm"] > 0
        moved = [n for n, p in worker.runner.model.named_parameters() if n in visual and not torch.equal(p, visual[n])]
        assert moved, f"the encoder ({tower}) did not train"
    finally:
        worker.shutdown()


def test_rope_positions_ignore_padding_and_follow_each_rows_images(model_dir):
    """Rows batched with left or right padding get the positions they get alone."""
    from relax.utils.multimodal.models import load_model, rope_positions
    from relax.utils.multimodal.tensors import collate

    model = load_model(model_dir, dtype=torch.float32)
    encoded = encode(model_dir)
    alone = []
    for e in encoded:
        ids = torch.tensor([e.input_ids])
        alone.append(rope_positions(model, ids, torch.ones_like(ids), e.tensors)[:, 0])
    width = max(len(e.input_ids) for e in encoded) + 2
    tensors = collate([e.tensors for e in encoded])
    for left in (False, True):
        ids = torch.zeros((len(encoded), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, e in enumerate(encoded):
            span = slice(width - len(e.input_ids), width) if left else slice(0, len(e.input_ids))
            ids[b, span], mask[b, span] = torch.tensor(e.input_ids), 1
        batched = rope_positions(model, ids, mask, tensors)
        for b in range(len(encoded)):
            assert torch.equal(batched[:, b, mask[b].bool()], alone[b])
    with_image = next(i for i, c in enumerate(CONTENTS[family(model_dir)]) if "<image>" in c)
    assert not torch.equal(alone[with_image][1], alone[with_image][2])  # image tokens sit on a 2-D (h, w) grid
    video = torch.tensor(encoded[3].input_ids) == model.config.video_token_id
    assert not torch.equal(alone[3][1, video], alone[3][2, video])  # and video tokens too


def test_multi_turn_media_carry_over(model_dir):
    """An observation with a new image and a video (omni: an audio clip too, after an audio + image prompt)
    mid-episode
    (MediaContext): the second /generate carries every item so far, and the trainer, given the
    merged tensors, scores every model-written token as the engine did."""
    from relax.backends.trainer.trainer import Trainer
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.multimodal.turns import MediaContext

    processor = MultimodalProcessor(model_dir)
    first, second = images(7, 2)
    omni = family(model_dir) == "qwen3_omni"
    content = ("<audio>" if omni else "") + "<image>which cell is red?"
    text = processor.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                   add_generation_prompt=True)
    sample = Sample(index=0, multimodal_inputs={"image": [first], **({"audio": tones(2, 1)} if omni else {})})
    encoded = processor.encode(text, sample.multimodal_inputs)
    sample.tokens, sample.multimodal_train_inputs = list(encoded.input_ids), encoded.tensors
    prompt_len, mask, logps = len(sample.tokens), [], []
    ctx = MediaContext(processor, sample, video_pipelines(processor))
    for turn in range(2):
        enc = type(encoded)(list(sample.tokens), request=ctx.request())
        (result,) = generate(model_dir, [enc])
        sample.tokens += result.output_ids
        mask += [1] * len(result.output_ids)
        logps += result.output_logprobs
        if turn == 0:
            obs = ctx.observe("<|im_end|>\n<|im_start|>user\n<audio><image><video>and now?<|im_end|>\n"
                              "<|im_start|>assistant\n", [second], tones(3, 1), clips(3, 1)) if omni else \
                ctx.observe("<|im_end|>\n<|im_start|>user\n<image><video>and now?<|im_end|>\n"
                            "<|im_start|>assistant\n", [second], videos=clips(3, 1))
            sample.tokens += obs
            mask += [0] * len(obs)
            logps += [0.0] * len(obs)
    assert len(ctx.request()["image_data"]) == 2 and len(sample.multimodal_inputs["image"]) == 2
    assert sample.multimodal_train_inputs["image_grid_thw"].shape[0] == 2
    assert len(ctx.request()["video_data"]) == 1 and sample.multimodal_train_inputs["video_grid_thw"].shape[0] == 1
    if omni:
        assert len(ctx.request()["audio_data"]) == 2 and sample.multimodal_train_inputs["input_features"].shape[0] == 2
    spec = TrainerSpec(model_path=model_dir, optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=1),
                       loss=PolicyLossConfig(), temperature=TEMPERATURE, threads=1)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        media = tq.media_bytes(tq.media_column([sample]).unbind())
        (trainer,) = worker.compute_log_probs([sample.tokens], [len(sample.tokens) - prompt_len], media)
    finally:
        worker.shutdown()
    model_written = [(t, e) for t, e, m in zip(trainer, logps, mask) if m]
    assert len(model_written) == sum(mask) > 0
    assert max(abs(t - e) for t, e in model_written) < 1e-4


def test_freezing_the_media_encoder(model_dir):
    """--freeze-params-name-list visual (audio_tower for the omni model's audio rows): a step on
    media rows moves the rest only."""
    from relax.backends.trainer.trainer import Trainer
    from relax.utils.multimodal.tensors import to_bytes

    encoded = encode(model_dir)[:2]
    tokens = [e.input_ids + [5, 6, 7] for e in encoded]
    media = [to_bytes(e.tensors) for e in encoded]
    frozen = ENCODER[family(model_dir)].strip(".")
    spec = TrainerSpec(model_path=model_dir, optim=OptimizerConfig(lr=1e-2, freeze_params_name_list=[frozen]),
                       batch=BatchConfig(micro_batch_size=2), loss=PolicyLossConfig(), temperature=1.0, threads=1)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        before = {n: p.detach().clone() for n, p in worker.runner.model.named_parameters()}
        old = worker.compute_log_probs(tokens, [3, 3], media)
        batch = TrainBatch(tokens_RL=tokens, response_lengths_R=[3, 3], loss_masks_RT=[[1] * 3] * 2,
                           advantages_RT=[[1.0] * 3, [-1.0] * 3], old_log_probs_RT=old,
                           multimodal_train_inputs_RB=media)
        worker.train(batch, 1, [6])
        changed = {n for n, p in worker.runner.model.named_parameters() if not torch.equal(p, before[n])}
    finally:
        worker.shutdown()
    assert changed and not any(frozen in n for n in changed)


def test_group_samples_share_one_multimodal_prefill(model_dir):
    """n samples of one image (omni: audio) prompt: one prefill through the encoder, then n rows that decode
    apart; each row's log-probs still match a forward of that row alone."""
    from relax.algorithms.logprobs import row_response_log_probs
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateRequest, normalize_generate
    from relax.utils.multimodal.models import load_model, rope_positions

    (encoded,) = encode(model_dir)[:1]

    async def run():
        engine = HFEngine(model_dir, seed=0)
        req = GenerateRequest(input_ids=encoded.input_ids, image_data=encoded.request.get("image_data"),
                              audio_data=encoded.request.get("audio_data"),
                              return_logprob=True, sampling_params=dict(temperature=TEMPERATURE, max_new_tokens=8,
                                                                        ignore_eos=True, n=3, sampling_seed=5))
        items, _ = normalize_generate(req, engine.tokenizer, vocab_size=engine.vocab_size,
                                      max_context_len=engine.max_context_len)
        await engine.start()
        try:
            return await engine.generate(items), engine.decoder.stats.prefill_rows_shared
        finally:
            await engine.stop()

    results, shared = asyncio.run(run())
    assert shared == 2 and len({tuple(r.output_ids) for r in results}) > 1  # one prefill, different samples
    model = load_model(model_dir, dtype=torch.float32)
    for r in results:
        tokens = encoded.input_ids + r.output_ids
        ids = torch.tensor([tokens])
        inputs = {**encoded.tensors, "position_ids": rope_positions(model, ids, torch.ones_like(ids), encoded.tensors)}
        with torch.no_grad():
            alone = row_response_log_probs(model, tokens, len(r.output_ids), TEMPERATURE, "cpu", inputs)
        assert (alone - torch.tensor(r.output_logprobs)).abs().max().item() < 1e-4


def test_engine_takes_audio_only_with_an_audio_encoder(model_dir):
    """has_audio_understanding says so; a VL model answers audio_data with a clear MediaError (a 400)."""
    from relax.backends.hf.engine import HFEngine
    from relax.backends.hf.protocol import GenerateItem
    from relax.backends.hf.sampling import parse_sampling_params
    from relax.utils.multimodal.items import audio_to_data_uri
    from relax.utils.multimodal.sources import MediaError

    engine = HFEngine(model_dir, seed=0)
    omni = family(model_dir) == "qwen3_omni"
    info = engine.info()
    assert info["has_image_understanding"] and info["has_audio_understanding"] == omni
    item = GenerateItem("r", [1, 2], parse_sampling_params({"max_new_tokens": 1}), False,
                        media={"audio": [audio_to_data_uri(tones(0, 1)[0], 16000)]})
    with pytest.raises(MediaError, match="audio pad token" if omni else "audio_data is not supported"):
        engine.media_tensors(item)


def test_audio_in_video_for_the_omni_thinker(model_dir):
    """--use-audio-in-video: a video carrying its audio track becomes one block of video and audio
    pads interleaved by time, laid out as Qwen3-Omni's own processor lays it out; with a standalone
    clip after it, the engine and the trainer score the row alike (the M-RoPE positions come from
    the model's get_rope_index with use_audio_in_video)."""
    from types import SimpleNamespace

    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    from relax.backends.trainer.trainer import Trainer
    from relax.utils.multimodal.items import through_pipelines
    from relax.utils.multimodal.processor import MultimodalProcessor
    from relax.utils.multimodal.sources import MediaError

    if family(model_dir) != "qwen3_omni":
        with pytest.raises(MediaError, match="has no audio encoder"):
            MultimodalProcessor(model_dir, use_audio_in_video=True)
        return
    processor = MultimodalProcessor(model_dir, use_audio_in_video=True)
    text = processor.tokenizer.apply_chat_template([{"role": "user", "content": "<video>what do you hear?<audio>"}],
                                                   tokenize=False, add_generation_prompt=True)
    track, clip = tones(8, 2)
    video = dict(clips(8, 1)[0], audio={"array": track, "sampling_rate": 16000})
    encoded = processor.encode(text, through_pipelines({"video": [video], "audio": [clip]}, video_pipelines(processor)))
    t = encoded.tensors
    counts = processor.audio_token_counts(t)
    assert len(counts) == 2 and len(encoded.request["audio_data"]) == 2  # the video's track first, then the clip
    # Qwen3-Omni's own layout of a video with its audio (its processor's method, on our tensors)
    tok = SimpleNamespace(audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>",
                          video_token="<|video_pad|>", audio_token="<|audio_pad|>",
                          video_processor=SimpleNamespace(merge_size=2))
    rendered = processor.tokenizer.decode(encoded.input_ids)
    assert "<|video_pad|><|audio_pad|>" in rendered and "<|audio_pad|><|video_pad|>" in rendered  # interleaved
    layout = getattr(Qwen3OmniMoeProcessor, "replace_video_with_audio_token", None)  # transformers >= 5.2x
    if layout is not None:
        videos = {"video_grid_thw": t["video_grid_thw"], "video_second_per_grid": t["video_second_per_grid"].tolist()}
        reference = layout(tok, videos, 0, {"num_audio_tokens": counts}, 0,
                           position_id_per_seconds=processor.config.position_id_per_seconds)
        assert "<|vision_start|>" + reference + "<|vision_end|>" in rendered
    (result,) = generate(model_dir, [encoded])
    sample = Sample(index=0, tokens=encoded.input_ids + result.output_ids, response_length=len(result.output_ids),
                    multimodal_train_inputs=t, rollout_log_probs=result.output_logprobs)
    spec = TrainerSpec(model_path=model_dir, optim=OptimizerConfig(lr=1e-3), batch=BatchConfig(micro_batch_size=1),
                       loss=PolicyLossConfig(), temperature=TEMPERATURE, threads=1)
    worker = Trainer(0, 1, "127.0.0.1", free_port(), spec)
    try:
        media = tq.media_bytes(tq.media_column([sample]).unbind())
        (trainer,) = worker.compute_log_probs([sample.tokens], [sample.response_length], media)
    finally:
        worker.shutdown()
    assert (torch.tensor(trainer) - torch.tensor(result.output_logprobs)).abs().max().item() < 1e-4
    with pytest.raises(MediaError, match="video 0 has no audio track"):
        processor.encode(text, through_pipelines({"video": clips(8, 1), "audio": [clip]}, video_pipelines(processor)))
