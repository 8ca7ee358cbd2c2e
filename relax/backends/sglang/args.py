"""`--sglang-<option>` passthrough -> SGLang server argv, checked by SGLang's own parser.

Every `--sglang-<option>` of a run reaches the engine as `--<option>`: SGLang's `ServerArgs` has
about 560 flags (0.5.23) and one parser that knows them all, so Relax keeps no list of its own. The argv is
rendered here (`server_argv`) and checked here (`validate_server_argv`) with the parser the
server itself uses (`ServerArgs.add_cli_args`), before anything launches, so a typo fails at
startup with SGLang's message and the flag as the user spelled it (`--sglang-...`).

The check runs in a child Python: importing `sglang` pulls in torch, transformers and triton
(~5 s), patches transformers and sets cache-directory variables in `os.environ` at import, none
of which belongs in the driver (or a test process). Abbreviations are refused (SGLang's parser
would take `--mem-fraction` for `--mem-fraction-static`; here a prefix is a typo). The check
parses; it does not resolve (that needs the model and the GPUs: SGLang does it at start).

No `sglang` import at module level: `relax.backends.registry` loads this module by name when the
run's config is checked (`check_engine_options`).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from relax.backends.sglang.routing import installed_version, routed_experts_options
from relax.config.lora import ALL_LINEAR, engine_lora_options

if TYPE_CHECKING:
    from relax.config.schema import RelaxConfig

# Set by Relax for each engine; an `--sglang-*` option for one of these is an error.
MANAGED = {
    "model_path": "the engine's model is --hf-checkpoint",
    "host": "Relax binds each engine to loopback (the node's address across nodes)",
    "port": "Relax picks a free port per engine",
    "api_key": "Relax generates the run's key and hands it to the engine by environment, never argv",
    "admin_api_key": "with an admin key SGLang refuses the run's key on weight updates and memory release",
}
# Second spellings of one option: the hf engine's (`--genrm-engine-config '{"max_context_len": ...}'`)
# and SGLang's long name of tp_size, which Relax sets from --rollout-num-gpus-per-engine.
ALIASES = {"max_context_len": "context_length", "tensor_parallel_size": "tp_size"}
PROBE_MARK = "RELAX_SGLANG_ARGS "  # prefixes the child's one-line JSON answer on stdout
_REPO_ROOT = str(Path(__file__).resolve().parents[3])


class SGLangMissing(ImportError):
    """SGLang's parser (`sglang.srt.server_args`) does not import here; the message says why."""


def sglang_available() -> bool:
    """sglang is installed (cheap: finds the package without importing it)."""
    return importlib.util.find_spec("sglang") is not None


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def relax_flag(flag: str) -> str:
    """`--mem-fraction-static` -> `--sglang-mem-fraction-static`: how the user wrote it."""
    return "--sglang-" + flag[2:]


def normalize_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Engine options with aliases resolved; ValueError for an option Relax sets itself."""
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key in MANAGED:
            raise ValueError(f"{relax_flag(option_flag(key))}: Relax sets --{key.replace('_', '-')} per engine "
                             f"({MANAGED[key]}); drop it")
        name = ALIASES.get(key, key)
        if name == "lora_target_modules":  # peft's all-linear is SGLang's "all"
            value = ["all" if v == ALL_LINEAR else v for v in ([value] if isinstance(value, str) else value)]
        if name in out and out[name] != value:
            raise ValueError(f"engine options {key}={value!r} and {name}={out[name]!r} name the same SGLang option "
                             f"(--{name.replace('_', '-')}) with different values; keep one")
        out[name] = value
    return out


def server_argv(model_path: str, host: str, port: int, options: Mapping[str, Any] | None) -> list[str]:
    """SGLang server argv: `{"mem_fraction_static": 0.8, "enable_x": True, "y": ["a", "b"]}` ->
    `--mem-fraction-static 0.8 --enable-x --y a b`. True is a bare flag; False and None are
    left out (SGLang's default applies: turn a default-on option off with `--sglang-no-<option>`)."""
    argv = ["--model-path", str(model_path), "--host", host, "--port", str(port)]
    for name, value in normalize_options(options).items():
        if value is None or value is False:
            continue
        argv.append(option_flag(name))
        if isinstance(value, (list, tuple)):
            argv += [str(v) for v in value]
        elif value is not True:
            argv.append(str(value))
    return argv


def validate_server_argv(argv: Sequence[str], timeout: float = 300.0) -> argparse.Namespace:
    """Parse `argv` with SGLang's own parser (in a child Python) and return what it parsed.

    Raises ValueError with SGLang's message, the offending flags written `--sglang-<name>` and a
    close match where there is one; `SGLangMissing` when the parser does not import here."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", "relax.backends.sglang.args", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    answers = [line[len(PROBE_MARK):] for line in proc.stdout.splitlines() if line.startswith(PROBE_MARK)]
    if not answers:
        raise RuntimeError(f"SGLang's argument check exited with code {proc.returncode} without an answer:\n"
                           f"{(proc.stderr or proc.stdout)[-3000:]}")
    answer = json.loads(answers[-1])
    if "missing" in answer:
        raise SGLangMissing(answer["missing"])
    if "error" in answer:
        raise ValueError(_user_message(answer["error"], answer.get("hints", {}), argv))
    return argparse.Namespace(**answer["values"])


def check_engine_options(cfg: RelaxConfig) -> None:
    """Every `--sglang-*` option as the engines will get it, through SGLang's own parser. Raises
    ValueError naming the flag; `SGLangMissing` (an ImportError) when SGLang's parser does not
    import here (`relax.backends.registry.ENGINE_OPTION_CHECKS`)."""
    tp = cfg.cluster.rollout_num_gpus_per_engine
    options = normalize_options(cfg.sglang)
    if options.get("tp_size") is not None and str(options["tp_size"]).strip() != str(tp):
        raise ValueError(f"--sglang-tp-size {options['tp_size']} contradicts --rollout-num-gpus-per-engine {tp}: "
                         "an engine runs tensor parallel over the GPUs it is given; drop --sglang-tp-size")
    lora = engine_lora_options(cfg, alpha=False)  # --lora-rank: --enable-lora, --max-lora-rank, --lora-target-modules
    # R3: --enable-return-routed-experts, from the SGLang release that has it (routing.py)
    routed = routed_experts_options(installed_version()) if cfg.algo.use_rollout_routing_replay else {}
    validate_server_argv(server_argv(cfg.ckpt.hf_checkpoint or "model", "127.0.0.1", 30000,
                                     {**options, "tp_size": tp, **lora, **routed}))


def _user_message(error: str, hints: Mapping[str, list[str]], argv: Sequence[str]) -> str:
    """SGLang's message with the user's flags (everything but the managed ones) as `--sglang-*`."""
    managed = {option_flag(k) for k in MANAGED}
    user_flags = sorted({a for a in argv if a.startswith("--") and a not in managed} | set(hints),
                        key=len, reverse=True)
    if user_flags:
        pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, user_flags)) + r")(?![\w-])")
        error = pattern.sub(lambda m: relax_flag(m.group(1)), error)
    tips = "; ".join(f"{relax_flag(bad)}: did you mean {' or '.join(map(relax_flag, good))}?"
                     for bad, good in hints.items())
    return f"SGLang's server arguments: {error}" + (f" ({tips})" if tips else "")


# ---- the child: `python -m relax.backends.sglang.args <argv>` ------------------------------------

class _ParseError(Exception):
    pass


def _parse_here(argv: list[str]) -> dict[str, Any]:
    """What the child answers: {"values": ...}, {"error": ..., "hints": ...} or {"missing": ...}."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as exc:  # the answer is that it is missing: which package, and why
        return {"missing": f"sglang's argument parser does not import: {type(exc).__name__}: {exc}"}

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # argparse prints usage and exits; the driver wants the message
            raise _ParseError(message)

    parser = Parser(prog="sglang serve", allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    try:
        namespace = parser.parse_args(argv)
        ServerArgs.from_cli_args(namespace)
    except _ParseError as exc:
        known = [s for s in parser._option_string_actions if s.startswith("--")]
        unknown = [a.split("=", 1)[0] for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]
        # A flag SGLang split (`--cuda-graph-max-bs` -> `...-decode`, `...-prefill`): every option it begins.
        hints = {a: [k for k in known if k.startswith(a + "-")] or difflib.get_close_matches(a, known, n=1, cutoff=0.75)
                 for a in unknown}
        return {"error": str(exc), "hints": {a: m for a, m in hints.items() if m}}
    return {"values": vars(namespace)}


if __name__ == "__main__":
    print(PROBE_MARK + json.dumps(_parse_here(sys.argv[1:]), default=str), flush=True)
