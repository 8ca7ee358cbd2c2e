"""The command a run launches an SGLang engine with: from the launch script's flags through the
Rollout's engine options to the server's argv and environment, accepted by SGLang's own parser;
GPUs by CUDA_VISIBLE_DEVICES, tensor parallel over them, the API key never in argv."""

from __future__ import annotations

import pytest

from relax.backends.sglang.launcher import API_KEY_ENV, PARENT_PID_ENV, engine_command, launch_sglang_engine
from relax.components.engine_launch import engine_options
from relax.config import parse_config

SERVER = ["-m", "relax.backends.sglang.server"]


def command_for(flags: list[str], device: str, context_len: int | None = None, **kw):
    cfg = parse_config(["--hf-checkpoint", "/models/qwen"] + flags, validate=False).replace(rollout_backend="sglang")
    return engine_command("/models/qwen", host="127.0.0.1", port=30000, device=device,
                          options=engine_options(cfg, context_len), **kw)


# The seed's `--sglang-*` example flag sets, each with the GPUs its engine is placed on.
EXAMPLES = [
    (["--sglang-mem-fraction-static", "0.8", "--rollout-num-gpus-per-engine", "2"], "cuda:2,3"),
    (["--sglang-enable-deterministic-inference", "--sglang-rl-on-policy-target", "fsdp",
      "--sglang-attention-backend", "fa3"], "cuda:0"),
    # SGLang 0.5.23 split --cuda-graph-max-bs into a decode and a prefill bound (test_sglang_args).
    (["--sglang-cuda-graph-max-bs-decode", "256", "--sglang-chunked-prefill-size", "4096"], "cuda:0"),
]


@pytest.mark.parametrize("flags, device", EXAMPLES, ids=["mem-fraction-tp2", "deterministic-fa3", "cuda-graph"])
def test_example_flag_sets_launch_with_a_command_sglang_accepts(sglang_parser, flags, device):
    argv, _ = command_for(flags, device, context_len=4096)
    assert argv[1:3] == SERVER
    parsed = sglang_parser(argv[3:])
    assert parsed.tp_size == len(device.split(":")[1].split(",")) and parsed.context_length == 4096
    for flag in flags:
        if flag.startswith("--sglang-"):
            assert hasattr(parsed, flag[len("--sglang-"):].replace("-", "_"))


def test_engine_sees_its_gpus_and_runs_tensor_parallel_over_them():
    argv, env = command_for(["--rollout-num-gpus-per-engine", "2"], "cuda:2,3")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert argv[argv.index("--tp-size") + 1] == "2" and argv.count("--tp-size") == 1


def test_tp_size_that_disagrees_with_the_gpus_names_both():
    with pytest.raises(ValueError, match=r"tp_size 4 .* 2 GPU\(s\) of device cuda:2,3"):
        engine_command("/m", host="127.0.0.1", port=1, device="cuda:2,3", options={"tp_size": 4})


def test_api_key_travels_by_environment_never_argv():
    argv, env = engine_command("/m", host="127.0.0.1", port=1, device="cuda:0", api_key="s3cret",
                               env={API_KEY_ENV: "stale", "PATH": "/bin"})
    assert env[API_KEY_ENV] == "s3cret" and not any("s3cret" in a for a in argv)
    assert "--api-key" not in argv and env[PARENT_PID_ENV]
    _, keyless = engine_command("/m", host="127.0.0.1", port=1, device="cuda:0", env={API_KEY_ENV: "stale"})
    assert API_KEY_ENV not in keyless  # a key inherited from the launcher's environment never leaks in


def test_context_limit_and_hf_spelling_reach_sglang_as_context_length():
    argv, _ = command_for([], "cuda:0", context_len=2048)
    assert argv[argv.index("--context-length") + 1] == "2048" and "--max-context-len" not in argv


def test_colocated_engines_start_with_sglangs_memory_saver():
    """Without it SGLang's /release_memory_occupation frees nothing (it logs a warning)."""
    assert "--enable-memory-saver" in command_for([], "cuda:0")[0]
    assert "--enable-memory-saver" not in command_for(["--no-offload-rollout"], "cuda:0")[0]
    assert "--enable-memory-saver" not in command_for(["--fully-async"], "cuda:0")[0]


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_launching_on_a_non_cuda_device_says_sglang_needs_a_gpu(tmp_path, device):
    with pytest.raises(ValueError, match="SGLang needs a GPU"):
        launch_sglang_engine("/m", device=device, log_path=str(tmp_path / "engine_0.log"))
    assert not (tmp_path / "engine_0.log").exists()  # nothing started


def test_server_info_is_published_without_the_api_keys():
    from relax.backends.sglang.server import redacted

    info = {"api_key": "secret", "admin_api_key": None, "tp_size": 2}
    assert redacted(info) == {"api_key": "<redacted>", "admin_api_key": None, "tp_size": 2}
