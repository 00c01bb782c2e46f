"""llama.cpp alone, on a loaded LlamaCppBackend's own context: what a benchmark that compares kvgraft with bare
llama-cpp-python calls (scripts/bench/llamacpp.py), so every reach into the engine's handles stays in this folder.
Asked through the registry: `kvstore.backend_tools("llamacpp").bare`."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any


def reset(be: Any) -> None:
    """llama-cpp-python's own reset of its Llama (its token history), before its own generate."""
    be.llm.reset()


def greedy(be: Any, ids: list[int], new_tokens: int) -> list[int]:
    """`Llama.generate` at temperature 0 on the backend's context: the first `new_tokens` tokens after `ids`."""
    out: list[int] = []
    for tok in be.llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(int(tok))
        if len(out) == new_tokens:
            break
    return out


def state_bytes(be: Any) -> bytes:
    """The context's sequence 0 as llama.cpp's own state bytes (`llama_state_seq_get_data`)."""
    return be.state_bytes()


def save_file(be: Any, path: Path, tokens: list[int]) -> bool:
    """`llama_state_seq_save_file` of sequence 0 holding `tokens`; False when llama.cpp refuses."""
    arr = (be.ll.llama_token * len(tokens))(*tokens)
    return bool(be.ll.llama_state_seq_save_file(be.ctx, str(path).encode(), 0, arr, len(tokens)))


def set_data(be: Any, buf: Any, size: int) -> None:
    """`llama_state_seq_set_data` of `size` bytes in `buf` (a ctypes buffer) into sequence 0, unverified."""
    be.ll.llama_state_seq_set_data(be.ctx, buf, size, 0)


def load_file(be: Any, path: Path, n: int) -> bool:
    """`llama_state_seq_load_file` of up to `n` tokens into sequence 0; False when llama.cpp refuses."""
    out_tokens, count = (be.ll.llama_token * n)(), ctypes.c_size_t(0)
    return bool(be.ll.llama_state_seq_load_file(be.ctx, str(path).encode(), 0, out_tokens, n, ctypes.byref(count)))


def restored_state(be: Any, tokens: list[int]) -> Any:
    """The backend's current state, said to hold `tokens` (after llama.cpp's own restore of them)."""
    state = be._current  # the state llama.cpp's own restore wrote into (this folder's backend keeps it)
    state.tokens = list(tokens)
    return state
