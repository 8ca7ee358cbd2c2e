"""Programs written with SGLang's frontend language (`sglang.RuntimeEndpoint`, `@sgl.function`,
`sgl.gen`, `sgl.select`) run against the `hf` engine: the frontend's own requests (text prompts,
`stop` / `stop_regex`, penalties at their neutral values, `return_text_in_logprobs`,
`logprob_start_len`, `max_new_tokens: 0` scoring, `/get_model_info`, `/server_info`,
`/flush_cache`) are all served. Skipped only when sglang cannot be imported.

The tiny model's tokenizer is word-level and decodes words joined by single spaces, so a
completion of n tokens is a string of n words.
"""

from __future__ import annotations

import pytest

from relax.backends.hf.launcher import launch_hf_engine
from relax.backends.hf.tiny_model import build_tiny_qwen3

try:
    import sglang as sgl
except ImportError as exc:  # (sglang's import also needs torch's triton)
    pytest.skip(f"sglang's frontend is not importable here: {exc}", allow_module_level=True)

API_KEY = "frontend-key"
QUESTION = "what is one plus one"


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    model_dir = build_tiny_qwen3(tmp_path_factory.mktemp("frontend-model"), seed=0)
    engine = launch_hf_engine(str(model_dir), api_key=API_KEY, num_threads=1,
                              log_path=str(tmp_path_factory.mktemp("frontend-logs") / "engine.log"))
    try:
        engine.wait_ready(120)
        yield sgl.RuntimeEndpoint(engine.url, api_key=API_KEY)
    finally:
        engine.terminate()


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
