"""Grammar-constrained decoding for the `hf` engine: SGLang's `regex`, `json_schema`, `ebnf` and
`structural_tag` sampling params, compiled and matched by llguidance (no grammar engine of our own).

Why llguidance (and not xgrammar, which SGLang uses by default, or outlines-core): it has no Python
dependencies (xgrammar's wheel requires `triton` on Linux x86_64, a ~1 GB package a CPU install does
not otherwise need), one abi3 wheel for every Python, every SGLang constraint kind (outlines-core has
no context-free grammars, so no `ebnf`), and SGLang serves it too (`--grammar-backend llguidance`).
`bench/grammar_mask.py` measures its mask cost per token against a decode step (docs/backends/hf.md).

Flow:
  1. `parse_constraint(params)` (request validation, no tokenizer): at most one of the four keys,
     the right type; a `Constraint(kind, source)` on the request's `SamplingParams`.
  2. `GrammarCompiler.compile(constraint)` (the engine, bound to its tokenizer): the llguidance
     grammar, validated against the vocabulary and cached; a bad grammar is a ValueError naming the
     key (HTTP 400). The tokenizer must be one whose tokens' texts concatenate to its decoded text
     (byte-level BPE, SentencePiece): a grammar is matched on those bytes.
  3. Per row a `RowGrammar` (an `LLMatcher`). Before each sampling step `mask_logits` sets the
     logits of every token a row's grammar forbids to -inf (one llguidance call fills the bitmasks of
     all constrained rows), so the sampler draws, and reports the log-prob of, the constrained
     distribution. After the step the row's grammar consumes the sampled token; the row ends
     (finish_reason stop, matched = that EOS) when its grammar accepts an EOS, as SGLang's does.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

CONSTRAINT_KEYS = ("regex", "json_schema", "ebnf", "structural_tag")
_LABELS = {"regex": "regular expression", "json_schema": "JSON schema", "ebnf": "EBNF grammar",
           "structural_tag": "structural tag"}
_PROBE_TEXT = 'the cat sat on the mat: {"a": [1, 2.5], "b": "x y"}'  # how a tokenizer spells text
# JSON is generated as `json.dumps` writes it (", " and ": ", no other whitespace; xgrammar's
# separators under SGLang's --constrained-json-disable-any-whitespace): free whitespace lets a weak
# policy loop on blanks until its length runs out. A schema's own
# {"x-guidance": {"whitespace_flexible": true}} turns it back on.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NEEDS_BYTES = ("constrained decoding (regex, json_schema, ebnf, structural_tag) needs a tokenizer whose tokens' "
                "texts concatenate to its decoded text (byte-level BPE or SentencePiece)")
_CACHE_SIZE = 256  # compiled grammars kept per engine (a rollout repeats a few schemas many times)
PARALLEL_ROWS = 64  # constrained rows from which masks are computed on llguidance's thread pool ...
POOL_CPUS = 4  # ... on a machine with this many CPUs (on 2 shared CPUs its hand-offs cost more: 8x, measured)


@dataclass(frozen=True)
class Constraint:
    """One request's grammar: its kind (a `CONSTRAINT_KEYS` entry) and source text (JSON for dicts)."""

    kind: str
    source: str

    @property
    def field(self) -> str:
        return f"sampling_params.{self.kind}"


def parse_constraint(params: dict[str, Any]) -> Constraint | None:
    """The request's constraint (None: unconstrained); ValueError naming the key when malformed."""
    given = [key for key in CONSTRAINT_KEYS if params.get(key) is not None]
    if len(given) > 1:
        raise ValueError(f"sampling_params: give at most one of {', '.join(CONSTRAINT_KEYS)}, got {given}")
    if not given:
        return None
    kind, value = given[0], params[given[0]]
    if kind in ("json_schema", "structural_tag") and isinstance(value, dict):
        return Constraint(kind, json.dumps(value, sort_keys=True))
    if not isinstance(value, str) or not value.strip():
        also = " or a JSON object" if kind in ("json_schema", "structural_tag") else ""
        raise ValueError(f"sampling_params.{kind} must be a non-empty string{also}, got {value!r}")
    return Constraint(kind, value)


def _json_value(constraint: Constraint) -> Any:
    try:
        return json.loads(constraint.source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{constraint.field} is not valid JSON ({exc.msg} at position {exc.pos}): send the "
                         f"{_LABELS[constraint.kind]} as a JSON object or its JSON text") from None


def structural_tag_grammar(constraint: Constraint, specials: dict[str, int] | None = None) -> str:
    """SGLang's structural tag `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}` as a
    Lark grammar: free text in which each trigger starts `begin`, a JSON value of `schema`, `end`.
    `specials`: the tokenizer's special (added) tokens by text; where a begin, end or trigger holds one
    (Qwen's `<tool_call>`) the grammar takes that token, as the policy writes it, not its spelling."""
    tag = _json_value(constraint)
    where = constraint.field
    if not isinstance(tag, dict) or not isinstance(tag.get("structures"), list) or not tag["structures"] \
            or not isinstance(tag.get("triggers"), list) or not tag["triggers"]:
        raise ValueError(f'{where} must be {{"type": "structural_tag", "structures": [{{"begin": str, "schema": '
                         f'object, "end": str}}, ...], "triggers": [str, ...]}} (SGLang\'s form)')
    triggers = [t for t in tag["triggers"] if isinstance(t, str) and t]
    specials = specials or {}
    rules = []
    for i, item in enumerate(tag["structures"]):
        if not isinstance(item, dict) or not isinstance(item.get("begin"), str) or not isinstance(item.get("end"), str):
            raise ValueError(f"{where}.structures[{i}] needs a string 'begin' and 'end' and a 'schema' object")
        schema = item.get("schema", {})
        if not isinstance(schema, dict):
            raise ValueError(f"{where}.structures[{i}].schema must be a JSON schema object")
        trigger = next((t for t in triggers if item["begin"].startswith(t)), None)
        if trigger is None:
            raise ValueError(f"{where}.structures[{i}].begin {item['begin']!r} starts with none of the triggers "
                             f"{triggers}: each begin must start with a trigger")
        body = " ".join([_lark_text(item["begin"][len(trigger):], specials),
                         "%json " + json.dumps({"x-guidance": COMPACT_JSON, **schema}),  # (its own x-guidance wins)
                         _lark_text(item["end"], specials)])
        if trigger in specials:  # a token: free text stops where the policy writes it
            rules.append(f"tag_{i}: TAG_TEXT {_lark_text(trigger, specials)} {body}")
        else:  # a string: the free text's first occurrence of it starts the tag (a lazy lexeme)
            rules += [f"tag_{i}_trigger[lazy]: TAG_TEXT {json.dumps(trigger)}", f"tag_{i}: tag_{i}_trigger {body}"]
    options = " | ".join(f"tag_{i}" for i in range(len(tag["structures"])))
    return "\n".join(["%llguidance {}", f"start: ({options})* TAG_TEXT", r"TAG_TEXT: /(.|\n)*/", *rules]) + "\n"


def _lark_text(text: str, specials: dict[str, int]) -> str:
    """`text` as a sequence of Lark atoms: quoted strings, and `<[id]>` for each special token in it."""
    atoms, rest = [], text
    while rest:
        at, token = min(((rest.find(t), t) for t in specials if t in rest), default=(-1, ""))
        if at < 0:
            atoms.append(json.dumps(rest))
            break
        if at:
            atoms.append(json.dumps(rest[:at]))
        atoms.append(f"<[{specials[token]}]>")
        rest = rest[at + len(token):]
    return " ".join(atoms)


def grammar_text(constraint: Constraint, specials: dict[str, int] | None = None) -> str:
    """The llguidance grammar of a constraint (not yet checked against a vocabulary; `specials`:
    `structural_tag_grammar`'s)."""
    import llguidance

    kind = constraint.kind
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(constraint.source)
    if kind == "json_schema":
        schema = _json_value(constraint)
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"{constraint.field} must be a JSON schema (an object), got {type(schema).__name__}")
        return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=COMPACT_JSON)
    if kind == "ebnf":  # GBNF / SGLang's EBNF (`root ::= ...`) or Lark (`start: ...`)
        try:
            return llguidance.grammar_from("ebnf", constraint.source)
        except ValueError as exc:
            raise ValueError(f"{constraint.field}: invalid EBNF grammar: {exc}") from None
    return llguidance.LLMatcher.grammar_from_lark(structural_tag_grammar(constraint, specials))


def _first_lines(message: str, n: int = 3) -> str:
    return " | ".join(line.strip() for line in message.strip().splitlines()[:n] if line.strip())


class RowGrammar:
    """One row's matcher: the tokens its grammar allows next, and whether it has ended (EOS taken)."""

    def __init__(self, matcher: Any, compiler: GrammarCompiler):
        self.matcher, self.compiler, self.eos_ids = matcher, compiler, compiler.eos_ids
        self.terminated = False

    def accept(self, token: int) -> None:
        """Consume the sampled token (always one the mask allowed)."""
        self.matcher.consume_token(token)
        if token in self.eos_ids:
            self.terminated = True


class GrammarCompiler:
    """The engine's grammar compiler: llguidance's view of the tokenizer, and compiled grammars cached."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_ids = frozenset(int(t) for t in eos_token_ids)
        self._ll_tokenizer: Any = None
        self._executor: Any = None
        self._lock = threading.Lock()
        self.threads = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 16)
        self.compile = functools.lru_cache(maxsize=_CACHE_SIZE)(self._compile)

    def ll_tokenizer(self) -> Any:
        """llguidance's tokenizer (built on first use: ~1 s for a 150k vocabulary); ValueError when the
        tokenizer's tokens do not spell its text (grammars are matched on token bytes)."""
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = self._build_ll_tokenizer()
            return self._ll_tokenizer

    def _build_ll_tokenizer(self) -> Any:
        import llguidance.hf
        from transformers import PreTrainedTokenizerFast

        if not isinstance(self.tokenizer, PreTrainedTokenizerFast):
            raise ValueError("constrained decoding needs a fast (Rust `tokenizers`) tokenizer; this model's is "
                             f"{type(self.tokenizer).__name__}: serve it with a tokenizer.json")
        n_vocab = max(self.vocab_size, len(self.tokenizer))
        try:
            ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=n_vocab, eos_token=sorted(self.eos_ids) or None)
        except (ValueError, RuntimeError, TypeError) as exc:  # e.g. a word-level decoder it cannot map to bytes
            raise ValueError(f"{_NEEDS_BYTES}; llguidance cannot read this model's tokenizer: {exc}") from None
        probe = self.tokenizer.encode(_PROBE_TEXT, add_special_tokens=False)
        ours, theirs = self.tokenizer.decode(probe), ll.decode_str(probe)
        if ours != theirs:
            raise ValueError(f"{_NEEDS_BYTES}; this model's tokenizer decodes tokens as {ours[:40]!r}, their texts "
                             f"join to {theirs[:40]!r}")
        return ll

    def _compile(self, constraint: Constraint) -> str:
        from llguidance import LLMatcher

        grammar = grammar_text(constraint, self.special_tokens())
        error = LLMatcher.validate_grammar(grammar, self.ll_tokenizer())
        if error:
            raise ValueError(f"{constraint.field}: invalid {_LABELS[constraint.kind]}: {_first_lines(error)}")
        return grammar

    def special_tokens(self) -> dict[str, int]:
        """The tokenizer's added tokens that llguidance reads as special (not text), by their text."""
        ll = self.ll_tokenizer()
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        return {str(token): int(i) for i, token in added.items() if i < ll.vocab_size and ll.is_special_token(i)}

    def row_grammar(self, constraint: Constraint) -> RowGrammar:
        """A fresh matcher for one row (ValueError: the grammar does not compile)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.ll_tokenizer(), self.compile(constraint), log_level=0)
        if matcher.is_error():
            raise ValueError(f"{constraint.field}: invalid {_LABELS[constraint.kind]}: "
                             f"{_first_lines(matcher.get_error())}")
        return RowGrammar(matcher, self)

    def executor(self) -> Any:
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor(num_threads=self.threads)
        return self._executor


def allowed_bits(grammars: Sequence[RowGrammar], vocab: int) -> torch.Tensor:
    """The grammars' next-token bitmasks, int32 [G, ceil(vocab / 32)] on the CPU (bit t of a row:
    token t allowed), filled by llguidance (on its thread pool for many rows). A row whose grammar
    allows nothing (an error state) may only end: its EOS bits are set."""
    compiler = grammars[0].compiler
    words = (vocab + 31) // 32
    bits_GW = torch.zeros((len(grammars), words), dtype=torch.int32)
    if len(grammars) >= PARALLEL_ROWS and compiler.threads >= POOL_CPUS:  # llguidance's thread pool
        compiler.executor().unsafe_compute_mask_ptr([(g.matcher, k) for k, g in enumerate(grammars)],
                                                    bits_GW.data_ptr(), words * 4, len(grammars))
    else:  # a few rows: in this thread (a pool's hand-off costs more than their masks)
        for k, g in enumerate(grammars):
            g.matcher.unsafe_compute_mask_ptr(bits_GW[k].data_ptr(), words * 4)
    words_GW = bits_GW.numpy().view("uint32")  # (shares bits_GW's memory)
    for k in (bits_GW == 0).all(dim=1).nonzero()[:, 0].tolist():
        for eos in (t for t in compiler.eos_ids if t < vocab):
            words_GW[k, eos // 32] |= 1 << (eos % 32)
    return bits_GW


def unpack_bits(bits_GW: torch.Tensor, vocab: int, device: torch.device) -> torch.Tensor:
    """Bitmasks -> bool [G, vocab] on `device`: numpy's unpackbits on the CPU (10x torch's shifts);
    on a GPU the packed bits travel (32x fewer bytes) and are shifted apart there."""
    if device.type == "cpu":
        import numpy as np

        bytes_GB = bits_GW.numpy().view(np.uint8)  # little-endian words: bit t is byte t // 8, bit t % 8
        return torch.from_numpy(np.unpackbits(bytes_GB, axis=1, bitorder="little")[:, :vocab].view(np.bool_))
    return unpack_bits_by_shifts(bits_GW.to(device, non_blocking=True), vocab)


def unpack_bits_by_shifts(bits_GW: torch.Tensor, vocab: int) -> torch.Tensor:
    """`unpack_bits` on the bits' own device, by torch shifts (the GPU's way; tested on the CPU
    against numpy's). Bit 31 of a negative int32 word survives the arithmetic shift's `& 1`."""
    shifts_32 = torch.arange(32, dtype=torch.int32, device=bits_GW.device)
    return ((bits_GW[:, :, None] >> shifts_32) & 1).reshape(bits_GW.shape[0], -1)[:, :vocab].bool()


def allowed_tokens(grammars: Sequence[RowGrammar], vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Which tokens each grammar allows next: bool [G, vocab] on `device`."""
    return unpack_bits(allowed_bits(grammars, vocab), vocab, torch.device(device))


def mask_logits(logits_BV: torch.Tensor, positions: Sequence[int], grammars: Sequence[RowGrammar]) -> None:
    """Set, in place, the logits a row's grammar forbids to -inf (rows at batch `positions`)."""
    allowed_GV = allowed_tokens(grammars, logits_BV.shape[1], logits_BV.device)
    if len(positions) == logits_BV.shape[0]:  # every row constrained (positions are in order)
        logits_BV.masked_fill_(~allowed_GV, float("-inf"))
        return
    index_G = torch.tensor(list(positions), dtype=torch.long, device=logits_BV.device)
    rows_GV = logits_BV.index_select(0, index_G).masked_fill_(~allowed_GV, float("-inf"))
    logits_BV.index_copy_(0, index_G, rows_GV)
