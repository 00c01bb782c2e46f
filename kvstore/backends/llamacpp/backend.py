"""The llama.cpp backend (llama-cpp-python): a GGUF file in one llama.cpp context, its KV cache as the state, and
its per-sequence state (llama_state_seq_get_data / set_data) turned into ordinary kvgraft artifacts.

    from kvstore.backends.llamacpp.backend import LlamaCppBackend
    from kvstore.backends.llamacpp.settings import LlamaCppSettings
    be = LlamaCppBackend(LlamaCppSettings(n_ctx=4096))             # the bundled Gemma 3 270M GGUF
    state, logits = be.prefill(be.encode("Problem: ..."))          # chunks of n_batch tokens
    snap = be.capture(state, ids)                                  # a Snapshot: store.put / get / graft
    state = be.graft(snap, ids + more)                             # checked, then llama_state_seq_set_data

What an artifact holds (kvstore/FORMAT.md section 10): llama.cpp's sequence state, parsed into the format's
layers, every byte kept: per layer the K rows and V rows llama.cpp wrote, as (1, kv_heads, cells, head_dim)
tensors in the cache type (f16 by default). Layers come in the order llama.cpp's state holds them: the
full-attention cache's layers, then the sliding-window cache's (interleaved SWA models such as Gemma 3). A
sliding layer keeps the last n_swa positions, so in the format's terms (cached = window - 1) its window is
n_swa + 1. `capture` parses the state and serializes it back, and refuses unless the bytes are identical, so a
snapshot is llama.cpp's state exactly; `graft` rebuilds those bytes and hands them to llama.cpp only after
every admission check (backend, GGUF SHA-256, tokenizer, every setting and the llama.cpp build, environment,
layout, token prefix); a restore llama.cpp rejects clears the cache and raises (a failed restore must not
leave a half-written KV, llama.cpp #27068).

One context holds one state: `new_state` and `graft` clear the cache and return a handle; using an older
handle raises. It is Stepwise and nothing more (kvstore.engine.protocol): one row of one context at a time, so it
claims neither BatchedRows (several rows of a context) nor RaggedRows (several contexts in flight), and a caller asks
that with isinstance before it decodes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from kvstore.backends.llamacpp.settings import LlamaCppSettings
from kvstore.backends.llamacpp.state import GGML_TYPE_OF, parse_state, serialize_state, state_layers
from kvstore.backends.packaged import BUNDLED, file_sha256, gguf_path, known_names
from kvstore.engine.admission import admit
from kvstore.engine.protocol import Backend, Stepwise
from kvstore.engine.text import Tokenizer
from kvstore.engine.weights import PinnedWeights
from kvstore.environment import current_environment
from kvstore.errors import IncompatibleError, KVStoreError, ModelLoadError, SettingsError
from kvstore.format.artifact import Snapshot, check_snapshot

NAME = "llamacpp"


def _tokenizer_fingerprint(path: str) -> str:
    """SHA-256 over the GGUF's tokenizer metadata (every `tokenizer.*` field, canonical JSON)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    h = hashlib.sha256()
    for name in sorted(k for k in reader.fields if k.startswith("tokenizer.")):
        field = reader.fields[name]
        parts = [bytes(field.parts[i]) for i in field.data]
        h.update(name.encode() + b"\0" + hashlib.sha256(b"\0".join(parts)).digest())
    return h.hexdigest()


@contextlib.contextmanager
def weight_buffers(extra_bufts: bool) -> Iterator[None]:
    """llama.cpp's extra weight buffer types (AMX, repacked weights) on or off for the models loaded inside: Llama()
    has no argument for use_extra_bufts, it reads llama_model_default_params, which this patches for the duration
    (the one place the project does so; scripts/bench/peer.py loads its peer through it too)."""
    import llama_cpp.llama as llama_module

    default_params = llama_module.llama_cpp.llama_model_default_params

    def model_params():  # noqa: ANN202
        p = default_params()
        p.use_extra_bufts = extra_bufts
        return p

    llama_module.llama_cpp.llama_model_default_params = model_params
    try:
        yield
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params


@dataclass
class LlamaState:
    """A handle on the context's KV cache: valid while it is the context's current state."""

    generation: int
    tokens: list[int]


class LlamaTokenizer(Tokenizer):
    """llama.cpp's own tokenizer (the GGUF's): tokenize / detokenize, its EOS and EOT tokens, its chat template."""

    def __init__(self, llm, ll, vocab, n_vocab: int) -> None:  # noqa: ANN001  (llama_cpp's objects)
        self.llm, self.ll, self.vocab, self.n_vocab = llm, ll, vocab, n_vocab

    def encode(self, text: str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`; `special`: control tokens written in it (`<|im_start|>`) are parsed as such."""
        return list(self.llm.tokenize(text.encode(), add_bos=add_bos, special=special))

    def chat_template(self) -> str | None:
        """The GGUF's `tokenizer.chat_template` (None when it has none)."""
        return self.llm.metadata.get("tokenizer.chat_template") or None

    def decode(self, ids: list[int]) -> str:
        return self.llm.detokenize(list(ids)).decode(errors="replace")

    def eos_ids(self) -> set[int]:
        ids = {int(self.ll.llama_vocab_eos(self.vocab)), int(self.ll.llama_vocab_eot(self.vocab))}
        return {i for i in ids if i >= 0}

    def vocab_size(self) -> int:
        return self.n_vocab


class LlamaCppBackend(Backend, Stepwise):
    """kvstore.engine.protocol.Backend over llama-cpp-python (see the module docstring)."""

    name = NAME
    settings_class = LlamaCppSettings
    batch_invariant_absent = ("llama.cpp has no batch-invariant mode: its CPU matrix products and attention pick their "
                              "kernels and split their reductions by the batch's token count (n_batch/n_ubatch), and "
                              "nothing pins them")

    @classmethod
    def load(cls, settings: LlamaCppSettings) -> LlamaCppBackend:
        """The registry's loader (kvstore.backends): the GGUF the settings name, loaded by llama.cpp."""
        return cls(settings)

    def __init__(self, settings: LlamaCppSettings | None = None) -> None:
        try:
            import llama_cpp
        except ImportError as e:
            raise ModelLoadError("the llama.cpp backend needs llama-cpp-python: `make setup` builds it "
                                 f"(pip install -c constraints.txt llama-cpp-python); {e}") from e
        self.ll = llama_cpp
        s = settings or LlamaCppSettings()
        if not s.gguf or s.gguf in known_names():  # "" = the bundled GGUF; a packaged model's name = its file
            s = LlamaCppSettings(**{**asdict(s), "gguf": str(gguf_path(s.gguf or BUNDLED))})
        for part in ("type_k", "type_v"):
            if getattr(s, part) not in GGML_TYPE_OF:
                raise SettingsError(f"llamacpp.{part}={getattr(s, part)!r}: use one of {sorted(GGML_TYPE_OF)} "
                                    "(quantized KV caches are not stored as artifacts)")
        if not Path(s.gguf).is_file():
            raise ModelLoadError(f"llamacpp.gguf={s.gguf!r}: no such file; give a GGUF model file")
        self.cfg = s
        self.model_name = s.model_name
        errors: list[str] = []  # llama.cpp's own error lines while loading (verbose=False hides them)

        @llama_cpp.llama_log_callback
        def keep_errors(level, text, user_data):
            if level == 4 or (level == 5 and errors):  # GGML_LOG_LEVEL_ERROR, then its continuation lines
                errors.append(text.decode("utf-8", "replace").strip())

        llama_cpp.llama_log_set(keep_errors, ctypes.c_void_p(0))
        self.weights = PinnedWeights.of([s.gguf])  # the file as it is before llama.cpp reads it
        try:
            # use_mmap=False: the weights are read into memory of this process once (kvstore/engine/weights.py): a
            # file changed or cut short later cannot change them, nor kill the process with SIGBUS
            with weight_buffers(s.extra_bufts):
                self.llm = llama_cpp.Llama(
                    model_path=s.gguf, n_ctx=s.n_ctx, n_batch=s.n_batch, n_ubatch=s.n_ubatch, n_threads=s.threads,
                    n_threads_batch=s.threads, flash_attn=s.flash_attn, swa_full=s.swa_full, logits_all=False,
                    type_k=GGML_TYPE_OF[s.type_k], type_v=GGML_TYPE_OF[s.type_v], verbose=False, use_mmap=False,
                )
        except ValueError as e:  # llama-cpp-python's "Failed to load model from file" (the reason went to the log)
            reason = next((x for x in errors if x), str(e))
            raise ModelLoadError(f"llamacpp.gguf={s.gguf!r}: llama.cpp cannot load it: {reason}; give a complete, "
                                 "unmodified GGUF model file") from None
        finally:
            from llama_cpp._logger import llama_log_callback  # llama-cpp-python's own, set when it was imported

            llama_cpp.llama_log_set(llama_log_callback, ctypes.c_void_p(0))
        self.ctx = self.llm.ctx
        self.model = self.llm.model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self._text = LlamaTokenizer(self.llm, llama_cpp, self.vocab, self._n_vocab)
        self.kv_heads = int(llama_cpp.llama_model_n_head_kv(self.model))
        self.n_swa = int(llama_cpp.llama_model_n_swa(self.model))
        self.fingerprint = file_sha256(Path(s.gguf))  # SHA-256 of the GGUF file: the model fingerprint
        self.weights.check("while it was loaded and hashed")  # so the bytes hashed are the bytes loaded
        self.tokenizer_fingerprint = _tokenizer_fingerprint(s.gguf)
        self.dtype = s.type_k
        self._generation = 0
        self._current = LlamaState(0, [])
        self._batch = llama_cpp.llama_batch_init(max(s.n_batch, 1), 0, 1)
        self._clear()

    def close(self) -> None:
        """Free the batch and the llama.cpp context and model (the backend is unusable after)."""
        batch, self._batch = getattr(self, "_batch", None), None
        if batch is not None:
            self.ll.llama_batch_free(batch)
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown: llama_cpp's module may be gone already)
            pass

    # facts
    def settings(self) -> dict:
        """The recorded settings: the format's five (threads, deterministic_algorithms, attn_implementation,
        dtype, prefill_chunk = n_batch), the backend, and every llama.cpp setting and build fact."""
        s = self.cfg
        return {
            "backend": NAME, "threads": s.threads, "deterministic_algorithms": True,
            "attn_implementation": "llamacpp-flash" if s.flash_attn else "llamacpp", "dtype": s.type_k,
            "prefill_chunk": s.n_batch, "n_ctx": s.n_ctx, "n_batch": s.n_batch, "n_ubatch": s.n_ubatch,
            "type_k": s.type_k, "type_v": s.type_v, "flash_attn": s.flash_attn, "swa_full": s.swa_full,
            "extra_bufts": s.extra_bufts, "llama_cpp_python": self.ll.__version__,
            "llama_cpp": self.ll.llama_version().decode(),
            "llama_state_seq_version": int(self.ll.LLAMA_STATE_SEQ_VERSION),
            "llama_system_info": self.ll.llama_print_system_info().decode().strip(),
        }

    def context_size(self) -> int | None:
        """n_ctx: the positions llama.cpp's context holds."""
        return int(self.cfg.n_ctx)

    def environment(self) -> dict:
        return current_environment(torch.device("cpu")).to_dict()

    def pinned_weights(self) -> PinnedWeights:
        """The GGUF file, pinned before llama.cpp read it."""
        return self.weights

    # text
    def tokenizer(self) -> LlamaTokenizer:
        return self._text

    # state handles
    def _clear(self) -> LlamaState:
        self.ll.llama_memory_clear(self.ll.llama_get_memory(self.ctx), True)
        self._generation += 1
        self._current = LlamaState(self._generation, [])
        return self._current

    def _check(self, state: LlamaState) -> None:
        if not isinstance(state, LlamaState) or state.generation != self._current.generation:
            raise KVStoreError("llamacpp: this state is no longer the context's (a llama.cpp context holds one "
                               "state at a time; new_state and graft replace it): use the newest state")

    def new_state(self) -> LlamaState:
        return self._clear()

    def seen(self, state: LlamaState) -> int:
        self._check(state)
        return len(state.tokens)

    # compute
    def _decode(self, state: LlamaState, token_ids: list[int], all_logits: bool) -> torch.Tensor:
        """One llama_decode of `token_ids` (at most n_batch) after what `state` holds; logits (n_out, vocab)."""
        b, n, start = self._batch, len(token_ids), len(state.tokens)
        if start + n > self.cfg.n_ctx:
            raise SettingsError(f"llamacpp: {start + n} tokens do not fit n_ctx={self.cfg.n_ctx}; raise the "
                                "llama.cpp setting n_ctx (LlamaCppSettings.n_ctx)")
        b.n_tokens = n
        for i, t in enumerate(token_ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = int(t), start + i, 1, 0
            b.logits[i] = all_logits or i == n - 1
        rc = self.ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise KVStoreError(f"llamacpp: llama_decode returned {rc} at position {start} ({n} tokens)")
        state.tokens.extend(int(t) for t in token_ids)
        rows = n if all_logits else 1
        ptr = self.ll.llama_get_logits(self.ctx)
        arr = np.ctypeslib.as_array(ptr, shape=(rows, self._n_vocab))
        return torch.from_numpy(arr.copy())  # (rows, vocab) float32

    def _positioned(self, state: LlamaState, position: int | None) -> None:
        self._check(state)
        if position is not None and position != len(state.tokens):
            raise KVStoreError(f"llamacpp: position {position}, but the state holds {len(state.tokens)} tokens; "
                               "llama.cpp computes at the next position only (offset 0)")

    def prefill(self, token_ids: list[int], state: LlamaState | None = None,
                position: int | None = None) -> tuple[LlamaState, torch.Tensor]:
        """`token_ids` after `state` (a fresh one by default) in chunks of n_batch; the last logits (1, vocab)."""
        if not token_ids:
            raise IncompatibleError("prefill needs at least one token")
        state = state if state is not None else self.new_state()
        self._positioned(state, position)
        chunk = self.cfg.n_batch
        logits = None
        for i in range(0, len(token_ids), chunk):
            logits = self._decode(state, list(token_ids[i : i + chunk]), all_logits=False)
        return state, logits

    def forward(self, token_ids: list[int], state: LlamaState, position: int | None = None) -> torch.Tensor:
        """`token_ids` after `state`, every position's logits (1, len, vocab); chunks of n_batch."""
        self._positioned(state, position)
        out = [self._decode(state, list(token_ids[i : i + self.cfg.n_batch]), all_logits=True)
               for i in range(0, len(token_ids), self.cfg.n_batch)]
        return torch.cat(out)[None]

    def step(self, state: LlamaState, tokens: list[int], position: int) -> torch.Tensor:
        """One token of the one row at `position` (Stepwise without BatchedRows)."""
        if len(tokens) != 1:
            raise KVStoreError(f"llamacpp: step of {len(tokens)} tokens; it decodes one row (no BatchedRows), one "
                               "token at a time")
        self._positioned(state, position)
        return self._decode(state, tokens, all_logits=False)

    # the sequence state <-> a Snapshot
    def state_bytes(self) -> bytes:
        size = int(self.ll.llama_state_seq_get_size(self.ctx, 0))
        buf = (ctypes.c_uint8 * size)()
        got = int(self.ll.llama_state_seq_get_data(self.ctx, buf, size, 0))
        if got != size:
            raise KVStoreError(f"llamacpp: llama_state_seq_get_data wrote {got} of {size} bytes")
        return bytes(buf)

    def capture(self, state: LlamaState, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        """The context's sequence 0 as a Snapshot of exactly `token_ids` (computed from position 0).

        Refused (IncompatibleError, before anything is stored) when the state is not what the tokens say, when
        llama.cpp's state is not one this parser reproduces byte for byte, or when a sliding-window cache
        without swa_full has dropped positions a graft would need or holds them out of order."""
        self._check(state)
        if list(state.tokens) != list(token_ids):
            raise IncompatibleError(f"llamacpp: the state holds {len(state.tokens)} tokens that are not the "
                                    f"{len(token_ids)} token ids given; capture the state that computed them")
        t = len(token_ids)
        blob = self.state_bytes()
        hint = ("" if self.cfg.swa_full else "; set the llama.cpp setting swa_full=True (the sliding-window cache then "
                "holds every position in order, as a fresh prefill and a graft lay it out)")
        caches = parse_state(blob, t, hint)
        layers = state_layers(caches, t, self.n_swa, self.kv_heads, self.dtype, self.cfg.type_v, hint)
        snap = Snapshot(
            token_ids=list(token_ids), start_position=0, layers=layers, model_fingerprint=self.fingerprint,
            tokenizer_fingerprint=self.tokenizer_fingerprint, dtype=self.dtype, determinism=self.settings(),
            environment=self.environment(), model_name=self.model_name, extra=dict(extra or {}),
        )
        check_snapshot(snap)
        again, mine = self._serialize(snap), np.frombuffer(blob, np.uint8)
        if again.shape != mine.shape or not np.array_equal(again, mine):
            n = min(len(again), len(mine))
            first = int(np.flatnonzero(again[:n] != mine[:n])[0]) if not np.array_equal(again[:n], mine[:n]) else n
            raise IncompatibleError(f"llamacpp: the sequence state ({len(blob)} bytes) does not round-trip through "
                                    f"the artifact layout (first difference at byte {first}); this llama.cpp "
                                    f"{self.ll.llama_version().decode()} state layout is not supported")
        return snap

    def _serialize(self, snap: Snapshot, restore: bool = False) -> np.ndarray:
        """llama.cpp's sequence state of `snap`; `restore`: laid out as a fresh prefill (llamacpp_state)."""
        return serialize_state(snap.layers, snap.token_count, snap.dtype, not self.cfg.flash_attn, restore)

    # graft
    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> LlamaState:
        """A fresh state holding the snapshot, after every admission check (each an IncompatibleError naming
        the difference, raised before a byte reaches llama.cpp)."""
        admit(snapshot, self, token_ids)  # the one admission (kvstore.engine.admission)
        name, n = snapshot.model_name or "artifact", snapshot.token_count
        if n >= self.cfg.n_ctx:
            raise SettingsError(f"{name}: {n} tokens do not fit n_ctx={self.cfg.n_ctx}; raise the llama.cpp setting "
                                "n_ctx")
        blob = self._serialize(snapshot, restore=True)
        state = self._clear()
        buf = (ctypes.c_uint8 * len(blob)).from_buffer(blob)
        got = int(self.ll.llama_state_seq_set_data(self.ctx, buf, len(blob), 0))
        pos_max = int(self.ll.llama_memory_seq_pos_max(self.ll.llama_get_memory(self.ctx), 0))
        if got != len(blob) or pos_max != n - 1:
            self._clear()  # a failed restore must not leave a half-written cache behind
            raise IncompatibleError(f"{name}: llama.cpp refused the state ({got} of {len(blob)} bytes read, last "
                                    f"position {pos_max}, expected {n - 1}); the cache was cleared")
        state.tokens = list(snapshot.token_ids)
        return state

    def sliding_window(self) -> int | None:
        """The positions a sliding-window layer attends to (llama.cpp's n_swa; its artifact records the window as
        n_swa + 1, FORMAT.md's cached = window - 1); None for a model without sliding layers."""
        return self.n_swa or None


def settings_json(settings: LlamaCppSettings) -> str:
    return json.dumps(asdict(settings), sort_keys=True)

