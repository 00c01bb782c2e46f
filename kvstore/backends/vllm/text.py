"""The served model's text side without an engine: what a front end that composes prompts for the engine needs
(token ids exactly as the engine's own tokenizer gives them, the fingerprints that bind artifacts to the model), in a
process that runs no engine (vLLM's API server process, say).

    text = load_text_model("vllm", model="")         # kvstore's face: the bundled model's converted folder
    ids = text.encode("Problem: ...", add_bos=False)   # the ids VllmBackend.encode gives for the same text

VllmBackend's encode/decode/chat_template are these functions on the engine's own tokenizer, so a prompt composed
here is the prompt the harness's vLLM backend composes (one tokenizer path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstore.backends.vllm.identity import NAME, model_fingerprint, tokenizer_fingerprint
from kvstore.backends.vllm.launch import model_folder
from kvstore.backends.vllm.settings import VllmBackendSettings


def encode_with(tokenizer: Any, text: str, add_bos: bool = True) -> list[int]:
    """Token ids of `text` (the tokenizer parses control tokens written in it either way, as the transformers
    backend's does), with BOS first when `add_bos`."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    bos = tokenizer.bos_token_id
    return ([int(bos)] if add_bos and bos is not None else []) + ids


def chat_template_of(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) and template else None


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
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(self.folder)
        self.model_name = settings.model_name
        self.fingerprint = model_fingerprint(Path(self.folder))
        self.tokenizer_fingerprint = tokenizer_fingerprint(Path(self.folder))

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return encode_with(self.tokenizer, text, add_bos)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def chat_template(self) -> str | None:
        return chat_template_of(self.tokenizer)


def load_text(settings: VllmBackendSettings) -> VllmText:
    """The registry's text loader (kvstore.backends.load_text_model)."""
    return VllmText(settings)
