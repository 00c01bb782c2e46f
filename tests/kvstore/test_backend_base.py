"""The backend seam as one abstract base class (kvstore.engine.protocol.Backend, issue 50): a new backend writes only
the abstract members (their number is in docs/extending.md), one that leaves one out fails when it is made, not at
its first call; capabilities are nominal (a backend inherits what it does: llama.cpp claims Stepwise and nothing it
refuses), read off the class by the registry before anything loads."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvstore
from harness.errors import ConfigError
from harness.run.decode import Sampling, generate_batch
from kvstore import Backend, BatchedRows, InEngineBatches, InEngineDecoding, RaggedRows, Repositioning, Stepwise
from kvstore.backends.fake import BOS, EOS, OFFSET, VOCAB, ByteTokenizer, FakeBackend, FakeInEngineBackend, FakeState
from kvstore.engine.protocol import ABSTRACT
from kvstore.format.artifact import LayerKV, Snapshot

REPO = Path(__file__).resolve().parents[2]


class Copy(Backend, Stepwise):
    """A new backend written against the base, a copy of the fake: its abstract members, Stepwise's, nothing else."""

    name = "copy"

    @classmethod
    def load(cls, settings: object) -> Copy:
        return cls()

    def __init__(self) -> None:
        self.model_name, self.dtype = "copy", "float32"
        self.fingerprint, self.tokenizer_fingerprint = "c" * 64, "t" * 64

    def settings(self) -> dict:
        return {"backend": self.name, "threads": 1, "deterministic_algorithms": True, "attn_implementation": "copy",
                "dtype": self.dtype, "prefill_chunk": 0}

    def environment(self) -> dict:
        return {"backend": self.name}

    def tokenizer(self) -> ByteTokenizer:
        return ByteTokenizer()

    def seen(self, state: FakeState) -> int:
        return len(state.rows[0])

    def prefill(self, token_ids, state=None, position=None):  # noqa: ANN001, ANN201
        state = state if state is not None else self.new_state()
        return state, self.forward(token_ids, state, position)[:, -1, :]

    def capture(self, state: FakeState, token_ids: list[int], extra: dict | None = None) -> Snapshot:
        kv = torch.tensor(state.rows[0], dtype=torch.float32).view(1, 1, -1, 1)
        return Snapshot(token_ids=list(token_ids), start_position=0, layers=[LayerKV("full", None, len(token_ids), kv,
                        kv.clone())], model_fingerprint=self.fingerprint, tokenizer_fingerprint=self.tokenizer_fingerprint,
                        dtype=self.dtype, determinism=self.settings(), environment=self.environment(),
                        model_name=self.model_name, extra=dict(extra or {}))

    def graft(self, snapshot: Snapshot, token_ids: list[int] | None = None) -> FakeState:
        return FakeState([list(snapshot.token_ids)])

    # Stepwise: a model that always says "ok" then EOS
    def new_state(self) -> FakeState:
        return FakeState()

    def _next(self, row: list[int]) -> torch.Tensor:
        said = self.decode(row).rsplit(">", 1)[-1]  # what it typed after the prompt's ">"
        out = torch.zeros(VOCAB)
        out[{"": ord("o") + OFFSET, "o": ord("k") + OFFSET}.get(said, EOS)] = 1.0
        return out

    def forward(self, token_ids, state, position=None):  # noqa: ANN001, ANN201
        out = []
        for t in token_ids:
            state.rows[0].append(int(t))
            out.append(self._next(state.rows[0]))
        return torch.stack(out)[None]

    def step(self, state, tokens, position):  # noqa: ANN001, ANN201
        state.rows[0].append(int(tokens[0]))
        return self._next(state.rows[0])[None]


def test_the_base_has_the_abstract_members_docs_extending_states() -> None:
    assert ABSTRACT == ("capture", "environment", "graft", "load", "prefill", "seen", "settings", "tokenizer")
    text = (REPO / "docs" / "extending.md").read_text()
    stated = re.search(r"\*\*(\d+) abstract members\*\*", text)
    assert stated and int(stated.group(1)) == len(ABSTRACT), "docs/extending.md must state the count"
    assert all(f"`{name}`" in text for name in ABSTRACT)


def test_a_new_backend_needs_only_the_abstract_members() -> None:
    written = {n for n, v in vars(Copy).items()
               if (callable(v) or isinstance(v, classmethod)) and not n.startswith("__")} - {"_next"}
    assert written == set(ABSTRACT) | {"new_state", "forward", "step"}  # the core's abstract ones, Stepwise's
    be = Copy()
    assert be.encode("ab") == [BOS, ord("a") + OFFSET, ord("b") + OFFSET] and be.decode(be.encode("ab")) == "ab"
    assert be.eos_ids() == {EOS} and be.vocab_size() == VOCAB and be.chat_template() is None  # from the tokenizer
    assert (be.context_size(), be.allows_environment_mismatch(), be.torch_threads_matter(), be.numerics(),
            be.row_schedule(), be.batch_invariant(), be.pinned_weights()) == (None, False, False, None, None, False,
                                                                                None)
    assert be.rows_depend_on_batch(1) is False and be.rows_depend_on_batch(4) is True
    g = generate_batch(be, be.encode("say>"), 1, [0], Sampling(8))[0]  # the harness's decode loop drives it
    assert g.text == "ok" and g.stop_reason == "eos"
    with pytest.raises(ConfigError, match=r"decoding.batch_size=2: the copy backend decodes one row at a time"):
        generate_batch(be, be.encode("say>"), 2, [0, 1], Sampling(8))  # no BatchedRows: asked, not caught


@pytest.mark.parametrize("member", ABSTRACT)
def test_a_backend_leaving_an_abstract_member_out_fails_when_made(member: str) -> None:
    written = {m: vars(Copy)[m] for m in ABSTRACT if m != member}
    incomplete = type("Incomplete", (Backend,), {"name": "incomplete", **written})  # written without `member`
    with pytest.raises(TypeError, match=f"abstract method.*{member}"):
        incomplete()


def test_capabilities_are_nominal_and_llama_cpp_claims_only_what_it_does() -> None:
    """llama.cpp's class is Stepwise only (no repeat_rows / keep_rows / multi-row step); read without llama-cpp."""
    code = ("import sys; sys.modules['llama_cpp'] = None\n"
            "from kvstore import BatchedRows, RaggedRows, Stepwise, InEngineDecoding\n"
            "from kvstore.backends.llamacpp.backend import LlamaCppBackend as L\n"
            "print(issubclass(L, Stepwise), issubclass(L, BatchedRows), issubclass(L, RaggedRows),"
            " issubclass(L, InEngineDecoding), hasattr(L, 'repeat_rows'), hasattr(L, 'keep_rows'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False", "False", "False", "False"]
    assert issubclass(FakeBackend, RaggedRows) and issubclass(RaggedRows, BatchedRows)
    assert issubclass(FakeInEngineBackend, InEngineBatches) and issubclass(InEngineBatches, InEngineDecoding)
    assert not issubclass(FakeBackend, (InEngineDecoding, Repositioning))


def test_a_structural_look_alike_is_not_a_backend() -> None:
    class LooksLike:  # every verb, but never declared: the harness does not take it for a backend or a capability
        locals().update({m: (lambda self, *a, **k: None) for m in (*ABSTRACT, "new_state", "forward", "step",
                                                                   "repeat_rows", "keep_rows")})
    assert not isinstance(LooksLike(), Backend) and not isinstance(LooksLike(), Stepwise)


def test_in_flight_on_llama_cpp_is_refused_before_the_gguf_loads_in_one_line() -> None:
    code = ("import sys; sys.modules['llama_cpp'] = None\n"  # nothing of llama.cpp can load
            "from harness.config.schema import compose_config, typed\n"
            "from harness.errors import ConfigError\n"
            "try:\n    typed(compose_config(['model=gemma3_270m_llamacpp', 'run.in_flight=4']))\n"
            "except ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run.in_flight=4: the llamacpp backend decodes one context at a "
                                                   "time") and lines[0].endswith("set run.in_flight=1"), lines


def test_vllm_does_not_claim_the_tested_batch_invariant_mode() -> None:
    """vLLM's own VLLM_BATCH_INVARIANT is recorded in its settings (under "batch_invariant"), never claimed as
    kvgraft's tested mode: its `batch_invariant()` is the base's False (read on the source: the engine is not
    importable in this venv)."""
    tree = ast.parse((REPO / "kvstore" / "backends" / "vllm" / "backend.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VllmBackend")
    defined = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "batch_invariant" not in defined
    assert Backend.batch_invariant(FakeBackend()) is False


def test_every_registered_backend_declares_its_class_and_loads_one_of_it() -> None:
    """The registry holds a name and a class, nothing else: the class answers its settings, refusals and loader."""
    import dataclasses

    from kvstore.backends import registered
    from kvstore.engine.protocol import Registered

    assert [f.name for f in dataclasses.fields(Registered)] == ["name", "backend"]
    for name in kvstore.backend_names():  # read before anything loads
        cls = kvstore.backend_class(name)
        assert cls.name == name and issubclass(cls, Backend)
        assert kvstore.settings_class(name) is cls.settings_class
        assert (kvstore.batch_invariant_refusal(name) is None) == (cls.batch_invariant_absent == "")
    for in_engine in (False, True):
        be = kvstore.load_backend("fake", in_engine=in_engine)
        assert isinstance(be, registered("fake").backend_class())


def test_an_entry_naming_something_else_is_refused_in_one_line() -> None:
    from kvstore.engine.protocol import Registered
    from kvstore.errors import ModelLoadError

    for wrong in ("kvstore.backends.fake:FakeSettings", "kvstore.backends.fake:ByteTokenizer"):
        with pytest.raises(ModelLoadError, match=r"backend 'fake': its entry names .* not a Backend class named"):
            Registered("fake", wrong).backend_class()
    with pytest.raises(ModelLoadError, match=r"not a Backend class named 'copy'"):  # a Backend, another name
        Registered("copy", "kvstore.backends.fake:FakeBackend").backend_class()


def test_the_one_deposit_is_prefill_then_capture_and_refuses_nothing_to_deposit() -> None:
    be = kvstore.load_backend("fake", script={"ab": "c"})
    ids = be.encode("ab")
    state, _ = be.prefill(ids)
    assert be.deposit(ids, extra={"why": "test"}).token_ids == be.capture(state, ids).token_ids == ids
    assert kvstore.to_bytes(be.deposit(ids)) == kvstore.to_bytes(be.capture(be.prefill(ids)[0], ids))
    with pytest.raises(kvstore.KVStoreError, match="nothing to deposit"):
        be.deposit([])
