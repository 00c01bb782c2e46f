"""The text side of a backend: a `Tokenizer` (encode, decode, the end-of-sequence ids, the vocabulary size and the
chat template), from which `kvstore.engine.protocol.Backend` derives its text verbs, as lighteval's model base derives
`tok_encode` from the tokenizer a model exposes. `HFTokenizer` wraps a Hugging Face tokenizer (transformers, vLLM); a
backend with another tokenizer (llama.cpp's, the fake's bytes) writes its own subclass.

    tok = HFTokenizer(hf_tokenizer, eos={1, 106}, vocab=262144)
    tok.encode("Problem: ...")   # BOS first, control tokens written in the text parsed as such
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Tokenizer(ABC):
    """A model's text verbs (a backend's `tokenizer()`)."""

    @abstractmethod
    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`, BOS first when `add_bos`; `special`: control tokens written in it parsed as such."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """The text of `ids` (special tokens left out)."""

    @abstractmethod
    def eos_ids(self) -> set[int]:
        """The token ids that end a sequence."""

    @abstractmethod
    def vocab_size(self) -> int:
        """The size of the logits' vocabulary dimension."""

    def chat_template(self) -> str | None:
        """The model's chat template; None (the default) when it has none."""
        return None


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer: ids without its own special tokens, BOS added here (the text's control tokens are
    parsed either way, as they always were: the bundled model's ids stay the same), decoded without special tokens."""

    def __init__(self, tokenizer: Any, eos: set[int], vocab: int) -> None:
        self.hf = tokenizer
        self._eos = set(eos)
        self._vocab = int(vocab)

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        ids = self.hf(text, add_special_tokens=False)["input_ids"]
        bos = self.hf.bos_token_id
        return ([int(bos)] if add_bos and bos is not None else []) + list(ids)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def eos_ids(self) -> set[int]:
        return set(self._eos)

    def vocab_size(self) -> int:
        return self._vocab

    def chat_template(self) -> str | None:
        template = getattr(self.hf, "chat_template", None)
        return template if isinstance(template, str) and template else None


def eos_of(*values: Any) -> set[int]:
    """The end-of-sequence ids among `values` (each an int, a list of ints or None: a config's eos_token_id, a
    generation config's, a tokenizer's)."""
    ids: set[int] = set()
    for v in values:
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return ids
