"""One config run twice, in one process and over Ray actors (`execution=ray`), then compared row by row.

    python -m scripts.ray_equivalence --out runs/ray_equivalence                 # the public-set graft below
    python -m scripts.ray_equivalence --workers 2 --out /tmp/eq -- model=tiny_gemma3 condition=baseline dataset.limit=4

Default config (after `--`, any harness overrides replace it): the first 60 problems of the public AIME
1983-2023 set, grafted from a library of those same 60 solutions (so every problem is recurring), the bundled
model, greedy, 16 new tokens, determinism.threads=1 (each Ray actor asks Ray for that many CPUs, and Ray's
OMP_NUM_THREADS per task is the same: 2 workers x 1 thread against 1 thread alone is a fair comparison on 2 cores).
The library must exist (build it once: `python -m harness.library library=aime_1983_2023
library.dataset.limit=60 determinism.threads=1`; the threads are part of the artifacts' environment).

Each run is a real `python -m harness` command (tracking off, its own runs_dir under --out). Then:
- both folders re-score (`scripts/rescore.py`, exit 0 each);
- every row's content hash is compared: SHA-256 of the canonical row with its measured cost left out
  (wall_s, cpu_s, ttft_s, energy_j); everything the model computed stays in (prompt and completion token ids,
  text, first-logits SHA-256, artifact id, score). The manifest's row_sha256 covers the timings too, so it
  differs between any two runs, Ray or not.
Prints the wall time of each command and "rows identical: N/N"; writes <out>/ray_equivalence.json. Exit 1 when
a row differs or a folder does not re-score.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from harness.record.hashing import sha256_json
from kvstore.environment import cpu_name

REPO = Path(__file__).resolve().parents[1]
MEASURED = ("wall_s", "cpu_s", "ttft_s", "energy_j")  # the cost of a row, not what the model computed
PUBLIC_SET = ["dataset=aime_1983_2023", "dataset.limit=60", "library=aime_1983_2023", "library.dataset.limit=60",
              "condition=graft", "decoding.max_new_tokens=16", "determinism.threads=1"]


def content_sha256(row: dict) -> str:
    """SHA-256 of the canonical JSON of an outputs.jsonl row without its measured cost."""
    return sha256_json({k: v for k, v in row.items() if k not in MEASURED})


def run_harness(overrides: list[str], runs_dir: Path, env: dict[str, str]) -> tuple[Path, float, str]:
    """`python -m harness OVERRIDES` with tracking off into runs_dir: (its run folder, wall seconds, output)."""
    cmd = [sys.executable, "-m", "harness", *overrides, "tracking=off", f"project_root={REPO}",
           f"runs_dir={runs_dir}"]
    print("running: python", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"the harness exited {done.returncode} ({' '.join(cmd[3:])}):\n{out[-3000:]}")
    found = re.findall(r"run folder: (\S+)", out)
    if not found:
        raise SystemExit(f"no 'run folder:' line in the harness output:\n{out[-3000:]}")
    return Path(found[-1]), wall, out


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "outputs.jsonl").read_text(encoding="utf-8").splitlines()]


def rescore(folder: Path, env: dict[str, str]) -> bool:
    done = subprocess.run([sys.executable, "-m", "scripts.rescore", str(folder)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    print(f"rescore {folder}: exit {done.returncode}; {(done.stdout.strip().splitlines() or [''])[-1]}")
    return done.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="Ray actors (execution.workers)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "ray_equivalence")
    ap.add_argument("overrides", nargs="*", help="harness overrides (default: the 60-problem public-set graft)")
    args = ap.parse_args(argv)
    overrides = args.overrides or PUBLIC_SET
    out = args.out.resolve()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    # the run starts a private Ray on 127.0.0.1 with a token of its own; a running cluster: execution.address=HOST:PORT
    load0 = os.getloadavg()
    single, wall_single, _ = run_harness(overrides, out / "single", env)
    spread, wall_ray, _ = run_harness([*overrides, "execution=ray", f"execution.workers={args.workers}"],
                                      out / "ray", env)
    load1 = os.getloadavg()
    ok_single, ok_ray = rescore(single, env), rescore(spread, env)
    a, b = rows_of(single), rows_of(spread)
    same = sum(content_sha256(x) == content_sha256(y) for x, y in zip(a, b, strict=False))
    order = [(r["problem_id"], r["sample"]) for r in a] == [(r["problem_id"], r["sample"]) for r in b]
    differing = [x["problem_id"] for x, y in zip(a, b, strict=False) if content_sha256(x) != content_sha256(y)]
    result = {
        "overrides": overrides, "workers": args.workers, "single": str(single), "ray": str(spread),
        "wall_s": {"single": round(wall_single, 2), "ray": round(wall_ray, 2)},
        "rows": {"single": len(a), "ray": len(b), "identical": same, "same_order": order, "differing": differing},
        "rescore_ok": {"single": ok_single, "ray": ok_ray},
        "correct": {"single": sum(r["correct"] for r in a), "ray": sum(r["correct"] for r in b)},
        "cpu": cpu_name(), "cores": os.cpu_count(), "loadavg_before": load0, "loadavg_after": load1,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_equivalence.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"single process: {wall_single:.1f} s wall; {args.workers} Ray workers: {wall_ray:.1f} s wall "
          f"(whole commands: model loads, library open, every problem)")
    print(f"rows identical (content SHA-256, timings left out): {same}/{len(a)}"
          f"{'' if len(a) == len(b) else f' (the Ray run has {len(b)} rows)'}; same order: {order}; "
          f"correct: {result['correct']['single']} and {result['correct']['ray']}")
    print(f"wrote {out / 'ray_equivalence.json'} ({result['cpu']}, {result['cores']} cores, load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after)")
    good = ok_single and ok_ray and same == len(a) == len(b) and order
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
