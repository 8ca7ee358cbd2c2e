"""Programs written with SGLang's frontend language (`sglang.RuntimeEndpoint`, `@sgl.function`,
`sgl.gen`, `sgl.select`) run against the `hf` engine: the frontend's own requests (text prompts,
`stop` / `stop_regex`, penalties at their neutral values, `return_text_in_logprobs`,
`logprob_start_len`, `max_new_tokens: 0` scoring, `/get_model_info`, `/server_info`,
`/flush_cache`) are all served. Skipped only when sglang cannot be imported.

The tiny model's tokenizer is word-level and decodes words joined by single spaces, so a
completion of n tokens is a string of n words. Streamed runs (`run(stream=True)`, SSE on
`/generate`) and `fork` run on it too; constrained programs (`sgl.gen(regex=...)`,
`sgl.gen(json_schema=...)`) need a tokenizer whose tokens spell its text, so they run on a second
engine with a byte-level BPE (`build_tiny_bpe_qwen3`).
"""

from __future__ import annotations

import json
import re

import pytest

from relax.backends.hf.launcher import launch_hf_engine
from relax.backends.hf.tiny_model import build_tiny_bpe_qwen3, build_tiny_qwen3

try:
    import sglang as sgl
except ImportError as exc:  # (sglang's import also needs torch's triton)
    pytest.skip(f"sglang's frontend is not importable here: {exc}", allow_module_level=True)

API_KEY = "frontend-key"
QUESTION = "what is one plus one"


def _endpoint(tmp_path_factory, build, name: str):
    """An `hf` engine on a tiny model that `build` writes, as SGLang's client sees it."""
    model_dir = build(tmp_path_factory.mktemp(f"frontend-{name}"), seed=0)
    engine = launch_hf_engine(str(model_dir), api_key=API_KEY, num_threads=1,
                              log_path=str(tmp_path_factory.mktemp("frontend-logs") / f"{name}.log"))
    try:
        engine.wait_ready(120)
        yield sgl.RuntimeEndpoint(engine.url, api_key=API_KEY)
    finally:
        engine.terminate()


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    yield from _endpoint(tmp_path_factory, build_tiny_qwen3, "model")


@pytest.fixture(scope="module")
def bpe_backend(tmp_path_factory):
    """A byte-level BPE model: a grammar needs tokens that spell any string."""
    yield from _endpoint(tmp_path_factory, build_tiny_bpe_qwen3, "bpe-model")


@sgl.function
def answer(s, question, stop=None):
    s += "user: " + question + "\n"
    s += "assistant:" + sgl.gen("answer", max_tokens=8, temperature=0, ignore_eos=True, stop=stop)


@sgl.function
def choose(s, question):
    s += "user: " + question + "\nassistant:"
    s += sgl.select("choice", choices=["yes", "no", "two"])


def test_gen_returns_max_tokens_words_and_is_deterministic(backend):
    state = answer.run(question=QUESTION, backend=backend)
    words = state["answer"].split()
    assert len(words) == 8 and state.get_meta_info("answer")["completion_tokens"] == 8
    assert answer.run(question=QUESTION, backend=backend)["answer"] == state["answer"]  # greedy
    assert state.text().endswith(state["answer"])


def test_a_stop_string_ends_the_completion_before_it(backend):
    words = answer.run(question=QUESTION, backend=backend)["answer"].split()
    # A later word that is not part of the text before it (so the stop matches only there).
    k = next(k for k in range(1, len(words)) if words[k] not in " ".join(words[:k]))
    stopped = answer.run(question=QUESTION, stop=[words[k]], backend=backend)
    assert stopped["answer"].strip() == " ".join(words[:k])
    assert stopped.get_meta_info("answer")["finish_reason"]["type"] == "stop"


def test_select_scores_every_choice_through_generate_logprobs(backend):
    sgl.set_default_backend(backend)
    state = choose.run(question=QUESTION)
    assert state["choice"] in ("yes", "no", "two")
    assert choose.run(question=QUESTION)["choice"] == state["choice"]  # scoring is deterministic


def test_the_endpoints_the_frontend_calls(backend):
    assert backend.get_model_name() and backend.model_info["is_generation"] is True
    info = backend.get_server_info()  # GET /server_info
    assert info["context_length"] > 0 and isinstance(info["internal_states"], list)
    backend.flush_cache()


EMAIL = r"[a-z]{1,6}@[a-z]{1,5}\.(com|org)"
ITEM = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                         "count": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "count"], "additionalProperties": False}


@sgl.function
def contact(s):
    s += "contact: " + sgl.gen("email", max_tokens=40, temperature=1.0, regex=EMAIL)


@sgl.function
def item(s):
    s += "item: " + sgl.gen("item", max_tokens=60, temperature=1.0, json_schema=json.dumps(ITEM))


@sgl.function
def two_answers(s, question):
    s += "user: " + question + "\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"assistant {i}:" + sgl.gen("answer", max_tokens=5, temperature=0, ignore_eos=True)
    s += "first:" + forks[0]["answer"] + "\nsecond:" + forks[1]["answer"]


@sgl.function
def one_answer(s, question, i):
    s += "user: " + question + "\n" + f"assistant {i}:" + sgl.gen("answer", max_tokens=5, temperature=0,
                                                                    ignore_eos=True)


def test_regex_and_json_schema_programs_match_their_constraints(bpe_backend):
    emails = contact.run_batch([{}] * 8, backend=bpe_backend)
    assert all(re.fullmatch(EMAIL, state["email"]) for state in emails), [state["email"] for state in emails]
    for state in item.run_batch([{}] * 8, backend=bpe_backend):
        value = json.loads(state["item"])
        assert set(value) == {"name", "count"} and 0 <= value["count"] <= 99 and len(value["name"]) <= 6


def test_a_streamed_run_yields_the_unstreamed_text(backend):
    whole = answer.run(question=QUESTION, backend=backend)["answer"]
    state = answer.run(question=QUESTION, backend=backend, stream=True)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) > 1 and "".join(pieces) == whole  # token by token, same greedy text


def test_fork_runs_each_branch_as_its_own_program(backend):
    state = two_answers.run(question=QUESTION, backend=backend)
    for i, label in enumerate(("first:", "second:")):
        alone = one_answer.run(question=QUESTION, i=i, backend=backend)["answer"]
        assert len(alone.split()) == 5 and f"{label}{alone}" in state.text()
