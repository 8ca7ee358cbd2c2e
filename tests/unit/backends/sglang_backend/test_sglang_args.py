"""`--sglang-<option>` -> SGLang server argv, and SGLang's own parser judging it: what it
accepts, and a typo's message naming the flag as the user wrote it."""

from __future__ import annotations

import pytest

from relax.backends.sglang.args import normalize_options, server_argv


def test_options_become_kebab_flags_true_bare_lists_repeated():
    argv = server_argv("/models/qwen", "127.0.0.1", 30000,
                       {"mem_fraction_static": 0.8, "enable_deterministic_inference": True,
                        "cuda_graph_bs": [1, 2, 4], "attention_backend": "fa3"})
    assert argv == ["--model-path", "/models/qwen", "--host", "127.0.0.1", "--port", "30000",
                    "--mem-fraction-static", "0.8", "--enable-deterministic-inference",
                    "--cuda-graph-bs", "1", "2", "4", "--attention-backend", "fa3"]


def test_false_and_none_leave_the_option_to_sglangs_default():
    argv = server_argv("/m", "127.0.0.1", 1, {"enable_x": False, "y": None, "z": 0})
    assert argv[6:] == ["--z", "0"]


@pytest.mark.parametrize("option", ["api_key", "admin_api_key", "host", "port", "model_path"])
def test_options_relax_sets_per_engine_are_refused_by_name(option):
    flag = "--sglang-" + option.replace("_", "-")
    with pytest.raises(ValueError, match=flag):
        server_argv("/m", "127.0.0.1", 1, {option: "x"})


def test_hf_and_long_spellings_name_the_same_sglang_option():
    assert normalize_options({"max_context_len": 4096, "tensor_parallel_size": 2}) == \
        {"context_length": 4096, "tp_size": 2}
    with pytest.raises(ValueError, match="same SGLang option"):
        normalize_options({"max_context_len": 4096, "context_length": 2048})


def test_unknown_flags_are_rejected_named_as_the_user_wrote_them_with_the_right_ones(sglang_parser):
    """A typo, a prefix (SGLang's parser would take `--mem-fraction` for `--mem-fraction-static`;
    here it is a typo) and a flag SGLang 0.5.23 split in two, in one parse."""
    options = {"mem_fraction_statik": "0.8", "mem_fraction": "0.7", "cuda_graph_max_bs": "256"}
    with pytest.raises(ValueError) as err:
        sglang_parser(server_argv("/m", "127.0.0.1", 30000, options))
    message = str(err.value)
    assert ("unrecognized arguments: --sglang-mem-fraction-statik 0.8 --sglang-mem-fraction 0.7 "
            "--sglang-cuda-graph-max-bs 256") in message
    assert "--sglang-mem-fraction-statik: did you mean --sglang-mem-fraction-static?" in message
    assert "--sglang-mem-fraction: did you mean --sglang-mem-fraction-static?" in message
    assert ("--sglang-cuda-graph-max-bs: did you mean --sglang-cuda-graph-max-bs-decode or "
            "--sglang-cuda-graph-max-bs-prefill?") in message


def test_a_bad_value_gets_sglangs_message(sglang_parser):
    with pytest.raises(ValueError, match="argument --sglang-attention-backend: invalid choice: 'fa9'"):
        sglang_parser(server_argv("/m", "127.0.0.1", 30000, {"attention_backend": "fa9"}))
