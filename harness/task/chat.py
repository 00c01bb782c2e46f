"""The prompt format an instruct model expects: its own chat template, one user turn (`model.chat=model`).

    frame = chat_frame(backend, "model")         # None for model.chat=null (the prompt as written: base models)
    ids = encode_prompt(backend, frame, prompt)  # frame.prefix + prompt + frame.suffix
    ids = encode_entry(backend, frame, entry) + encode_query(backend, frame, prompt)   # a library entry, then the query

The frame is the model's template (GGUF `tokenizer.chat_template`, or the tokenizer's) rendered once in a sandbox
around a placeholder user message, with the assistant's turn opened (`add_generation_prompt`), and cut at the
placeholder: for Qwen2.5 `<|im_start|>system\\nYou are Qwen, ...<|im_end|>\\n<|im_start|>user\\n` before and
`<|im_end|>\\n<|im_start|>assistant\\n` after. The frame's control tokens are parsed as such (`special=True`); the
problem and solution text never is. A library entry opens the user turn (prefix + entry), so its artifact is the
exact prefix of the grafted context; the query closes it (query + suffix). The frame and the template's SHA-256 are
recorded (`ChatFrame.describe`) and, with chat on, are part of a library's identity.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from harness.errors import ConfigError

__all__ = ["CHAT_CHOICES", "ChatFrame", "chat_frame", "encode_entry", "encode_prompt", "encode_query", "render_chat"]

CHAT_CHOICES = (None, "model")
_PLACEHOLDER = "\x00kvgraft-user-message\x00"


@dataclass(frozen=True)
class ChatFrame:
    """The model's chat template around one user message: `prefix` + message + `suffix`."""

    prefix: str
    suffix: str
    template_sha256: str

    def describe(self) -> dict[str, str]:
        return {"chat": "model", "prefix": self.prefix, "suffix": self.suffix, "template_sha256": self.template_sha256}

    @property
    def sha256(self) -> str:
        """SHA-256 of prefix and suffix: what a library built under this frame depends on."""
        return hashlib.sha256(f"{self.prefix}\0{self.suffix}".encode()).hexdigest()


def render_chat(template: str, messages: list[dict[str, str]]) -> str:
    """`messages` (role, content) through the chat `template` in a sandbox, the assistant's turn opened, with no BOS
    text (the backend's encode adds the BOS token, once; after a library entry, none)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(text: str) -> None:
        raise TemplateError(text)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders templates
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="",
                                            eos_token="")


def _render(template: str, message: str) -> str:
    return render_chat(template, [{"role": "user", "content": message}])


def chat_frame(be: Any, chat: str | None) -> ChatFrame | None:
    """The frame of `backend`'s own chat template for model.chat="model"; None for model.chat=null."""
    if chat is None:
        return None
    if chat not in CHAT_CHOICES:
        raise ConfigError(f"model.chat={chat!r}: use model (the model's own chat template) or null (none)")
    template = be.chat_template()
    if not template:
        raise ConfigError(f"model.chat=model: {be.model_name} has no chat template; set model.chat=null")
    text = _render(template, _PLACEHOLDER)
    if text.count(_PLACEHOLDER) != 1:
        raise ConfigError(f"model.chat=model: {be.model_name}'s chat template does not place the user message "
                          "once; set model.chat=null")
    prefix, suffix = text.split(_PLACEHOLDER)
    return ChatFrame(prefix, suffix, hashlib.sha256(template.encode()).hexdigest())


def encode_prompt(be: Any, frame: ChatFrame | None, prompt: str, add_bos: bool = True) -> list[int]:
    """The token ids of a prompt the model reads alone: within the frame when there is one."""
    if frame is None:
        return be.encode(prompt, add_bos=add_bos)
    return (be.encode(frame.prefix, add_bos=add_bos, special=True) + be.encode(prompt, add_bos=False)
            + be.encode(frame.suffix, add_bos=False, special=True))


def encode_entry(be: Any, frame: ChatFrame | None, entry: str) -> list[int]:
    """The token ids of a library entry (an artifact's tokens, from position 0): it opens the user turn."""
    if frame is None:
        return be.encode(entry)
    return be.encode(frame.prefix, special=True) + be.encode(entry, add_bos=False)


def encode_query(be: Any, frame: ChatFrame | None, prompt: str) -> list[int]:
    """The token ids of the query after a library entry: it closes the user turn and opens the assistant's."""
    ids = be.encode(prompt, add_bos=False)
    return ids if frame is None else ids + be.encode(frame.suffix, add_bos=False, special=True)
