"""A scripted fake backend: the harness's plumbing (conditions, decoding, stop reasons, graft vs in-context
twins, manifests) tested without any model weights, in milliseconds.

Tokens are UTF-8 bytes + 3 (0 pad, 1 BOS, 2 EOS; vocabulary 259). The "model" continues a context with a
script: when the decoded context contains a key of `script`, it types that key's value one byte after the
other (the last occurrence of the longest key wins), then chooses EOS; with no key it chooses EOS at once.
Logits are a pure function of the token history (the scripted token scores `margin` above a small
pseudo-random floor drawn from the history's SHA-256), so a grafted history gives the bits of a fresh one and
seeded sampling is reproducible. Its state is the token history per batch row; its artifacts are real
kvgraft artifacts (one full-attention layer whose keys and values hold the token ids as float32), content
addressed and verified by the store like any other, recording `determinism["backend"] = "fake"`.

    be = FakeBackend({"Final answer:": " 42\\n\\n"})
    generate(be, be.encode("...Final answer:"), max_new_tokens=8, stop=["\\n\\n"]).text == " 42"

Its capabilities (kvstore.engine.protocol) are declared here, by inheriting them, and nowhere else: it is RaggedRows
(so BatchedRows and Stepwise: the harness's decode loop drives it token by token, several rows and contexts at once);
with the setting `in_engine=True` (`model.fake.in_engine=true`) the loader gives a FakeInEngineBackend, which also
decodes whole rows itself (InEngineBatches, so InEngineDecoding: `continue_rows`, `continue_many`), and the harness
hands it the continuation instead, as it does vLLM. That one flag, in this module, is what a new engine's capability
costs (docs/extending.md); tests/harness/test_capabilities.py shows the harness picking the path.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvstore.backends.settings import BackendSettings
from kvstore.engine.admission import admit
from kvstore.engine.protocol import Backend, Continuation, InEngineBatches, RaggedRows, Registered, RowsRequest
from kvstore.engine.text import Tokenizer
from kvstore.engine.verify import logits_sha256
from kvstore.errors import IncompatibleError, KVStoreError
from kvstore.format.artifact import LayerKV, Snapshot

PAD, BOS, EOS, OFFSET = 0, 1, 2, 3
VOCAB = 256 + OFFSET


@dataclass(frozen=True)
class FakeSettings(BackendSettings):
    """script: context text -> the continuation typed after it; margin: how far above the noise floor the scripted
    token scores; model_name: the name artifacts record."""

    script: dict[str, str] = field(default_factory=dict)
    margin: float = 8.0
    model_name: str = "fake"
    in_engine: bool = False  # True: the backend also decodes whole rows itself (InEngineDecoding)


REGISTERED = Registered("fake", "kvstore.backends.fake:FakeBackend")


@dataclass
class FakeState:
    """The token history of every batch row (all rows share the context; they differ after the first step)."""

    rows: list[list[int]] = field(default_factory=lambda: [[]])


class ByteTokenizer(Tokenizer):
    """The fake's text: UTF-8 bytes + 3 (0 pad, 1 BOS, 2 EOS); nothing is special."""

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        return ([BOS] if add_bos else []) + [b + OFFSET for b in text.encode()]

    def decode(self, ids: list[int]) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")

    def eos_ids(self) -> set[int]:
        return {EOS}

    def vocab_size(self) -> int:
        return VOCAB


class FakeBackend(Backend, RaggedRows):
    """kvstore.engine.protocol.Backend with scripted continuations (see the module docstring)."""

    name = "fake"
    dtype = "float32"
    settings_class = FakeSettings

    @classmethod
    def load(cls, settings: FakeSettings) -> FakeBackend:
        """The registry's loader (kvstore.backends): the in-engine fake when `settings.in_engine`."""
        made = FakeInEngineBackend if settings.in_engine else FakeBackend
        return made(dict(settings.script), settings.margin, settings.model_name)

    def __init__(self, script: dict[str, str] | None = None, margin: float = 8.0, model_name: str = "fake") -> None:
        self.script = dict(script or {})
        self.margin = float(margin)
        self.model_name = model_name
        spec = json.dumps({"script": self.script, "margin": self.margin}, sort_keys=True)
        self.fingerprint = hashlib.sha256(spec.encode()).hexdigest()
        self.tokenizer_fingerprint = hashlib.sha256(b"fake-bytes+3").hexdigest()
        self.calls: dict[str, int] = {"prefill_tokens": 0, "steps": 0, "grafts": 0}  # what the engine was asked

    # facts
    def settings(self) -> dict:
        """The format's five pinned settings (FORMAT.md 6) as the fake has them, its backend and its margin."""
        return {"backend": self.name, "threads": 1, "deterministic_algorithms": True, "attn_implementation": "fake",
                "dtype": self.dtype, "prefill_chunk": 0, "margin": self.margin}

    def environment(self) -> dict:
        return {"backend": self.name}

    # text
    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    # the "model"
    def next_token(self, history: list[int]) -> int:
        """The scripted next token after `history`."""
        text = self.decode(history)
        best = None
        for key in sorted(self.script, key=len, reverse=True):
            at = text.rfind(key)
            if key and at >= 0:
                best = (key, text[at + len(key):])
                break
        if best is None:
            return EOS
        want, typed = self.script[best[0]].encode(), best[1].encode()
        if len(typed) < len(want) and want.startswith(typed):
            return want[len(typed)] + OFFSET
        return EOS

    def _logits(self, history: list[int]) -> torch.Tensor:
        """(vocab,) float32: a floor in [0, 1) from the history's SHA-256, the scripted token `margin` above it."""
        seed = int.from_bytes(hashlib.sha256(json.dumps(history).encode()).digest()[:8], "little")
        out = torch.rand(VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
        out[self.next_token(history)] += self.margin
        return out

    # compute
    def new_state(self) -> FakeState:
        return FakeState()

    def seen(self, state: FakeState) -> int:
        return len(state.rows[0])

    def _one_row(self, state: FakeState, position: int | None) -> list[int]:
        if len(state.rows) != 1:
            raise KVStoreError(f"fake backend: prefill/forward on a state of {len(state.rows)} rows; use step")
        row = state.rows[0]
        if position is not None and position != len(row):
            raise KVStoreError(f"fake backend: position {position}, but the state holds {len(row)} tokens")
        return row

    def forward(self, token_ids: list[int], state: FakeState, position: int | None = None) -> torch.Tensor:
        row = self._one_row(state, position)
        out = []
        for t in token_ids:
            row.append(int(t))
            out.append(self._logits(row))
        self.calls["prefill_tokens"] += len(token_ids)
        return torch.stack(out)[None]  # (1, len, vocab)

    def prefill(self, token_ids: list[int], state: FakeState | None = None,
                position: int | None = None) -> tuple[FakeState, torch.Tensor]:
        if not token_ids:
            raise IncompatibleError("prefill needs at least one token")
        state = state if state is not None else self.new_state()
        return state, self.forward(token_ids, state, position)[:, -1, :]

    def repeat_rows(self, state: FakeState, n: int) -> None:
        state.rows = [list(r) for r in state.rows for _ in range(n)]

    def keep_rows(self, state: FakeState, rows: list[int]) -> None:
        state.rows = [state.rows[i] for i in rows]

    def step(self, state: FakeState, tokens: list[int], position: int) -> torch.Tensor:
        if len(tokens) != len(state.rows):
            raise KVStoreError(f"fake backend: {len(tokens)} tokens for {len(state.rows)} rows")
        self.calls["steps"] += 1
        out = []
        for row, t in zip(state.rows, tokens):
            if len(row) != position:
                raise KVStoreError(f"fake backend: step at position {position}, a row holds {len(row)} tokens")
            row.append(int(t))
            out.append(self._logits(row))
        return torch.stack(out)  # (rows, vocab)

    # rows of different contexts in one batch (RaggedRows: problems in flight)
    def join_rows(self, states: Sequence[FakeState]) -> FakeState:
        if not states:
            raise KVStoreError("fake backend: join_rows of no states")
        self.calls["joins"] = self.calls.get("joins", 0) + 1
        return FakeState([list(r) for s in states for r in s.rows])

    def step_rows(self, state: FakeState, tokens: list[int], positions: list[int]) -> torch.Tensor:
        if not len(tokens) == len(positions) == len(state.rows):
            raise KVStoreError(f"fake backend: {len(tokens)} tokens, {len(positions)} positions for "
                               f"{len(state.rows)} rows")
        self.calls["steps"] += 1
        out = []
        for row, t, p in zip(state.rows, tokens, positions, strict=True):
            if len(row) != p:
                raise KVStoreError(f"fake backend: step_rows at position {p}, the row holds {len(row)} tokens")
            row.append(int(t))
            out.append(self._logits(row))
        return torch.stack(out)

    # artifacts
    def capture(self, state: FakeState, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        row = self._one_row(state, None)
        if row != list(token_ids):
            raise IncompatibleError(f"fake backend: the state holds {len(row)} tokens that are not the "
                                    f"{len(token_ids)} token ids given; capture the state that computed them")
        kv = torch.tensor(row, dtype=torch.float32).view(1, 1, len(row), 1)  # (batch, kv_heads, tokens, head_dim)
        return Snapshot(
            token_ids=list(row), start_position=0, layers=[LayerKV("full", None, len(row), kv, kv.clone())],
            model_fingerprint=self.fingerprint, tokenizer_fingerprint=self.tokenizer_fingerprint, dtype=self.dtype,
            determinism=self.settings(), environment=self.environment(), model_name=self.model_name,
            extra=dict(extra or {}),
        )

    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> FakeState:
        admit(snapshot, self, token_ids)  # the one admission (kvstore.engine.admission)
        name = snapshot.model_name or "artifact"
        held = [int(x) for x in snapshot.layers[0].keys.flatten().tolist()]
        if held != list(snapshot.token_ids):
            raise IncompatibleError(f"{name}: its keys do not hold its token ids; deposit it again")
        self.calls["grafts"] += 1
        return FakeState([held])


class FakeInEngineBackend(FakeBackend, InEngineBatches):
    """The fake with the InEngineDecoding capability: it continues whole rows itself, as an engine with its own
    batching and sampler does (`calls["continue_rows"]` counts the rows; no `step` is taken)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.calls["continue_rows"] = 0

    def continue_rows(self, state: FakeState | None, prompt_ids: list[int], seeds: Sequence[int], *,
                      max_new_tokens: int, stop: Sequence[str] = (), strategy: str = "greedy",
                      temperature: float = 0.7, top_p: float = 0.95,
                      eos: set[int] | None = None) -> list[Continuation]:
        """Each seed's row: greedy takes the scripted argmax, sample draws from softmax(logits / temperature) with a
        generator seeded by the row's seed; a row ends at EOS (left out), a stop string (its token kept) or the
        budget."""
        t0 = time.perf_counter()
        held = [] if state is None else list(state.rows[0])
        if list(prompt_ids[: len(held)]) != held:
            raise IncompatibleError("fake backend: the prompt does not begin with the tokens the state holds")
        eos = self.eos_ids() if eos is None else set(eos)
        first = self._logits(list(prompt_ids))
        self.calls["prefill_tokens"] += len(prompt_ids) - len(held)
        sha, ttft = logits_sha256(first[None]), time.perf_counter() - t0
        out = []
        for seed in seeds:
            gen = torch.Generator().manual_seed(int(seed))
            history, ids, reason, logits = list(prompt_ids), [], "length", first
            for _ in range(max_new_tokens):
                if strategy == "greedy":
                    tok = int(torch.argmax(logits))
                else:
                    tok = int(torch.multinomial(torch.softmax(logits.double() / max(temperature, 1e-6), -1), 1,
                                                generator=gen))
                if tok in eos:
                    reason = "eos"
                    break
                ids.append(tok)
                history.append(tok)
                if any(s and s in self.decode(ids) for s in stop):
                    reason = "stop"
                    break
                logits = self._logits(history)
            self.calls["continue_rows"] += 1
            out.append(Continuation(ids, reason, sha, ttft))
        return out

    def continue_many(self, requests: Sequence[RowsRequest], *, max_new_tokens: int, stop: Sequence[str] = (),
                      strategy: str = "greedy", temperature: float = 0.7, top_p: float = 0.95,
                      eos: set[int] | None = None) -> list[list[Continuation]]:
        """Every request's rows (InEngineBatches): the fake's rows do not depend on what else is in flight."""
        self.calls["continue_many"] = self.calls.get("continue_many", 0) + 1
        return [self.continue_rows(r.state, r.prompt_ids, r.seeds, max_new_tokens=max_new_tokens, stop=stop,
                                   strategy=strategy, temperature=temperature, top_p=top_p, eos=eos)
                for r in requests]

    def graft_refusal(self, token_count: int) -> str | None:
        """The fake grafts every artifact it deposits."""
        return None

