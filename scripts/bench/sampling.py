"""avg@n sampling throughput of the three engines on the same problems, one run each, ratios from one invocation.

For each engine the harness itself runs (`python -m harness condition=baseline decoding=sample`, the engine's own
venv: .venv-vllm for vLLM, .venv otherwise) n seeded chain-of-thought samples per problem at a fixed token budget,
and this script reads what the run folder recorded: decode tokens, the run's wall time, avg@n and pass@n, stop
reasons. Throughput = decode tokens / run wall time (the model load is outside the run's wall; each engine's own
batching: vLLM samples the n rows in one request, transformers decodes them as one batch, llama.cpp one row at a
time, the only way it decodes here). The engines run one after another; the load average before and after each is
printed, since a shared machine moves these figures.

    python -m scripts.bench.sampling --out runs/bench [--problems 1] [--n 8] [--max-new-tokens 1024] \
        [--engines vllm,llamacpp,transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINES = {  # engine -> (model config, python, decoding.batch_size)
    "vllm": ("gemma3_270m_vllm", REPO / ".venv-vllm" / "bin" / "python", 8),
    "llamacpp": ("gemma3_270m_llamacpp", Path(sys.executable), 1),
    "transformers": ("gemma3_270m", Path(sys.executable), 8),
}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def run_engine(engine: str, args: argparse.Namespace, runs_dir: Path) -> dict:
    model, python, batch = ENGINES[engine]
    if not python.exists():
        raise SystemExit(f"{engine}: {python} does not exist; build it first (make setup / make setup-vllm)")
    batch = min(batch, args.n)
    cmd = [str(python), "-m", "harness", f"model={model}", "condition=baseline", "decoding=sample", "prompt=cot",
           f"decoding.n_samples={args.n}", f"decoding.max_new_tokens={args.max_new_tokens}",
           f"decoding.batch_size={batch}", f"dataset.limit={args.problems}", "tracking=off",
           f"runs_dir={runs_dir / engine}"]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "passive"})
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{engine}: the harness exited {done.returncode}: {' | '.join(tail)}")
    run = max((p.parent for p in (runs_dir / engine).glob("baseline/*/summary.json")), key=lambda p: p.stat().st_mtime)
    s = json.loads((run / "summary.json").read_text())
    decode, wall = s["tokens"]["decode"], s["time"]["run_wall_s"]
    return {"engine": engine, "model": model, "batch_size": batch, "run": str(run.relative_to(REPO)
                                                                            if run.is_relative_to(REPO) else run),
            "rows": s["scores"]["n_rows"], "decode_tokens": decode, "run_wall_s": round(wall, 2),
            "tokens_per_s": round(decode / wall, 2) if wall else None, "process_s": round(elapsed, 1),
            f"avg@{args.n}": s["scores"].get(f"avg@{args.n}"), f"pass@{args.n}": s["scores"].get(f"pass@{args.n}"),
            "stop_reasons": s["stop_reasons"], "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for sampling.json and the runs")
    ap.add_argument("--problems", type=int, default=1, help="the first P bundled problems")
    ap.add_argument("--n", type=int, default=8, help="seeded samples per problem (avg@n, pass@n)")
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="the token budget of each sample")
    ap.add_argument("--engines", default="vllm,llamacpp,transformers", help="comma-separated, in run order")
    ap.add_argument("--base", default="llamacpp", help="the engine the tokens/s ratios are against (default: the "
                    "first engine run when it is not among --engines)")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"--engines: {unknown} unknown; choose from {sorted(ENGINES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for e in engines:
        print(f"{e}: {args.problems} problem(s) x {args.n} samples x {args.max_new_tokens} tokens ...", flush=True)
        results.append(run_engine(e, args, args.out / "sampling-runs"))
        r = results[-1]
        print(f"  {r['decode_tokens']} tokens in {r['run_wall_s']} s = {r['tokens_per_s']} tokens/s "
              f"(load {r['load_before']} -> {r['load_after']})", flush=True)
    base = next((r for r in results if r["engine"] == args.base), results[0])
    print(f"\navg@{args.n} x {args.max_new_tokens}-token sampling, the first {args.problems} bundled problem(s), "
          f"prompt=cot, {cpu_name()}, {os.cpu_count()} cores")
    print(f"{'engine':<13} {'batch':>5} {'rows':>5} {'tokens':>7} {'wall s':>8} {'tok/s':>7} "
          f"{'x ' + base['engine']:>12} {'avg@n':>6} {'pass@n':>6}  stop reasons")
    for r in results:
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else float("nan")
        print(f"{r['engine']:<13} {r['batch_size']:>5} {r['rows']:>5} {r['decode_tokens']:>7} {r['run_wall_s']:>8} "
              f"{r['tokens_per_s']:>7} {ratio:>12.2f} {r[f'avg@{args.n}']:>6.3f} {r[f'pass@{args.n}']:>6.3f}  "
              f"{r['stop_reasons']}")
    out = args.out / "sampling.json"
    out.write_text(json.dumps({"cpu": cpu_name(), "cores": os.cpu_count(), "problems": args.problems, "n": args.n,
                               "max_new_tokens": args.max_new_tokens, "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
