"""Latency of library requests one at a time against N at once, on a running `make serve LIBRARY=... RETRIEVAL=...`
(issue 60, item 7: retrieval, composition and the artifact's read run in a worker thread, off the event loop, so
concurrent requests overlap there instead of queueing on the loop).

    python -m scripts.serve_concurrency --port 8000 [--concurrent 8] [--requests 16] [--max-tokens 1]

Each request is a completion of one bundled problem in kvgraft's prompt (problems/kvgraft_original.jsonl, in turn);
first `--requests` one after the other (concurrency 1), then the same number with `--concurrent` in flight at once.
Prints, for each, the p50 and p90 of the per-request wall latency, the wall of the whole batch and how many responses
said `grafted`. Standard library only (runs in any of the project's Pythons). A warm-up request comes first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "Problem: {problem}\nGive the answer as an integer from 0 to 999.\nFinal answer:"


def one(url: str, model: str, problem: str, max_tokens: int) -> tuple[float, str]:
    """(seconds, the response's kvgraft_library outcome) of one completion request."""
    body = json.dumps({"model": model, "prompt": PROMPT.format(problem=problem), "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    dt = time.perf_counter() - t0
    note = (out.get("kv_transfer_params") or {}).get("kvgraft_library") or {}
    return dt, str(note.get("outcome"))


def batch(url: str, model: str, problems: list[str], width: int, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=width) as pool:
        results = list(pool.map(lambda p: one(url, model, p, max_tokens), problems))
    wall = time.perf_counter() - t0
    lat = sorted(dt for dt, _ in results)
    return {"concurrency": width, "requests": len(lat), "p50_s": round(statistics.median(lat), 3),
            "p90_s": round(lat[max(0, int(0.9 * len(lat)) - 1)], 3), "wall_s": round(wall, 2),
            "grafted": sum(o == "grafted" for _, o in results)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default="", help="the served model name (default: the first the server lists)")
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=1)
    a = ap.parse_args(argv)
    base = f"http://127.0.0.1:{a.port}/v1"
    model = a.model
    if not model:
        with urllib.request.urlopen(f"{base}/models", timeout=30) as r:
            model = next(m["id"] for m in json.loads(r.read())["data"] if not m["id"].endswith("-incontext"))
    rows = [json.loads(x) for x in (REPO / "problems/kvgraft_original.jsonl").read_text().splitlines() if x.strip()]
    problems = [rows[i % len(rows)]["problem"] for i in range(a.requests)]
    url = f"{base}/completions"
    one(url, model, problems[0], a.max_tokens)  # warm-up
    for width in (1, a.concurrent):
        print(json.dumps(batch(url, model, problems, width, a.max_tokens)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
