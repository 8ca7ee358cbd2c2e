"""Turning one prompt-data row into a prompt `Sample` (slime/Relax `Dataset` semantics).

The steps, in order, for a row `data`:
1. `prompt = data[input_key]`: a string or an OpenAI-style message list
   (`[{"role": "user", "content": "..."}]`).
2. `--custom-prompt-path` function, if any: `prompt = fn(prompt, data)`.
3. The prompt becomes a message list (`[{"role": "user", "content": prompt}]`) when the chat
   template is applied or multimodal keys are set; otherwise it stays as it is.
4. Multimodal columns (`--multimodal-keys '{"image": "images"}'`) are kept in
   `Sample.multimodal_inputs` (`{"image": [...]}`), and each `<image>` / `<video>` / `<audio>`
   placeholder in a string message content is replaced by a typed content part
   (`{"type": "image", "image": ...}`), one data item per placeholder.
5. `--system-prompt`: a `{"role": "system", ...}` message inserted at the head of a message
   list, or a plain prefix of a string prompt.
6. `--apply-chat-template`: `tokenizer.apply_chat_template(messages, tools=row tools,
   tokenize=False, add_generation_prompt=True, **apply_chat_template_kwargs)`; the sample's
   prompt is the resulting string. Without it the prompt stays a string or a message list.

`Sample.label` is `data[label_key]` (None when no label key), `Sample.metadata` the row's
metadata dict (a JSON string is parsed) plus `"tools"` when the row has tools.
Anything wrong with a row raises `DataError` naming the file, the row and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from relax.types import Sample
from relax.utils.data.readers import DataError, RowLocation

# Multimodal type name -> the placeholder that marks its position in a message.
MULTIMODAL_PLACEHOLDERS: dict[str, str] = {"image": "<image>", "video": "<video>", "audio": "<audio>"}


@dataclass(frozen=True)
class PromptFormat:
    """How rows become prompts; one field per data flag (flag names in brackets)."""

    input_key: str = "input"  # --input-key
    label_key: str | None = None  # --label-key
    metadata_key: str | None = "metadata"  # --metadata-key
    tool_key: str | None = "tools"  # --tool-key
    apply_chat_template: bool = False  # --apply-chat-template
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # --apply-chat-template-kwargs
    system_prompt: str | None = None  # --system-prompt
    multimodal_keys: dict[str, str] | None = None  # --multimodal-keys
    custom_prompt_fn: Callable[[Any, dict], Any] | None = None  # --custom-prompt-path


def build_sample(data: dict, location: RowLocation, fmt: PromptFormat, tokenizer: Any) -> Sample:
    """One row -> one prompt `Sample` (steps in the module docstring); `DataError` if the row is bad."""
    prompt = _get_prompt(data, location, fmt)
    metadata = _get_metadata(data, location, fmt.metadata_key)
    tools = _get_tools(data, location, fmt.tool_key)
    if tools is not None:
        metadata["tools"] = tools
    multimodal_inputs = _get_multimodal_inputs(data, location, fmt.multimodal_keys)

    if fmt.apply_chat_template or fmt.multimodal_keys:
        prompt = _as_messages(prompt)
    if multimodal_inputs:
        prompt = _split_placeholders(prompt, multimodal_inputs, location)
    prompt = add_system_prompt(prompt, fmt.system_prompt)
    if fmt.apply_chat_template:
        prompt = render_chat_template(prompt, tokenizer, tools=tools, kwargs=fmt.apply_chat_template_kwargs)
    return Sample(prompt=prompt, label=_get_label(data, location, fmt.label_key), metadata=metadata,
                  multimodal_inputs=multimodal_inputs)


def _get_prompt(data: dict, location: RowLocation, fmt: PromptFormat) -> str | list[dict]:
    if fmt.input_key not in data or data[fmt.input_key] is None:
        raise DataError(
            f"{location}: no input key {fmt.input_key!r} (row keys: {sorted(data)}); "
            "set --input-key to the column that holds the prompt"
        )
    prompt = data[fmt.input_key]
    if fmt.custom_prompt_fn is not None:
        prompt = fmt.custom_prompt_fn(prompt, data)
    _check_prompt_type(prompt, location, fmt.input_key)
    return prompt


def _check_prompt_type(prompt: Any, location: RowLocation, input_key: str) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in prompt
    ):
        return
    raise DataError(
        f"{location}: {input_key!r} must be a string or a non-empty list of "
        f'{{"role": ..., "content": ...}} messages, got {type(prompt).__name__} {_short(prompt)}; '
        "fix the row or convert the column"
    )


def _get_label(data: dict, location: RowLocation, label_key: str | None) -> Any:
    if label_key is None:
        return None
    if data.get(label_key) is None:
        raise DataError(
            f"{location}: label key {label_key!r} is missing or null (row keys: {sorted(data)}); "
            "add the label, set --label-key to the right column, or drop --label-key"
        )
    return data[label_key]


def _decoded(raw: Any, location: RowLocation, what: str, key: str, stored_as: str) -> Any:
    """A column that may hold its value as a JSON string (parquet, CSV): the decoded value."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{location}: {what} {key!r} is a string but not valid JSON ({exc.msg}); "
                        f"store {stored_as}") from exc


def _get_metadata(data: dict, location: RowLocation, metadata_key: str | None) -> dict:
    raw = data.get(metadata_key) if metadata_key else None
    if raw is None or raw == "":
        return {}
    raw = _decoded(raw, location, "metadata", metadata_key, "a JSON object")
    if not isinstance(raw, dict):
        raise DataError(f"{location}: metadata {metadata_key!r} must be a dict (or a JSON object string), "
                        f"got {type(raw).__name__} {_short(raw)}; store a JSON object or set --metadata-key")
    return dict(raw)


def _get_tools(data: dict, location: RowLocation, tool_key: str | None) -> list | None:
    tools = data.get(tool_key) if tool_key else None
    if tools is None:
        return None
    tools = _decoded(tools, location, "tools", tool_key, "a JSON list of tool schemas")
    if hasattr(tools, "tolist"):  # numpy arrays from pandas-written parquet
        tools = tools.tolist()
    if not isinstance(tools, list):
        raise DataError(f"{location}: tools {tool_key!r} must be a list of tool schemas, "
                        f"got {type(tools).__name__}; fix the row or set --tool-key")
    return tools


def _get_multimodal_inputs(data: dict, location: RowLocation, multimodal_keys: dict[str, str] | None) -> dict | None:
    if not multimodal_keys:
        return None
    inputs = {}
    for type_name, column in multimodal_keys.items():
        if type_name not in MULTIMODAL_PLACEHOLDERS:
            raise ValueError(f"--multimodal-keys: unknown type {type_name!r}; known types are "
                             f"{sorted(MULTIMODAL_PLACEHOLDERS)}")
        value = data.get(column)
        if value is None:
            continue
        if hasattr(value, "tolist"):  # numpy arrays from pandas-written parquet
            value = value.tolist()
        inputs[type_name] = list(value) if isinstance(value, (list, tuple)) else [value]
    return inputs or None


def _as_messages(prompt: str | list[dict]) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def _split_placeholders(messages: list[dict], inputs: dict[str, list], location: RowLocation) -> list[dict]:
    """Replace each placeholder in string contents by a typed part holding the next data item."""
    remaining = {name: list(items) for name, items in inputs.items()}
    by_placeholder = {MULTIMODAL_PLACEHOLDERS[name]: name for name in remaining}
    pattern = "(" + "|".join(re.escape(p) for p in by_placeholder) + ")"
    out = []
    for message in messages:
        if not isinstance(message["content"], str):
            for part in message["content"]:  # already structured: its typed parts use up items
                kind = part.get("type") if isinstance(part, dict) else None
                if remaining.get(kind):
                    remaining[kind].pop(0)
            out.append(message)
            continue
        parts = []
        for segment in re.split(pattern, message["content"]):
            if segment in by_placeholder:
                name = by_placeholder[segment]
                if not remaining[name]:
                    raise DataError(f"{location}: more {segment} placeholders than {name} items; "
                                    "make the placeholders match the multimodal column")
                parts.append({"type": name, name: remaining[name].pop(0)})
            elif segment:
                parts.append({"type": "text", "text": segment})
        out.append({**message, "content": parts})
    left = {name: len(items) for name, items in remaining.items() if items}
    if left:
        raise DataError(f"{location}: {left} multimodal item(s) have no placeholder in the prompt; add one "
                        f"{'/'.join(MULTIMODAL_PLACEHOLDERS[n] for n in left)} per item to the message content")
    return out


def add_system_prompt(prompt: str | list[dict], system_prompt: str | None) -> str | list[dict]:
    """Insert `system_prompt` as a system message at the head (message list) or prepend it (string)."""
    if not system_prompt:
        return prompt
    if isinstance(prompt, str):
        return system_prompt + prompt
    return [{"role": "system", "content": system_prompt}, *prompt]


def flatten_media_parts(messages: list[dict]) -> list[dict]:
    """Messages whose typed parts (`{"type": "image", ...}`, `{"type": "text", ...}`) are string
    contents again, media parts as their placeholders: any chat template renders them (a text-only
    one too, e.g. a system message the placeholder split turned into text parts), and the model's
    processor expands each placeholder to its media tokens afterwards (`relax.utils.multimodal.processor`)."""
    out = []
    for message in messages:
        content = message.get("content")
        parts = [p.get("type") if isinstance(p, dict) else None for p in content] if isinstance(content, list) else []
        if parts and (any(t in MULTIMODAL_PLACEHOLDERS for t in parts) or all(t == "text" for t in parts)):
            text = "".join(MULTIMODAL_PLACEHOLDERS[p["type"]] if p.get("type") in MULTIMODAL_PLACEHOLDERS
                           else str(p.get("text", "")) for p in content if isinstance(p, dict))
            message = {**message, "content": text}
        out.append(message)
    return out


def render_chat_template(messages: list[dict], tokenizer: Any, *, tools: list | None,
                         kwargs: dict[str, Any]) -> str:
    """The chat-templated prompt string, ending with the generation prompt (media parts as their
    placeholders, see `flatten_media_parts`)."""
    if tokenizer is None:
        raise ValueError("--apply-chat-template needs a tokenizer; set --hf-checkpoint to the model directory")
    return tokenizer.apply_chat_template(flatten_media_parts(messages), tools=tools, tokenize=False,
                                         add_generation_prompt=True, **kwargs)


@dataclass(frozen=True)
class MediaLength:
    """Measures a multimodal prompt as the model sees it: the rollout's own encoding.

    Each `<image>` / `<video>` / `<audio>` placeholder expands to many media tokens (a 56x56
    image is 4 pads plus its open/close tokens for Qwen2.5-VL), so a short text can be a long
    prompt. The count is `len(processor.encode(text, through_pipelines(media, pipelines)).input_ids)`,
    the very ids the rollout sends (`relax.engine.rollout.prompt_encoding.encode_prompt`): exact, at
    the cost of processing each row's media once. Failures are `MediaError` (a `ValueError`)."""

    processor: Any  # relax.utils.multimodal.processor.MultimodalProcessor of --hf-checkpoint
    pipelines: dict[str, Any]  # processor.pipelines(data flags): the media flags in the model's units

    @classmethod
    def for_model(cls, model_path: str, tokenizer: Any, flags: Any) -> MediaLength:
        """The checkpoint's processor and the media flags' pipelines (`flags`: the data flags)."""
        from relax.utils.multimodal.processor import MultimodalProcessor

        processor = MultimodalProcessor.for_run(model_path, tokenizer, flags)
        return cls(processor, processor.pipelines(flags))

    def __call__(self, text: str, media: dict[str, list]) -> int:
        from relax.utils.multimodal.items import through_pipelines

        return len(self.processor.encode(text, through_pipelines(media, self.pipelines)).input_ids)


def _rendered_prompt(prompt: str | list[dict], tokenizer: Any, fmt: PromptFormat) -> str | None:
    """The prompt as the engine gets it (a message list through the tokenizer's chat template,
    media parts as their placeholders); None when a message list has no template to render it."""
    if isinstance(prompt, str):
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        return None
    return render_chat_template(prompt, tokenizer, tools=None, kwargs=fmt.apply_chat_template_kwargs)


def prompt_token_length(prompt: str | list[dict], tokenizer: Any, fmt: PromptFormat, *,
                        media: dict[str, list] | None = None, media_length: MediaLength | None = None) -> int | None:
    """Token count of a prompt as the engine will see it; None when it cannot be measured.

    A message-list prompt (no `--apply-chat-template`) is measured through the tokenizer's
    chat template when it has one. With `media_length` and the row's `media`, each placeholder
    counts as the media tokens it expands to (`MediaLength`; a bad item raises `MediaError`);
    otherwise multimodal items count as their placeholder text only.
    """
    text = _rendered_prompt(prompt, tokenizer, fmt)
    if text is None:
        return None
    if media_length is not None and media:
        return media_length(text, media)
    return len(tokenizer.encode(text, add_special_tokens=False))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
