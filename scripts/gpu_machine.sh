#!/usr/bin/env bash
# The GPU machine's command (docs/performance.md, "On a GPU"): run from the repository root there, with
# build/gpu-wheels carried (make gpu-wheels). Uses that machine's python3 as it is (torch, transformers,
# safetensors, numpy, nvidia-ml-py preinstalled); unpacks only the carried wheels, into a folder of its own
# (no pip, no index, no network). Writes gpu_bench.json and gpu_bench.txt under $OUT (default runs/gpu).
#   GPU_BENCH_ARGS="--device cpu --small --samples 2 --sizes 24" bash scripts/gpu_machine.sh   # a CPU dry run
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/gpu}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
SITE="$(mktemp -d)/site"
# A wheel is a zip: unpack the one for this python into $SITE (no pip, no index, no network needed)
"$PY" - "$SITE" <<'PY'
import glob, sys, zipfile
tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
found = [p for p in sorted(glob.glob("build/gpu-wheels/*.whl")) if f"-{tag}-" in p]
if not found:
    sys.exit(f"build/gpu-wheels has no wheel for {tag}: run `make gpu-wheels` (add this version) and carry it")
for wheel in found:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
    print("unpacked", wheel)
PY
"$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
# shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of flags
PYTHONPATH="$PWD:$SITE" "$PY" -m scripts.gpu_bench --budget-s "${BUDGET_S:-400}" --out "$OUT/gpu_bench.json" \
  ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu_bench.txt"
