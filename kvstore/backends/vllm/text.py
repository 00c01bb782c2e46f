"""The served model's text side without an engine: what a front end that composes prompts for the engine needs
(token ids exactly as the engine's own tokenizer gives them, the fingerprints that bind artifacts to the model), in a
process that runs no engine (vLLM's API server process, say).

    text = load_text_model("vllm", model="")         # kvstore's face: the bundled model's converted folder
    ids = text.encode("Problem: ...", add_bos=False)   # the ids VllmBackend.encode gives for the same text

VllmBackend's encode/decode/chat_template are kvstore.engine.text.HFTokenizer's on the engine's own tokenizer, and so
are these, so a prompt composed here is the prompt the harness's vLLM backend composes (one tokenizer path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstore.backends.vllm.identity import NAME, model_fingerprint, tokenizer_fingerprint
from kvstore.backends.vllm.launch import model_folder
from kvstore.backends.vllm.settings import VllmBackendSettings
from kvstore.engine.text import HFTokenizer


def tokenizer_for(folder: str) -> Any:
    """The tokenizer vLLM loads for `folder` (vLLM's own loader where vLLM is installed, else transformers')."""
    try:
        from vllm.tokenizers import get_tokenizer  # type: ignore[import-not-found]
    except ImportError:
        try:
            from vllm.transformers_utils.tokenizer import get_tokenizer  # type: ignore[import-not-found,no-redef]
        except ImportError:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(folder)
    return get_tokenizer(folder)


class VllmText:
    """The model of VllmBackendSettings without an engine: encode, decode, chat_template, the fingerprints."""

    name = NAME

    def __init__(self, settings: VllmBackendSettings, tokenizer: Any = None) -> None:
        self.folder = model_folder(settings)  # type: ignore[arg-type]
        hf = tokenizer if tokenizer is not None else tokenizer_for(self.folder)
        self.text = HFTokenizer(hf, set(), len(hf))  # the engine's one tokenizer path (VllmBackend.tokenizer())
        self.model_name = settings.model_name
        self.bundled = not settings.model  # "" = the bundled model's converted folder
        self.context = int(settings.max_model_len)  # the engine's context in tokens, as the server starts it
        self.fingerprint = model_fingerprint(Path(self.folder))
        self.tokenizer_fingerprint = tokenizer_fingerprint(Path(self.folder))

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.text.encode(text, add_bos)

    def decode(self, ids: list[int]) -> str:
        return self.text.decode(ids)

    def chat_template(self) -> str | None:
        return self.text.chat_template()

    def served_chat_template(self) -> str | None:
        """The chat template kvstore's server (kvstore.backends.vllm.serve) applies without --chat-template: the
        model's own, or for the bundled model, which ships none, serve.CHAT_TEMPLATE."""
        own = self.chat_template()
        if own or not self.bundled:
            return own
        from kvstore.backends.vllm.serve import CHAT_TEMPLATE

        return CHAT_TEMPLATE.read_text(encoding="utf-8")


def load_text(settings: VllmBackendSettings) -> VllmText:
    """The text loader (VllmBackend.load_text, which kvstore.backends.load_text_model asks)."""
    return VllmText(settings)
