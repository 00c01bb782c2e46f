"""The first-logits digest computed inside the engine: a vLLM logits processor (vLLM's public extension point,
`LLM(logits_processors=[...])`) that hashes a request's raw logits where the engine has them, so that only a SHA-256
and a token id cross from the engine to the caller instead of the whole vocabulary.

    params = SamplingParams(max_tokens=1, temperature=0.0, extra_args={DIGEST: {"key": "r1", "journal": path}})
    llm.generate(prompts, params)                    # the engine appends {"key", "sha256", "argmax"} lines to path
    DigestReader(path).take(["r1"])                  # -> {"r1": ("<sha256>", <argmax>, <time.time()>)}

Why: a row's first-logits SHA-256 (the graft-vs-twin check's evidence) used to come back as vLLM logprobs over the
whole 262,144-word vocabulary (logprobs=-1, raw logits); vLLM's frontend copies those entry by entry in Python, which
took longer than the whole batched decode of 40 problems (docs/performance.md "Problems in flight"). Here the engine
hashes the float32 logits row itself: the same bytes kvstore.engine.verify.logits_sha256 hashes of the (1, vocab)
float32 logits the logprobs path returned (vLLM's raw-logits logprobs are `logits.to(float32)`; the processors run
on that same tensor, and no built-in processor changes it for these requests: no allowed ids, bad words, bias or
min_tokens). The test (tests/kvstore/test_backend_vllm.py) checks the two paths give equal digests.

A request asks for it with `extra_args[DIGEST] = {"key": <str>, "journal": <path>}` and max_tokens=1: its digest is
written for every step in which it is in the batch without an output token (a chunked prompt's earlier chunks
included: those steps' logits are discarded by the engine), so the line written last for a key is the one of the
position that was sampled. The processor changes no logit (it returns the tensor it was given).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from kvstore.engine.verify import logits_sha256
from kvstore.errors import KVStoreError

DIGEST = "kvgraft_digest"  # the SamplingParams.extra_args key a request asks with
PROCESSOR = "kvstore.backends.vllm.digest:FirstLogitsDigest"  # what launch.start_engine names to vllm.LLM


def _request(params: Any) -> tuple[str, str] | None:
    ask = (getattr(params, "extra_args", None) or {}).get(DIGEST)
    if ask is None:
        return None
    if not isinstance(ask, dict) or not isinstance(ask.get("key"), str) or not isinstance(ask.get("journal"), str):
        raise ValueError(f"extra_args[{DIGEST!r}] must be {{'key': str, 'journal': str}}, got {ask!r}")
    return ask["key"], ask["journal"]


try:  # the class exists only where vLLM does (.venv-vllm); importing this module elsewhere is harmless
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality
except ImportError:  # pragma: no cover - the transformers venv
    LogitsProcessor = object  # type: ignore[assignment,misc]
    MoveDirectionality = None  # type: ignore[assignment,misc]


class FirstLogitsDigest(LogitsProcessor):  # type: ignore[misc,valid-type]
    """Hashes the float32 logits row of each request that asks (module docstring) while it has no output token."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[str, str, list[int]]] = {}  # batch index -> (key, journal, output token ids)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        _request(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # run on every step, greedy ones included (it changes no logit)

    def update_state(self, batch_update: Any) -> None:
        if not batch_update:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            ask = _request(params)
            if ask is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (*ask, output)
        for a, b, direction in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if rb is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        lines: dict[str, list[str]] = {}
        for index, (key, journal, output) in self.rows.items():
            if output or index >= logits.shape[0]:
                continue
            row = logits[index : index + 1].detach().to(torch.float32)  # (1, vocab), as `prefill` returns them
            sha = logits_sha256(row)
            lines.setdefault(journal, []).append(json.dumps({"key": key, "sha256": sha, "argmax": int(row.argmax()),
                                                             "at": time.time()}))
        for journal, text in lines.items():
            with open(journal, "a", encoding="utf-8") as f:  # one write of whole lines, before the step's outputs
                f.write("".join(line + "\n" for line in text))
        return logits


class DigestReader:
    """Reads the digests the engine appended to `path` (whole lines only; the last line of a key wins)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[str, tuple[str, int, float]] = {}
        open(path, "a", encoding="utf-8").close()
        # lines already there are another engine's (a scratch folder reused): never read, whatever their keys
        self.offset = os.path.getsize(path)

    def take(self, keys: Iterable[str]) -> dict[str, tuple[str, int, float]]:
        """{key: (sha256, argmax, at)} for `keys` (`at`: the engine's time.time() when it hashed them), each removed
        once taken; a key the engine wrote no line for is an
        error (the engine was started without the processor, or the request did not ask)."""
        size = os.path.getsize(self.path)
        if size > self.offset:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(size - self.offset)
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                d = json.loads(line)
                self.seen[d["key"]] = (d["sha256"], int(d["argmax"]), float(d["at"]))
            self.offset += end
        keys = list(keys)
        missing = [k for k in keys if k not in self.seen]
        if missing:
            raise KVStoreError(f"the vLLM engine wrote no first-logits digest for {len(missing)} request(s) "
                               f"({missing[:3]}) to {self.path}; start it with kvstore.backends.vllm.launch"
                               f".start_engine(..., logits_processors=[{PROCESSOR!r}])")
        return {k: self.seen.pop(k) for k in keys}
