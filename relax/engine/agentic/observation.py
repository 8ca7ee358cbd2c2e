"""Observations -> token ids through the chat template's own turn delimiters (token-in/token-out).

After a model turn the sample's tokens are exactly the ids the engine produced. An observation
adds only its own ids: the text the chat template puts between the end of that assistant turn
and the next generation prompt, rendered for this observation alone,

    render([user "U", assistant S, observation], add_generation_prompt=True)
      = "...S" + "<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n7\\n</tool_response><|im_end|>\\n"
               + "<|im_start|>assistant\\n"

i.e. everything after the sentinel S. When the model closed its turn itself (its last token is a
special token, e.g. `<|im_end|>`, whose text starts that part) that text is left out: the model's
own token stands for it. Only the observation's text is tokenized; nothing the engine produced is
decoded and re-encoded, so the sample's tokens are the engine's ids plus these ids, and the
template's newline after `<|im_end|>` (the token verl lost at every tool turn, verl#6501) is in
them, with loss mask 0. Without a chat template the observation text is tokenized as it is.

A message's media parts (`{"type": "image", "image": ...}`) become their placeholders in the text
and go with it through `MediaContext.observe` (relax.utils.multimodal.turns), which expands them
to the model's media tokens and grows the sample's media and encoder tensors in step.
"""

from __future__ import annotations

from typing import Any

from relax.utils.data.formatting import MULTIMODAL_PLACEHOLDERS

SENTINEL = "RELAXTURNSENTINEL"  # letters only: a template that strips or escapes content leaves it whole


def flatten_message(message: dict[str, Any]) -> tuple[str, str, dict[str, list[Any]]]:
    """(role, text with media placeholders, media items by kind) of a chat message."""
    if not isinstance(message, dict) or "content" not in message:
        raise ValueError(f"format_observation must return a chat message {{'role', 'content'}}, got "
                         f"{str(message)[:200]}")
    content, media = message["content"], {}
    if isinstance(content, str):
        return str(message.get("role") or "user"), content, media
    text = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MULTIMODAL_PLACEHOLDERS:
            text.append(MULTIMODAL_PLACEHOLDERS[kind])
            media.setdefault(kind, []).append(part[kind])
        elif kind == "text":
            text.append(str(part.get("text", "")))
        else:
            raise ValueError(f"a message part is {{'type': 'text' | 'image' | 'audio' | 'video', ...}}, got "
                             f"{str(part)[:200]}")
    return str(message.get("role") or "user"), "".join(text), media


class ObservationEncoder:
    """The ids of one observation turn after a model turn (module doc)."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())

    def text(self, role: str, content: str, last_token: int | None) -> str:
        """The observation turn's text: the template's delimiters around `content`, up to and including
        the next generation prompt; without the closing text the model's `last_token` already is."""
        if not self.templated:
            return content
        return self.messages_text([{"role": role, "content": content}], last_token)

    def messages_text(self, messages: list[dict[str, Any]], last_token: int | None,
                      tools: list[dict[str, Any]] | None = None) -> str:
        """`text` for several messages after a model turn (the agent gateway: tool results, a new user
        turn); `tools` as the conversation renders them (a template may place them anywhere)."""
        rendered = [{"role": "user", "content": "U"}, {"role": "assistant", "content": SENTINEL}, *messages]
        full = self.tokenizer.apply_chat_template(rendered, tools=tools, tokenize=False, add_generation_prompt=True,
                                                  **self.kwargs)
        if SENTINEL not in full:
            raise ValueError("the chat template does not render an assistant message's content; observations cannot "
                             "be placed after a model turn with it")
        text = full[full.rindex(SENTINEL) + len(SENTINEL):]
        if last_token is not None and last_token in self.special_ids:
            closing = self.tokenizer.decode([last_token], skip_special_tokens=False)
            if closing and text.startswith(closing):
                text = text[len(closing):]
        return text

    def ids(self, message: dict[str, Any], last_token: int | None, media_context: Any = None
            ) -> tuple[list[int], str, dict[str, list[Any]]]:
        """(ids, the turn's text, its media) of `message` after a turn that ended with `last_token`;
        media items join the sample through `media_context` (None in a text run: media is an error)."""
        role, content, media = flatten_message(message)
        text = self.text(role, content, last_token)
        if media and media_context is None:
            raise ValueError(f"the observation holds {'/'.join(sorted(media))} but the model takes text only "
                             "(serve a vision-language checkpoint and set --multimodal-keys)")
        if media_context is not None:
            return media_context.observe(text, media.get("image", ()), media.get("audio", ()),
                                         media.get("video", ())), text, media
        return self.tokenizer.encode(text, add_special_tokens=False), text, media
