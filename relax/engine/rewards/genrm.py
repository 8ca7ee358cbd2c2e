"""`genrm`: an LLM judge scores the response (generative reward model, LLM-as-judge).

The judge runs in the GenRM role (`relax.components.genrm`, deployed when
`--genrm-model-path` is set), behind a router that speaks SGLang's `/generate`. Per sample:

1. `judge_messages`: a system message and a user message filled from `prompt_template`
   (default `JUDGE_TEMPLATE`; `genrm_prompt_template` in `--custom-config-path` replaces it)
   with `{prompt}` (the policy prompt as text), `{response}` and `{label}` ("(none)" without one);
2. rendered with the judge model's chat template (plain "role: content" lines without one),
   POSTed as `text` with `--genrm-sampling-config` (temperature 0.1, top_p 1.0, top_k -1,
   max_response_len 4096 by default) to the GenRM router;
3. `parse_verdict` reads the score from the judge's reply (see there). A reply without a
   verdict raises `VerdictError`; the executor then gives `--reward-failure-value` and counts it.

Without a deployed GenRM the scorer raises at once, saying which flag to set.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from relax.config.schema import GENRM_SAMPLING_DEFAULTS

JUDGE_SYSTEM = "You are a careful, strict grader. You judge whether a response answers a question correctly."
JUDGE_TEMPLATE = (
    "Question:\n{prompt}\n\nReference answer:\n{label}\n\nResponse to grade:\n{response}\n\n"
    "Is the response correct? Compare its final answer with the reference answer (when there is one). "
    "Reply with a short justification, then a last line 'Score: X' where X is 1 for correct, 0 for "
    "incorrect, or a number between 0 and 1 for partial credit."
)
NO_LABEL = "(none)"

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_BOXED_RE = re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}")
_SCORE_RE = re.compile(r"score\W{0,4}\s*(" + _NUMBER + r")", re.IGNORECASE)
_BARE_NUMBER_RE = re.compile(r"^\s*(" + _NUMBER + r")\s*$")
VERDICT_WORDS: dict[str, float] = {"correct": 1.0, "yes": 1.0, "true": 1.0, "pass": 1.0,
                                   "incorrect": 0.0, "wrong": 0.0, "no": 0.0, "false": 0.0, "fail": 0.0}


class VerdictError(ValueError):
    """The judge's reply holds no score or verdict."""


class GenRMNotDeployedError(RuntimeError):
    """`rm_type genrm` was asked for but the run has no GenRM role."""


@dataclass(frozen=True)
class JudgeSpec:
    """Where the judge is and how to ask it (built once per run from the flags)."""

    url: str  # the GenRM router, e.g. http://127.0.0.1:PORT
    model_path: str | None = None  # the judge's tokenizer (chat template)
    sampling: dict[str, Any] = field(default_factory=dict)  # SGLang sampling_params
    prompt_template: str = JUDGE_TEMPLATE


def sampling_params(config: dict[str, Any] | None) -> dict[str, Any]:
    """SGLang `sampling_params` from `--genrm-sampling-config` (seed keys and defaults)."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(GENRM_SAMPLING_DEFAULTS))
    if unknown:
        raise ValueError(f"--genrm-sampling-config: unknown key(s) {unknown}; known: {list(GENRM_SAMPLING_DEFAULTS)}")
    merged = {**GENRM_SAMPLING_DEFAULTS, **config}
    return {"temperature": float(merged["temperature"]), "top_p": float(merged["top_p"]),
            "top_k": int(merged["top_k"]), "max_new_tokens": int(merged["max_response_len"])}


def judge_spec(url: str | None, model_path: str | None, sampling_config: dict[str, Any] | None,
               prompt_template: str | None = None) -> JudgeSpec | None:
    """The run's judge at the GenRM router `url`, or None when no GenRM is deployed (no url).
    `prompt_template`: `genrm_prompt_template` from --custom-config-path (default JUDGE_TEMPLATE)."""
    if not url:
        return None
    template = prompt_template or JUDGE_TEMPLATE
    check_template(template)
    if model_path:
        _judge_tokenizer(model_path)  # load once here, not inside the first reward call
    return JudgeSpec(url=url, model_path=model_path, sampling=sampling_params(sampling_config),
                     prompt_template=template)


def check_template(template: str) -> None:
    try:
        template.format(prompt="", response="", label="")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"genrm_prompt_template: bad placeholder ({exc!r}); use only {{prompt}}, {{response}}, "
                         "{label} and write literal braces as {{ }}") from exc


def prompt_text(prompt: Any) -> str:
    """The policy prompt as text: a string as is, a message list as its text contents."""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for message in prompt or []:
        content = message.get("content", "") if isinstance(message, dict) else message
        if isinstance(content, list):  # typed parts: keep the text ones
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        parts.append(str(content))
    return "\n".join(parts)


def judge_messages(prompt: Any, response: str, label: Any, template: str = JUDGE_TEMPLATE) -> list[dict[str, str]]:
    label_text = NO_LABEL if label is None or label == "" else str(label)
    user = template.format(prompt=prompt_text(prompt), response=response, label=label_text)
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


@functools.lru_cache(maxsize=4)
def _judge_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def render(messages: list[dict[str, str]], model_path: str | None) -> str:
    """The judge's input text: its chat template with the generation prompt, else plain lines."""
    tokenizer = _judge_tokenizer(model_path) if model_path else None
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def parse_verdict(text: str) -> float:
    """The judge's score, first match wins:
    1. the last `\\boxed{X}` holding a number;  2. the last `Score: X` (any case, `**Score**: X` too);
    3. the last line is a verdict word (correct/yes/true/pass = 1, incorrect/wrong/no/false/fail = 0);
    4. the whole reply is a number.  Numbers are returned as given (a 1-10 judge gives 1-10)."""
    for pattern in (_BOXED_RE, _SCORE_RE):
        found = pattern.findall(text)
        if found:
            return float(found[-1])
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if lines:
        last = re.sub(r"[^a-z]", "", lines[-1].lower())
        if last in VERDICT_WORDS:
            return VERDICT_WORDS[last]
    bare = _BARE_NUMBER_RE.match(text)
    if bare:
        return float(bare.group(1))
    raise VerdictError(f"genrm: the judge's reply has no score or verdict: {text[-300:]!r}; the judge should end "
                       "with 'Score: X' (or edit genrm_prompt_template to ask for it)")


async def ask_judge(judge: JudgeSpec, text: str, *, timeout: float) -> str:
    """The judge's reply to `text` (one /generate call through the GenRM router)."""
    from relax.utils.http_utils import post

    out = await post(judge.url + "/generate", {"text": text, "sampling_params": judge.sampling}, timeout=timeout)
    return str(out.get("text", "")) if isinstance(out, dict) else str(out)


async def score(response: str, label: Any, metadata: dict | None = None, *, prompt: Any = "",
                judge: JudgeSpec | None = None, timeout: float = 60.0) -> float:
    """The judge's score of `response` to `prompt` (reference answer `label`)."""
    if judge is None:
        raise GenRMNotDeployedError("rm_type genrm: no GenRM judge is deployed in this run; set --genrm-model-path "
                                    "PATH (the judge model) so the Controller deploys the GenRM role")
    text = render(judge_messages(prompt, response, label, judge.prompt_template), judge.model_path)
    return parse_verdict(await ask_judge(judge, text, timeout=timeout))
