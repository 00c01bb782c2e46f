"""lm-eval through the library-aware server, sample by sample against kvgraft's own runs (docs/vllm.md, "Any
evaluation harness"; the reduced version is tests/harness/test_lmeval_serve.py):

    .venv/bin/python -m scripts.lmeval_serve_check --out runs/lmeval_check [--limit 4] [--budget 64]

1. the library of the first LIMIT bundled problems on vLLM (`make library`, model=gemma3_270m_vllm);
2. kvgraft's own runs on vLLM (`make aime-graft`: graft and in-context, recurring and held-out, one engine);
3. for RETRIEVAL in recurring, held-out: `make serve LIBRARY=<that library> RETRIEVAL=...` and lm-eval 0.4.13
   (`local-completions`, .venv-lmeval, harness/task/lmeval/kvgraft_original.yaml) against it, once as the graft
   (model gemma3-270m) and once as the in-context control (model gemma3-270m-incontext);
4. each lm-eval run compared with the matching harness run (scripts/lmeval_compare.py: text per sample, accuracy).

Writes OUT/summary.json and prints one table; exit status 0 only when every comparison holds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "gemma3-270m"
MAKE = ["make", "--no-print-directory", "-o", ".venv/.setup-done", "-o", ".venv-vllm/.setup-done",
        "-o", ".venv-lmeval/.setup-done"]


def run(cmd: list[str], log: Path, **kw) -> None:  # noqa: ANN003
    t0 = time.monotonic()
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)[:200]}: exit {r.returncode} after {time.monotonic() - t0:.0f} s; see {log}: "
                 f"{log.read_text(errors='replace')[-1500:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--budget", type=int, default=64, help="decoding.max_new_tokens = the task's max_gen_toks")
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    common = f"model=gemma3_270m_vllm tracking=off library.root={out}/lib library.store={out}/store"
    figures: dict = {"limit": args.limit, "budget": args.budget, "seconds": {}}
    t0 = time.monotonic()
    run([*MAKE, "library", f"ARGS={common} library.dataset.limit={args.limit}"], out / "library.log")
    figures["seconds"]["library"] = round(time.monotonic() - t0, 1)
    lib = next((out / "lib").rglob("manifest.json")).parent
    t0 = time.monotonic()
    run([*MAKE, "aime-graft", f"ARGS={common} library.dataset.limit={args.limit} dataset.limit={args.limit} "
         f"decoding.max_new_tokens={args.budget} runs_dir={out}/runs"], out / "compare.log")
    figures["seconds"]["harness_runs"] = round(time.monotonic() - t0, 1)
    runs = {}
    for cond in ("graft", "incontext"):
        for folder in sorted((out / "runs" / cond).glob("*")):
            group = "held-out" if folder.name.endswith("held_out") else "recurring"
            runs[(cond, group)] = folder
    rows = []
    for mode in ("recurring", "held-out"):
        port = free_port()
        log = out / f"serve-{mode}.log"
        t0 = time.monotonic()
        with open(log, "w") as f:
            server = subprocess.Popen([*MAKE, "serve", f"PORT={port}", f"STORE={out}/store", f"LIBRARY={lib}",
                                       f"RETRIEVAL={mode}", f"ARGS=--journal {out}/journal-{mode}.jsonl"],
                                      stdout=f, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        try:
            while True:
                if server.poll() is not None or time.monotonic() - t0 > 1500:
                    sys.exit(f"make serve RETRIEVAL={mode} did not come up; see {log}: "
                             f"{log.read_text(errors='replace')[-1500:]}")
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
                    break
                except OSError:
                    time.sleep(3)
            figures["seconds"][f"serve_start_{mode}"] = round(time.monotonic() - t0, 1)
            for cond, model in (("graft", MODEL), ("incontext", MODEL + "-incontext")):
                where = out / "lmeval" / f"{cond}-{mode}"
                t0 = time.monotonic()
                run([str(REPO / ".venv-lmeval" / "bin" / "lm-eval"), "run", "--include_path", "harness/task/lmeval",
                     "--tasks", "kvgraft_original", "--model", "local-completions", "--model_args",
                     f"model={model},base_url=http://127.0.0.1:{port}/v1/completions,num_concurrent=1,"
                     "max_retries=1,tokenized_requests=False,tokenizer_backend=None,timeout=600",
                     "--gen_kwargs", f"max_gen_toks={args.budget}", "--limit", str(args.limit),
                     "--output_path", str(where), "--log_samples"], out / f"lmeval-{cond}-{mode}.log",
                    env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
                secs = round(time.monotonic() - t0, 1)
                r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "scripts.lmeval_compare", "--lmeval",
                                    str(where), "--run", str(runs[(cond, mode)])], capture_output=True, text=True,
                                   cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
                last = (r.stdout.strip().splitlines() or [r.stderr.strip()])[-1]
                rows.append({"retrieval": mode, "condition": cond, "run": str(runs[(cond, mode)]),
                             "lmeval": str(where), "ok": r.returncode == 0, "result": last, "lmeval_s": secs,
                             "differing": r.stdout.strip().splitlines()[:-1]})
                print(f"{mode:9} {cond:9} {last} ({secs:.0f} s)", flush=True)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    figures["rows"] = rows
    figures["seconds"]["total"] = round(time.monotonic() - t_all, 1)
    (out / "summary.json").write_text(json.dumps(figures, indent=2))
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
